"""A run's episode records on disk: ``<run_dir>/episodes/step_N.jsonl``, one record per line
(:mod:`agentrl.rollout.episode_record`), the training and validation samples of step N.

    log = EpisodeLog(run_dir)
    log.drop_after(resume_step)           # local engine, at start: steps after the checkpoint go
    log.write(step, records)              # each record names its split
    read_episodes(run_dir)                # {step: [record, ...]}, for the report

- **Atomic**: a step's file is rewritten whole through a temporary file and a rename, so a reader
  (or a crash) sees the old file or the new one. Records of a split replace that split's
  records of the step (verl writes training and validation of one step in two calls).
- **Resume**: the local engine drops the files after its checkpoint's step at start (all of
  them when it starts afresh), as :class:`~agentrl.trainers.tracking.RunTracker` does with the
  metrics; on verl the first write of a split in a process drops that split's records at its
  step and after (as :mod:`agentrl.verl.metrics` does). Steps redone after a resume appear once.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.trainers.tracking import write_text_atomic

__all__ = ["EPISODES_DIR", "EpisodeLog", "episode_file", "read_episodes"]

log = logging.getLogger(__name__)

EPISODES_DIR = "episodes"
STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def episode_file(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / EPISODES_DIR / f"step_{step}.jsonl"


def step_files(run_dir: str | Path) -> dict[int, Path]:
    """The run's episode files by step, in step order."""
    folder = Path(run_dir) / EPISODES_DIR
    found = {}
    if folder.is_dir():
        for path in folder.iterdir():
            match = STEP_FILE.match(path.name)
            if match:
                found[int(match[1])] = path
    return dict(sorted(found.items()))


def _read(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s:%d: skipping a line that is not JSON", path, number)
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_episodes(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """``{step: records}`` of a run, in step order (an unreadable line is skipped with a warning)."""
    return {step: _read(path) for step, path in step_files(run_dir).items()}


class EpisodeLog:
    """Writes a run's episode records (see the module docstring)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._started: set[str] = set()

    def drop_after(self, step: int | None) -> None:
        """Remove the records of steps after ``step`` (all when None)."""
        for file_step, path in step_files(self.run_dir).items():
            if step is None or file_step > step:
                path.unlink(missing_ok=True)

    def write(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        """Store ``records`` as step ``step``'s (each names its ``split``; the step's earlier
        records of those splits are replaced)."""
        splits = {str(r["split"]) for r in records}
        for split in splits - self._started:
            self._drop_split_from(step, split)
            self._started.add(split)
        if not records:
            return
        path = episode_file(self.run_dir, step)
        kept = [r for r in _read(path) if r.get("split") not in splits] if path.exists() else []
        lines = [json.dumps({**r, "step": step}) for r in [*kept, *records]]
        write_text_atomic(path, "".join(line + "\n" for line in lines))

    def _drop_split_from(self, step: int, split: str) -> None:
        for file_step, path in step_files(self.run_dir).items():
            if file_step < step:
                continue
            records = _read(path)
            kept = [r for r in records if r.get("split") != split]
            if not kept:
                path.unlink(missing_ok=True)
            elif len(kept) < len(records):
                write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
