"""The verl backend: PPO with a critic on verl's FSDP workers and vLLM servers, through Ray.

- :mod:`agentrl.verl.agent_loop`: the AgentLoop (registered as ``agentrl_game``) that plays one
  episode with :func:`agentrl.rollout.run_episode`, verl's server manager as its ``llm``
  (:mod:`~agentrl.verl.server_llm`); :mod:`~agentrl.verl.episode_task` reads a row's task and
  counts its response budget.
- :mod:`agentrl.verl.metrics`, :mod:`agentrl.verl.episodes`: the folder every run leaves
  (``metrics.jsonl`` with our ``train/<preset>/…``, ``val/<preset>/…`` and verl's own metrics,
  ``episodes/step_N.jsonl``), written by the legacy trainer's AgentLoop manager and by the V1
  trainer's replay buffer (:mod:`~agentrl.verl.agent_loop_v1`), so ``agentrl report`` reads a
  verl run like a local one.
- :mod:`agentrl.verl.data`: the task files, one parquet row per game (preset, seed, split).
- :mod:`agentrl.verl.launch`: our config -> verl's ``ppo_trainer`` config, ``--dry-run``,
  and verl's own ``main_ppo``; :mod:`~agentrl.verl.overrides` maps our keys onto verl's
  overrides and the environment of its processes.
- :mod:`agentrl.verl.preflight`: before Ray starts, verl's dispatch divisions and the per-GPU
  memory estimate; adapts micro-batches and offload, refuses the rest.
- :mod:`agentrl.verl.cpu_platform`: a ``cpu`` platform for verl's ``PlatformRegistry`` and its
  pinned patches, so verl's own trainer runs on a CPU (``hardware=cpu-verl``).
- :mod:`agentrl.verl.returns`: what verl's PPO lacks for games, patched in the same way: the
  value clip scaled to the returns (and why an episode cut by the response budget is ended
  there, not bootstrapped).
- :mod:`agentrl.verl.cluster`: the Ray cluster a GPU run joins: its GPUs counted, every node
  probed (same checkout, shared ``run_dir``, flash-attn).
- :mod:`agentrl.verl.constrained`: constrained action decoding on verl, the local engine's
  automaton on both sides: :mod:`~agentrl.verl.logits_processor` masks vLLM's sampler,
  :mod:`~agentrl.verl.masked_engine` masks verl's actor and reference (an engine registered in
  verl's ``EngineRegistry``); the masks travel with each row.
- :mod:`agentrl.verl.doctor_rows`, :mod:`~agentrl.verl.layout_check`: the rows of the first-run
  check (``agentrl doctor``, :mod:`agentrl.cli.doctor`).

Importing this package imports neither verl nor Ray: the modules above import them when used.
"""

AGENT_NAME = "agentrl_game"
"""The name our AgentLoop is registered under, and every task row's ``agent_name``."""
