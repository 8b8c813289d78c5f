"""Whether a run resumes, from which checkpoint, and what its config may change meanwhile.

    path = resume_checkpoint(run_dir, config.resume, config.to_dict())  # None: start fresh

``resume=auto`` takes the run folder's newest intact checkpoint
(:func:`agentrl.trainers.checkpoint.newest_intact_checkpoint`); a path takes that checkpoint,
which must be intact; ``never`` starts fresh. Resuming refuses (:func:`check_resume`) a
``train.total_steps`` below the checkpoint's step and, unless ``resume_config_changes=allow``,
a config that differs from the checkpoint's in a key that changes training (the keys of
:data:`RESUME_FREE_KEYS` may change freely).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agentrl.trainers.checkpoint import (
    CHECKPOINTS_DIR, CONFIG_FILE, checkpoint_problem, checkpoint_step, newest_intact_checkpoint,
)
from agentrl.trainers.tracking import public_config

__all__ = ["RESUME_CONFIG_CHANGES", "RESUME_FREE_KEYS", "RESUME_MODES", "check_resume",
           "config_changes", "resume_checkpoint"]

log = logging.getLogger(__name__)

RESUME_MODES = ("auto", "never")
RESUME_CONFIG_CHANGES = ("refuse", "allow")
RESUME_FREE_KEYS = ("project", "experiment", "run_dir", "resume", "resume_config_changes",
                    "device", "threads", "agents_file", "train.total_steps", "val.", "trainer.",
                    "hardware.", "rollout.max_batch", "rollout.max_wait_ms",
                    "rollout.prefix_cache_tokens", "sft.output_dir")
"""Config keys (or ``section.`` prefixes) a resumed run may change without
``resume_config_changes=allow``: where it writes, how long it runs, how it validates and logs,
and batching settings that change speed, not results."""


def resume_checkpoint(run_dir: str | Path, resume: str | Path | None,
                      config: Mapping[str, Any] | None = None) -> Path | None:
    """What the ``resume`` setting points at, verified: ``"auto"`` -> the newest intact
    checkpoint of ``run_dir`` (:func:`newest_intact_checkpoint`), ``"never"``/``None`` ->
    ``None``, anything else -> that checkpoint folder, which must be intact. With the run's
    ``config`` (a plain mapping), :func:`check_resume` checks it against the checkpoint's."""
    if resume is None or resume == "never":
        return None
    if resume == "auto":
        try:
            path = newest_intact_checkpoint(Path(run_dir) / CHECKPOINTS_DIR)
        except ValueError as error:
            raise ValueError(f"{error}. Nothing was started (a new run there would overwrite "
                             "its history); allowed: resume=<an intact checkpoint folder>, or "
                             "another run_dir") from None
    else:
        path = Path(resume)
        if (problem := checkpoint_problem(path)) is not None:
            raise ValueError(f"resume={str(resume)!r}: not an intact checkpoint folder "
                             f"({problem}); allowed: {', '.join(RESUME_MODES)}, or the path of "
                             "an intact checkpoint folder")
    if path is not None and config is not None:
        check_resume(path, config)
    return path


def check_resume(path: Path, config: Mapping[str, Any]) -> None:
    """Refuse to resume ``path`` with ``config`` (a plain mapping) when its
    ``train.total_steps`` is below the checkpoint's step, or when a key outside
    :data:`RESUME_FREE_KEYS` changed and ``resume_config_changes`` is not ``allow`` (then the
    changes are only logged)."""
    step = checkpoint_step(path)
    total = config.get("train", {}).get("total_steps")
    if isinstance(total, int) and step is not None and total < step:
        raise ValueError(f"train.total_steps={total} is below step {step} of the checkpoint "
                         f"{path}; allowed: train.total_steps >= {step}, or resume=never with "
                         "another run_dir")
    saved_path = path / CONFIG_FILE
    saved = yaml.safe_load(saved_path.read_text()) if saved_path.is_file() else None
    if not isinstance(saved, dict):
        return
    changes = config_changes(saved, public_config(dict(config)))
    if not changes:
        return
    listed = ", ".join(changes[:8]) + (f" and {len(changes) - 8} more" if len(changes) > 8 else "")
    if config.get("resume_config_changes") == "allow":
        log.warning("resuming %s with a changed config (resume_config_changes=allow): %s",
                    path, listed)
        return
    raise ValueError(f"resume from {path} with a changed config: {listed}; allowed: the "
                     "checkpoint's values, resume_config_changes=allow to go on with the new "
                     "ones, or resume=never with another run_dir")


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"key: old -> new"`` for each key set in both configs that changed and is not free to
    (keys only one side has, from another version, are left out)."""
    old, new = _flat(saved), _flat(current)
    return [f"{key}: {old[key]!r} -> {new[key]!r}" for key in old
            if key in new and old[key] != new[key]
            and not any(key == free or (free.endswith(".") and key.startswith(free))
                        for free in RESUME_FREE_KEYS)]


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
