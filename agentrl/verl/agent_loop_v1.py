"""The AgentLoop manager of verl's V1 trainer (``verl.trainer=v1``): verl's
``AgentLoopManagerTQ`` plus the start-up check that constrained actions train on the masks.

Why a module of its own: importing verl's V1 package needs the ``TransferQueue`` package, which
the legacy trainer does not; :func:`agentrl.verl.agent_loop.verl_overrides` names this class
(``actor_rollout_ref.rollout.agent.agent_loop_manager_class``) only for V1 runs.

Under V1 the rows go from the AgentLoop workers straight into TransferQueue, so this manager
never sees them: a V1 run logs verl's own metrics (``val-core/<preset>/…``,
``val-aux/<preset>/success/…``) but not the local engine's ``train/<preset>/…`` names or episode
records, which the legacy trainer's :class:`~agentrl.verl.agent_loop.GameAgentLoopManager`
writes. An episode cut by the response budget ends where it was cut, as on the legacy trainer
and the local engine (:mod:`agentrl.verl.returns`): V1's advantage step reads fixed fields, so
GAE never sees the ``agentrl_truncated`` flag.
"""

from __future__ import annotations

from verl.trainer.ppo.v1 import AgentLoopManagerTQ

from agentrl.verl.constrained import processor_configured

__all__ = ["GameAgentLoopManagerTQ"]


class GameAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's V1 ``AgentLoopManagerTQ``; with constrained actions it checks at start, before
    the first step, that verl's engine lookup gives the actor the masked engine."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if processor_configured(self.rollout_config):
            from agentrl.verl.masked_engine import check_masked_engine

            check_masked_engine(self.config.actor_rollout_ref.actor.strategy)
