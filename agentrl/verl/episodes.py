"""Episode records on verl: the same ``<run_dir>/episodes/step_N.jsonl`` the local engine writes.

Each episode's AgentLoop puts its record (:func:`agentrl.rollout.episode_record.episode_record`,
bounded) in ``extra_fields["agentrl_episode_record"]``; :class:`GameAgentLoopManager`
(:mod:`agentrl.verl.agent_loop`) takes that column out of every batch it returns (so the text
travels no further than the manager) and hands it here. :class:`VerlEpisodeLog` keeps
``trainer.log_episodes`` episodes per step and split (the launch passes it as
``+trainer.agentrl_log_episodes``), leaves verl's padding copies out (as
:mod:`agentrl.verl.metrics` does), and writes them with
:class:`~agentrl.trainers.episode_log.EpisodeLog`; also a WandB table into the step verl logs
next, and one sampled validation reply on the console.

Under the V1 trainer the rows go from the AgentLoop workers straight into TransferQueue, past
the manager: there verl's replay buffer hands each batch to the trainer, and ours
(:class:`~agentrl.verl.agent_loop_v1.GameReplayBuffer`) reads the batch's ``extra_fields`` and
logs it with :func:`log_rows` (one row per episode: a windowed episode's rows all carry its
outcome and record).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.rollout.episode_record import sample_episodes, sample_line
from agentrl.trainers.episode_log import EpisodeLog
from agentrl.verl.metrics import EpisodeMetricsLog, verl_run_outputs
from agentrl.verl.rows import EPISODE_INFO, EPISODE_RECORD

__all__ = ["LOG_EPISODES_KEY", "VerlEpisodeLog", "episode_rows", "log_rows", "unpadded_records"]

log = logging.getLogger(__name__)

LOG_EPISODES_KEY = "agentrl_log_episodes"
"""Key under verl's ``trainer`` config holding ``trainer.log_episodes`` (set by the launch)."""
DEFAULT_LOG_EPISODES = 4
"""When verl was launched without our key (``configs/base.yaml``'s default)."""


def unpadded_records(records: Iterable[Mapping[str, Any] | None],
                     infos: Iterable[Mapping[str, Any] | None], per_row: int
                     ) -> list[Mapping[str, Any]]:
    """The records of a batch, at most ``per_row`` per task row (the rest are verl's padding
    copies; a row is told apart by ``index`` in its outcome, else by preset and seed)."""
    seen: Counter = Counter()
    kept = []
    for record, info in zip(records, infos):
        if record is None:
            continue
        index = info.get("index") if isinstance(info, Mapping) else None
        row = ("index", index) if index is not None else ("game", record["preset"], record["seed"])
        seen[row] += 1
        if seen[row] <= per_row:
            kept.append(record)
    return kept


def episode_rows(keys: Iterable[str]) -> list[int]:
    """The position of each episode's first row among a V1 batch's keys (``{uid}_{session}_{i}``:
    an episode is a session, its rows are numbered ``i``)."""
    first: dict[str, int] = {}
    for position, key in enumerate(keys):
        parts = str(key).rsplit("_", 2)
        first.setdefault("_".join(parts[:2]) if len(parts) == 3 else str(key), position)
    return sorted(first.values())


def log_rows(metrics: EpisodeMetricsLog, episodes: VerlEpisodeLog, keys: Sequence[str],
             extra_fields: Sequence[Mapping[str, Any] | None], meta_info: Mapping[str, Any],
             per_row: int) -> dict[str, float]:
    """Log a V1 batch (its keys and its rows' ``extra_fields``) as the legacy trainer's manager
    logs its batches: the metrics of its episodes and a sample of their records."""
    rows = [extra_fields[i] if isinstance(extra_fields[i], Mapping) else {}
            for i in episode_rows(keys)]
    infos = [row.get(EPISODE_INFO) for row in rows]
    logged = metrics.log_batch(infos, meta_info, per_row=per_row)
    episodes.log_batch([row.get(EPISODE_RECORD) for row in rows], infos, meta_info,
                       per_row=per_row)
    return logged


class VerlEpisodeLog:
    """Episode records of the batches verl generates (see the module docstring)."""

    def __init__(self, run_dir: str | Path | None, count: int, *, use_wandb: bool = True,
                 console: bool = True):
        self.log = EpisodeLog(run_dir) if run_dir is not None else None
        self.count = count
        self.use_wandb = use_wandb
        self.console = console
        self._wandb_failed = False

    @classmethod
    def for_verl(cls, config: Any) -> VerlEpisodeLog:
        run_dir, outputs = verl_run_outputs(config)
        return cls(run_dir, int(config.trainer.get(LOG_EPISODES_KEY, DEFAULT_LOG_EPISODES)),
                   **outputs)

    def log_batch(self, records: Iterable[Mapping[str, Any] | None] | None,
                  infos: Iterable[Mapping[str, Any] | None] | None,
                  meta_info: Mapping[str, Any], per_row: int) -> list[dict[str, Any]]:
        """Record a sample of one batch's episodes; returns the records written."""
        step = meta_info.get("global_steps")
        if records is None or step is None or self.count < 1:
            return []
        records = list(records)
        infos = list(infos) if infos is not None else [None] * len(records)
        split = "val" if meta_info.get("validate", False) else "train"
        picked = sample_episodes(unpadded_records(records, infos, per_row), self.count,
                                 key=lambda r: (r["preset"], r["seed"]))
        sample = [{**r, "step": int(step), "split": split} for r in picked]
        if not sample:
            return []
        if self.log is not None:
            self.log.write(int(step), sample)
        if self.use_wandb:
            self._wandb_log(int(step), split, sample)
        line = sample_line(sample) if self.console and split == "val" else None
        if line:  # None when no sampled episode has a reply
            print("agentrl " + line, flush=True)
        return sample

    def _wandb_log(self, step: int, split: str, sample: list[dict[str, Any]]) -> None:
        """Into the step verl logs next (it commits); nothing when WandB has no run here."""
        if self._wandb_failed:
            return
        try:
            import wandb

            from agentrl.rollout.episode_record import episode_table

            if wandb.run is not None:
                columns, rows = episode_table(sample)
                wandb.run.log({f"episodes/{split}": wandb.Table(columns=list(columns), data=rows)},
                              step=step, commit=False)
        except Exception as error:  # noqa: BLE001 -- the episode files have the records
            self._wandb_failed = True
            log.warning("agentrl episodes not sent to WandB: %s: %s", type(error).__name__, error)
