"""The verl backend: PPO with a critic on verl's FSDP workers and vLLM servers, through Ray.

- :mod:`agentrl.verl.agent_loop`: the AgentLoop (registered as ``agentrl_game``) that plays one
  episode with :func:`agentrl.rollout.run_episode`, verl's server manager as its ``llm``.
- :mod:`agentrl.verl.data`: the task files, one parquet row per game (preset, seed, split).
- :mod:`agentrl.verl.launch`: our config -> verl's ``ppo_trainer`` config, ``--dry-run``,
  and verl's own ``main_ppo``.

Importing this package imports neither verl nor Ray: the modules above import them when used.
"""

AGENT_NAME = "agentrl_game"
"""The name our AgentLoop is registered under, and every task row's ``agent_name``."""
