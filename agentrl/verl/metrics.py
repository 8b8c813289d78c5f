"""Our rollout metrics on verl, under the names the local engine logs: ``train/<preset>/...``,
``val/<preset>/...``, ``timing/...`` and a training batch's ``train/uniform_groups`` and
``train/uniform_groups_won`` (a task row's episodes are its group).

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

**verl's own metrics** (``actor/*``, ``critic/*``, ``timing_s/*``, ``val-core/*``, ...) reach the
same file through verl's ``file`` logger, which the launch adds to ``trainer.logger`` and points
at ``<run_dir>/verl/tracking.jsonl`` (:func:`verl_log_path`, ``VERL_FILE_LOGGER_PATH``): before
each batch it logs, :class:`EpisodeMetricsLog` copies verl's new records into ``metrics.jsonl``
(:meth:`EpisodeMetricsLog.follow_verl`), one record per verl log call under verl's names (the
local engine's for the losses, the clip fraction, the KL, the entropy and the explained
variance); the launch copies what the last step logged once verl has exited, and what a killed
launch left, before the next one starts (:func:`ingest_verl_log`). Record kinds
(:func:`record_kind`): ``train`` and ``val`` (ours), ``verl`` (a training step's, with
``training/global_step``) and ``verl-val`` (validation before training); the resume rule above
holds per kind.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.rollout import EpisodeOutcome, rollout_metrics, uniform_group_metrics
from agentrl.trainers.tracking import (
    METRICS_FILE,
    RESERVED_KEYS,
    keep_metrics,
    metrics_record,
    read_metrics,
    summary_line,
    write_text_atomic,
)

__all__ = ["CONSTRAINT_VIOLATIONS", "SPLITS", "VERL_LOG_ENV", "EpisodeMetricsLog",
           "batch_metrics", "episode_groups", "episode_outcomes", "finish_tracking_after",
           "finish_wandb_at_exit", "ingest_verl_log", "read_verl_log", "record_kind",
           "verl_log_path", "verl_run_outputs"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
VERL_LOG_ENV = "VERL_FILE_LOGGER_PATH"
"""Where verl's ``file`` logger writes (its own variable; set by the launch)."""
VERL_STEP_KEY = "training/global_step"
"""Present in every record of a verl training step (both trainers), absent from validation's."""


def verl_log_path(run_dir: str | Path) -> Path:
    """verl's ``file`` logger's output of a run: ``<run_dir>/verl/tracking.jsonl``."""
    return Path(run_dir) / "verl" / "tracking.jsonl"


def record_kind(record: Mapping[str, Any]) -> str:
    """Who wrote a ``metrics.jsonl`` record of a verl run: ``train`` or ``val`` (our episodes'
    metrics), ``verl`` (verl's log of a training step) or ``verl-val`` (verl's log of a
    validation before training)."""
    for split in SPLITS:
        if any(key.startswith(f"{split}/") for key in record):
            return split
    return "verl" if VERL_STEP_KEY in record else "verl-val"


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def read_verl_log(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The records verl's ``file`` logger wrote to ``path`` from byte ``offset`` on (``{"step":
    N, "data": {...}}`` a line) as ``metrics.jsonl`` records: its numbers under its names
    (strings, lists and non-finite values left out). Only whole lines are read; returns the
    records and the offset after the last whole line."""
    path = Path(path)
    if not path.exists():
        return [], offset
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read()
    whole = data.rfind(b"\n") + 1
    records = []
    for line in data[:whole].splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            log.warning("%s: skipping a line that is not JSON", path)
            continue
        step, values = entry.get("step"), entry.get("data")
        if isinstance(step, int) and isinstance(values, Mapping):
            numbers = {key: value for key, value in values.items()
                       if key not in RESERVED_KEYS and _number(value)}
            records.append(metrics_record(step, numbers))
    return records, offset + whole


def ingest_verl_log(run_dir: str | Path) -> int:
    """Copy into ``<run_dir>/metrics.jsonl`` the records of verl's log that it lacks (a kind
    at a step it has no record of; run by the launch when verl has ended, and before a launch
    starts verl, which empties the log), keep the file in step order, and remove verl's log.
    Returns how many records were added."""
    source = verl_log_path(run_dir)
    if not source.exists():
        return 0
    records, _ = read_verl_log(source)
    path = Path(run_dir) / METRICS_FILE
    kept = read_metrics(path)
    present = {(r["step"], record_kind(r)) for r in kept}
    added = [r for r in records if (r["step"], record_kind(r)) not in present]
    if added or kept != sorted(kept, key=lambda r: r["step"]):
        merged = sorted([*kept, *added], key=lambda r: r["step"])  # stable: a step's order kept
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in merged))
    source.unlink()
    return len(added)
CONSTRAINT_VIOLATIONS = "constraint_violations"
"""Per preset and batch: replies with a token outside its constrained-decoding mask (vLLM's
logits processor was not applied), summed; 0 when every reply kept to its mask."""


def episode_outcomes(infos: Iterable[Mapping[str, Any] | None], per_row: int
                     ) -> list[EpisodeOutcome]:
    """The outcomes of a batch's episodes, at most ``per_row`` per task row (the rest are
    verl's padding copies). Rows without an outcome (another AgentLoop's) are skipped; a row
    without ``index`` is told apart by its preset and seed."""
    return [outcome for group in episode_groups(infos, per_row) for outcome in group]


def episode_groups(infos: Iterable[Mapping[str, Any] | None], per_row: int
                   ) -> list[list[EpisodeOutcome]]:
    """:func:`episode_outcomes` by task row, in first-seen order: a row's episodes (at most
    ``per_row``: ``rollout.n``, or ``val_kwargs.n`` when validating) play one game, the local
    engine's agent group."""
    if per_row < 1:
        raise ValueError(f"per_row={per_row}: allowed: an integer >= 1")
    groups: dict[tuple, list[EpisodeOutcome]] = {}
    for info in infos:
        if info is None:
            continue
        outcome = EpisodeOutcome.from_dict(info)
        index = info.get("index")
        row = ("index", index) if index is not None else ("game", outcome.preset, outcome.seed)
        group = groups.setdefault(row, [])
        if len(group) < per_row:
            group.append(outcome)
    return list(groups.values())


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


