"""Our rollout metrics on verl, under the names the local engine logs: ``train/<preset>/...``,
``val/<preset>/...`` and ``timing/...``.

verl logs its own metrics (``actor/*``, ``critic/*``, ``timing_s/*``, ``val-core/*``) and has no
hook for a project's own. Every batch of episodes, training and validation, passes through our
``GameAgentLoopManager`` (:mod:`agentrl.verl.agent_loop`), so the manager computes them there,
from each episode's :class:`~agentrl.rollout.records.EpisodeOutcome` (carried in
``extra_fields["agentrl_episode"]``) with the function the local engine uses
(:func:`~agentrl.rollout.metrics.rollout_metrics`), and :class:`EpisodeMetricsLog` sends them:

- to ``<run_dir>/metrics.jsonl`` (``run_dir``: the folder holding ``trainer.default_local_dir``,
  where ``agentrl train backend=verl`` puts ``checkpoints/``), one record per step and split.
  The learning-curve plot reads it as it reads the local engine's;
- to verl's WandB run, when the process has one, into the step verl is about to log
  (``commit=False``; verl's own log of that step commits both);
- to the console: one summary line (success and return per preset).

**Step**: verl's ``global_steps`` from the batch's ``meta_info`` (validation before training
logs at the step training starts from). verl validates the whole held-out file in one batch
(``data.val_batch_size`` null, as the launch leaves it); a smaller ``val_batch_size`` gives one
record per chunk. **Padding**: verl pads a validation batch to a multiple
of its worker count with copies of the batch's first rows; a task row (``extra_info.index``) has
``n`` episodes (``rollout.n``, or ``rollout.val_kwargs.n`` when validating), so episodes past
the ``n``-th of a row are copies and are left out. **Resume**: the first record of a split that
a process writes, at step ``s``, replaces that split's records at steps ``>= s`` (steps redone
after a resume appear once).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.rollout import EpisodeOutcome, rollout_metrics
from agentrl.trainers.tracking import (
    METRICS_FILE,
    keep_metrics,
    metrics_record,
    summary_line,
)

__all__ = ["CONSTRAINT_VIOLATIONS", "SPLITS", "EpisodeMetricsLog", "batch_metrics",
           "episode_outcomes", "verl_run_outputs"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
CONSTRAINT_VIOLATIONS = "constraint_violations"
"""Per preset and batch: replies with a token outside its constrained-decoding mask (vLLM's
logits processor was not applied), summed; 0 when every reply kept to its mask."""


def episode_outcomes(infos: Iterable[Mapping[str, Any] | None], per_row: int
                     ) -> list[EpisodeOutcome]:
    """The outcomes of a batch's episodes, at most ``per_row`` per task row (the rest are
    verl's padding copies). Rows without an outcome (another AgentLoop's) are skipped; a row
    without ``index`` is told apart by its preset and seed."""
    if per_row < 1:
        raise ValueError(f"per_row={per_row}: allowed: an integer >= 1")
    seen: Counter = Counter()
    outcomes = []
    for info in infos:
        if info is None:
            continue
        outcome = EpisodeOutcome.from_dict(info)
        index = info.get("index")
        row = ("index", index) if index is not None else ("game", outcome.preset, outcome.seed)
        seen[row] += 1
        if seen[row] <= per_row:
            outcomes.append(outcome)
    return outcomes


def batch_metrics(outcomes: list[EpisodeOutcome], split: str) -> dict[str, float]:
    """``rollout_metrics`` of the outcomes and :data:`CONSTRAINT_VIOLATIONS` per preset;
    validation leaves out ``timing/*``, as the local engine's does (its timings are the
    training rollout's)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: allowed: {', '.join(SPLITS)}")
    metrics = rollout_metrics(outcomes, split=split)
    for preset in sorted({o.preset for o in outcomes}):  # replies outside their constraint's
        metrics[f"{split}/{preset}/{CONSTRAINT_VIOLATIONS}"] = float(sum(  # masks (verl only)
            o.metrics.get(CONSTRAINT_VIOLATIONS, 0.0) for o in outcomes if o.preset == preset))
    if split == "val":
        metrics = {k: v for k, v in metrics.items() if not k.startswith("timing/")}
    return metrics


def verl_run_outputs(config: Any) -> tuple[Path | None, dict[str, bool]]:
    """Our run folder (the parent of verl's checkpoint folder) and where else a verl run with
    ``config`` (verl's composed config) reports: ``use_wandb`` and ``console``."""
    trainer = config.trainer
    local_dir = trainer.get("default_local_dir")
    loggers = list(trainer.get("logger") or [])
    return (Path(str(local_dir)).parent if local_dir else None,
            {"use_wandb": "wandb" in loggers, "console": "console" in loggers})


class EpisodeMetricsLog:
    """Writes the metrics of each batch of episodes (see the module docstring).

    ``run_dir=None`` keeps no file; ``use_wandb`` logs into the process's WandB run when there
    is one; ``console`` prints a summary line per record.
    """

    def __init__(self, run_dir: str | Path | None, *, use_wandb: bool = True,
                 console: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE if run_dir is not None else None
        self.use_wandb = use_wandb
        self.console = console
        self._started: set[str] = set()
        self._wandb_failed = False

    @classmethod
    def for_verl(cls, config: Any) -> EpisodeMetricsLog:
        """The log of a verl run with ``config`` (verl's composed config)."""
        run_dir, outputs = verl_run_outputs(config)
        return cls(run_dir, **outputs)

    def log_batch(self, infos: Iterable[Mapping[str, Any] | None] | None,
                  meta_info: Mapping[str, Any], per_row: int) -> dict[str, float]:
        """Log the metrics of one batch verl generated; returns them (empty when the batch
        had no episodes of ours or no step)."""
        step = meta_info.get("global_steps")
        if infos is None or step is None:
            return {}
        outcomes = episode_outcomes(infos, per_row)
        if not outcomes:
            return {}
        split = "val" if meta_info.get("validate", False) else "train"
        metrics = batch_metrics(outcomes, split)
        self.log(int(step), split, metrics)
        return metrics

    def log(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        record = metrics_record(step, metrics)
        if self.path is not None:
            if split not in self._started:
                self._drop_from(step, split)
            with self.path.open("a") as file:
                file.write(json.dumps(record) + "\n")
        self._started.add(split)
        if self.use_wandb:
            self._wandb_log(step, record)
        if self.console:
            print(f"agentrl {split} " + summary_line(step, record), flush=True)

    def _drop_from(self, step: int, split: str) -> None:
        """Drop this split's records at ``step`` and after (a resumed run redoes them)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep_metrics(self.path, lambda r: r["step"] < step or not _is_split(r, split),
                     f"of {split} from step {step} on (they are redone)")

    def _wandb_log(self, step: int, record: Mapping[str, Any]) -> None:
        """Into the step verl logs next (it commits); nothing when WandB has no run here."""
        if self._wandb_failed:
            return
        try:
            import wandb

            if wandb.run is not None:
                values = {k: v for k, v in record.items()
                          if k not in ("step", "time") and v is not None}
                wandb.run.log(values, step=step, commit=False)
        except Exception as error:  # noqa: BLE001 -- the metrics file has the record
            self._wandb_failed = True
            log.warning("agentrl metrics not sent to WandB: %s: %s", type(error).__name__, error)


def _is_split(record: Mapping[str, Any], split: str) -> bool:
    return any(key.startswith(f"{split}/") for key in record)
