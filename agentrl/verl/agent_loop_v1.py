"""What verl's V1 trainer (``verl.trainer=v1``) runs of ours: its AgentLoop manager, verl's
``AgentLoopManagerTQ`` plus the start-up check that constrained actions train on the masks, and
its replay buffer, verl's own plus our run records.

Why a module of its own: importing verl's V1 package needs the ``TransferQueue`` package, which
the legacy trainer does not; :func:`agentrl.verl.agent_loop.verl_overrides` names these classes
(``actor_rollout_ref.rollout.agent.agent_loop_manager_class``,
``trainer.v1.sampler.custom_sampler``) only for V1 runs.

**Run records.** Under V1 the rows go from the AgentLoop workers straight into TransferQueue, so
the manager never sees them. The trainer takes every batch, training and validation, from its
replay buffer (``ReplayBuffer.sample``); :class:`GameReplayBuffer` is verl's, and before it
hands a batch on it reads the batch's ``extra_fields`` and logs the local engine's
``train/<preset>/…`` and ``val/<preset>/…`` metrics and the episode records, as the legacy
trainer's :class:`~agentrl.verl.agent_loop.GameAgentLoopManager` does
(:func:`agentrl.verl.episodes.log_rows`), and verl's own metrics with them
(:mod:`agentrl.verl.metrics`). Its settings come through verl's ``sampler_kwargs``
(interpolations of verl's own keys: ``trainer.default_local_dir``, ``trainer.logger``,
``rollout.n``, ``rollout.val_kwargs.n`` and our ``trainer.agentrl_log_episodes``).

An episode cut by the response budget ends where it was cut, as on the legacy trainer and the
local engine (:mod:`agentrl.verl.returns`): V1's advantage step reads fixed fields, so GAE never
sees the ``agentrl_truncated`` flag.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import AgentLoopManagerTQ
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from agentrl.verl.agent_loop import SAMPLER_KWARGS
from agentrl.verl.constrained import processor_configured
from agentrl.verl.episodes import LOG_EPISODES_KEY, VerlEpisodeLog, log_rows
from agentrl.verl.metrics import EpisodeMetricsLog

__all__ = ["GameAgentLoopManagerTQ", "GameReplayBuffer"]

class GameAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's V1 ``AgentLoopManagerTQ``; with constrained actions it checks at start, before
    the first step, that verl's engine lookup gives the actor the masked engine."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if processor_configured(self.rollout_config):
            from agentrl.verl.masked_engine import check_masked_engine

            check_masked_engine(self.config.actor_rollout_ref.actor.strategy)


class GameReplayBuffer(ReplayBuffer):
    """verl's V1 replay buffer (the sync trainer's) that logs every batch it hands to the
    trainer (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.trainer_mode != "sync":  # verl's async modes sample with ReplayBufferAsync
            raise ValueError(f"trainer.v1.trainer_mode={self.trainer_mode!r} is not allowed with "
                             f"{type(self).__name__} (our run records); allowed: sync")
        settings = OmegaConf.create({"trainer": OmegaConf.create(self.sampler_kwargs or {})})
        missing = sorted(set(SAMPLER_KWARGS) - set(settings.trainer))
        if missing:
            raise ValueError(f"{type(self).__name__}: trainer.v1.sampler.sampler_kwargs lacks "
                             f"{', '.join(missing)}; the launch sets them "
                             "(agentrl.verl.agent_loop.verl_overrides)")
        self.episode_metrics = EpisodeMetricsLog.for_verl(settings)
        self.episode_log = VerlEpisodeLog.for_verl(settings)
        self.per_row = {"train": int(settings.trainer.n), "val": int(settings.trainer.val_n)}

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if batch.keys:
            fields = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                     select_fields=["extra_fields"])
            validate = partition_id == "val"
            rows = fields["extra_fields"]  # a list (tensordict's LinkedList) or a NonTensorStack
            log_rows(self.episode_metrics, self.episode_log, batch.keys,
                     rows.tolist() if hasattr(rows, "tolist") else list(rows),
                     {"global_steps": global_steps, "validate": validate},
                     per_row=self.per_row["val" if validate else "train"])
        return batch, metrics