_FINISH_AT_EXIT: list[bool] = []


def finish_wandb_at_exit() -> None:
    """Finish this process's WandB run and shut WandB down when the interpreter exits, before
    WandB's own exit hook, so a successful verl run ends without a traceback.

    Why: verl's ``Tracking`` finishes the run it started only when it is collected (the legacy
    trainer keeps it in ``fit``'s frame); collected after WandB's exit hook has shut WandB's
    service down, its ``wandb.finish`` fails (``Exception ignored in ... Tracking.__del__``:
    ``ConnectionResetError: Connection lost``). Under V1, where verl's TaskRunner finishes the
    run itself, WandB's exit hook still tells its service to shut down, and in a Ray actor that
    service is gone by then: the same error, from ``teardown_atexit``. Exit hooks run newest
    first, and this one is registered after ``wandb.init`` (the first time our metrics reach
    the run): it finishes the run while WandB still runs (verl's late ``wandb.finish`` then
    finds none) and shuts WandB down through ``wandb.teardown``, which takes WandB's own hook
    off first (a service already gone is logged at INFO: the run's data was written when it
    finished). A run that fails still ends on its own traceback."""
    if not _FINISH_AT_EXIT:
        atexit.register(_finish_wandb)
        _FINISH_AT_EXIT.append(True)


def finish_tracking_after(last_step: int | None) -> None:
    """verl's ``Tracking`` finished right after it logs step ``last_step`` (the run's last).

    Why: the legacy trainer finishes its ``Tracking`` (and with it WandB's run) only when the
    object is collected, and in its Ray actor that happens as the actor is torn down, after
    WandB's service went with it: ``wandb.finish`` fails on the closed connection and a
    successful run ends on ``Exception ignored in ... Tracking.__del__``. Finished after the
    last step's log, the run ends while WandB still runs; ``Tracking.finish`` runs once, so its
    ``__del__`` (and V1's own call) then does nothing. Called in the TaskRunner, where the
    trainer logs (by ``GameAgentLoopManager``); ``None`` (no step count): nothing changes."""
    if last_step is None:
        return
    from verl.utils.tracking import Tracking

    log_step = getattr(Tracking.log, "__wrapped_by_agentrl__", Tracking.log)

    def log(self: Any, data: Any, step: int, backend: Any = None) -> None:
        log_step(self, data=data, step=step, backend=backend)
        if step >= last_step:
            self.finish()

    log.__wrapped_by_agentrl__ = log_step
    Tracking.log = log


def _finish_wandb() -> None:
    try:
        import wandb
    except ImportError:
        return
    try:
        if wandb.run is not None:
            wandb.run.finish()
    except (Exception, SystemExit) as error:  # noqa: BLE001 -- at exit: a line, no traceback
        log.warning("WandB's run did not finish cleanly: %s: %s", type(error).__name__, error)
    try:
        wandb.teardown()
    except (Exception, SystemExit) as error:  # noqa: BLE001 -- the run's data is written
        log.info("WandB's service was gone at exit: %s: %s", type(error).__name__, error)


def verl_run_outputs(config: Any) -> tuple[Path | None, dict[str, bool]]:
    """Our run folder (the parent of verl's checkpoint folder) and where else a verl run with
    ``config`` (verl's composed config) reports: ``use_wandb`` and ``console``."""
    trainer = config.trainer
    local_dir = trainer.get("default_local_dir")
    loggers = list(trainer.get("logger") or [])
    return (Path(str(local_dir)).parent if local_dir else None,
            {"use_wandb": "wandb" in loggers, "console": "console" in loggers})


class EpisodeMetricsLog:
    """Writes the metrics of each batch of episodes, and verl's own (see the module docstring).

    ``run_dir=None`` keeps no file; ``use_wandb`` logs into the process's WandB run when there
    is one; ``console`` prints a summary line per record; ``verl_log``: verl's ``file`` logger's
    output, copied in by :meth:`follow_verl` (None: verl's metrics are not copied).
    """

    def __init__(self, run_dir: str | Path | None, *, use_wandb: bool = True,
                 console: bool = True, verl_log: str | Path | None = None) -> None:
        self.path = Path(run_dir) / METRICS_FILE if run_dir is not None else None
        self.use_wandb = use_wandb
        self.console = console
        self.verl_log = Path(verl_log) if verl_log is not None else None
        self._verl_offset = 0
        self._started: set[str] = set()
        self._wandb_failed = False

    @classmethod
    def for_verl(cls, config: Any) -> EpisodeMetricsLog:
        """The log of a verl run with ``config`` (verl's composed config), in the process that
        runs verl's trainer (``VERL_FILE_LOGGER_PATH`` there: verl's ``file`` logger)."""
        run_dir, outputs = verl_run_outputs(config)
        loggers = list(config.trainer.get("logger") or [])
        verl_log = os.environ.get(VERL_LOG_ENV) if "file" in loggers else None
        return cls(run_dir, verl_log=verl_log, **outputs)

    def log_batch(self, infos: Iterable[Mapping[str, Any] | None] | None,
                  meta_info: Mapping[str, Any], per_row: int) -> dict[str, float]:
        """Log the metrics of one batch verl generated (after verl's records logged since the
        last batch); returns them (empty when the batch had no episodes of ours or no step)."""
        self.follow_verl()
        step = meta_info.get("global_steps")
        if infos is None or step is None:
            return {}
        groups = episode_groups(infos, per_row)
        if not groups:
            return {}
        split = "val" if meta_info.get("validate", False) else "train"
        metrics = batch_metrics([outcome for group in groups for outcome in group], split)
        if split == "train":
            metrics.update(uniform_group_metrics(groups))
        self.log(int(step), split, metrics)
        return metrics

    def log(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        record = metrics_record(step, metrics)
        self._write(record)
        if self.use_wandb:
            self._wandb_log(step, record)
        if self.console:
            print(f"agentrl {split} " + summary_line(step, record), flush=True)

    def follow_verl(self) -> list[dict[str, Any]]:
        """Copy the records verl's ``file`` logger wrote since the last call into the metrics
        file (verl sends them to its own console and WandB); returns them."""
        if self.verl_log is None:
            return []
        records, self._verl_offset = read_verl_log(self.verl_log, self._verl_offset)
        for record in records:
            self._write(record)
        return records

    def _write(self, record: Mapping[str, Any]) -> None:
        """Append ``record``; the first record of its kind this process writes drops that
        kind's records at its step and after (a resumed run redoes them)."""
        kind = record_kind(record)
        if self.path is not None:
            if kind not in self._started:
                self._drop_from(record["step"], kind)
            with self.path.open("a") as file:
                file.write(json.dumps(record) + "\n")
        self._started.add(kind)

    def _drop_from(self, step: int, kind: str) -> None:
        """Drop the records of this kind at ``step`` and after (a resumed run redoes them)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep_metrics(self.path, lambda r: r["step"] < step or record_kind(r) != kind,
                     f"of {kind} from step {step} on (they are redone)")

    def _wandb_log(self, step: int, record: Mapping[str, Any]) -> None:
        """Into the step verl logs next (it commits); nothing when WandB has no run here."""
        if self._wandb_failed:
            return
        try:
            import wandb

            if wandb.run is not None:
                finish_wandb_at_exit()
                values = {k: v for k, v in record.items()
                          if k not in ("step", "time") and v is not None}
                wandb.run.log(values, step=step, commit=False)
        except Exception as error:  # noqa: BLE001 -- the metrics file has the record
            self._wandb_failed = True
            log.warning("agentrl metrics not sent to WandB: %s: %s", type(error).__name__, error)
