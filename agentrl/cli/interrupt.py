"""Ctrl-C in `agentrl train` and `agentrl sft`: the run stops where it is, the engine is closed,
and one line on stderr says where it stopped, which checkpoint is the last intact one, and the
exact command that goes on; the exit status is 130 (128 + SIGINT), as a shell expects.

    with Interrupts() as interrupts:
        ...                                   # the work
    # outside: except BaseException as error: if interrupts.caught(error): ...

Where it stopped is read from the interrupted call stack (:func:`stage_of`): the outermost
trainer stage on it (loading, warm-start update, rollout, update, validation, saving, ...).
The signal is noted before Python raises ``KeyboardInterrupt``, so an interrupt that a library
turns into another error on the way out (torch's backward pass) still counts as Ctrl-C.
A checkpoint is written to a temporary folder and moved into place whole
(:mod:`agentrl.trainers.checkpoint`), so one cut short by Ctrl-C leaves the previous one the
newest intact checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["AFTER_STEP", "EXIT_INTERRUPTED", "Interrupts", "close_quietly", "fit_or_stop",
           "resume_command", "say", "stage_of", "stopped_line"]

EXIT_INTERRUPTED = 130
"""128 + SIGINT: what a shell reports for a command stopped by Ctrl-C."""

STAGES: dict[tuple[str, str], str] = {
    ("local", "__init__"): "loading the model",
    ("sft", "__init__"): "loading the model",
    ("local", "_restore"): "restoring the checkpoint",
    ("warm_start", "__init__"): "the warm start's demonstrations",
    ("warm_start", "step"): "a warm-start update",
    ("local", "_end_warm_start"): "the warm start's hand-off to PPO",
    ("local", "rollout"): "the rollout",
    ("ppo_update", "update"): "the PPO update",
    ("local", "validate"): "validation",
    ("tracking", "log"): "logging",
    ("local", "save"): "saving a checkpoint",
    ("plots", "plot_learning_curves"): "drawing the learning curves",
    ("sft", "evaluate"): "held-out evaluation",
    ("sft", "demonstrations"): "the oracle's demonstrations",
    ("sft", "train"): "the SFT updates",
    ("sft", "save"): "saving the checkpoint",
}
"""(module file stem, function) of a trainer frame -> the stage it is; the outermost on the
stack names the stage (``validate`` runs a rollout of its own)."""
AFTER_STEP = {"validation", "logging", "saving a checkpoint", "drawing the learning curves"}
"""Stages a step reaches after its counter moved on (``LocalTrainer.fit``)."""


class Interrupts:
    """Notes SIGINT (then raises ``KeyboardInterrupt`` as Python's own handler does) while the
    ``with`` block runs in the main thread; :meth:`caught` tells an error it caused."""

    def __init__(self) -> None:
        self.signalled = False
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signalled = True
        raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def caught(self, error: BaseException) -> bool:
        return isinstance(error, KeyboardInterrupt) or self.signalled


def stage_of(tb: TracebackType | None) -> str | None:
    """The outermost trainer stage (:data:`STAGES`) on the traceback ``tb``, or None."""
    for frame in traceback.extract_tb(tb):
        stage = STAGES.get((Path(frame.filename).stem, frame.name))
        if stage is not None and "agentrl" in Path(frame.filename).parts:
            return stage
    return None


def close_quietly(trainer: Any) -> None:
    """``trainer.close()`` after an interrupt: whatever it raises (a second Ctrl-C included)
    is dropped; the process is ending."""
    # the process is ending: what the half-played episodes leave behind (asyncio's log of a
    # task the interrupt hit, a coroutine never awaited) is not news, the line about it is
    warnings.simplefilter("ignore")
    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
    if trainer is None:
        return
    try:
        loop = getattr(trainer, "loop", None)
        if loop is not None and not loop.is_closed():  # the episodes Ctrl-C left half played
            loop.set_exception_handler(lambda loop, context: None)
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        trainer.close()
    except BaseException:  # noqa: BLE001 - the line about the interrupt matters more
        pass


def fit_or_stop(make_trainer: Callable[[], Any], stopped: Callable[[BaseException, Any], str]
                ) -> tuple[Any, Any] | None:
    """``(trainer, trainer.fit())``, or None after Ctrl-C (anywhere, the trainer's start-up
    included): the trainer closed quietly and ``stopped(error, trainer)``'s one line said (the
    trainer None when Ctrl-C came before it was built). Any other error is raised."""
    trainer = None
    with Interrupts() as interrupts:
        try:
            trainer = make_trainer()
            return trainer, trainer.fit()
        except BaseException as error:
            if not interrupts.caught(error):
                raise
            close_quietly(trainer)
            say(stopped(error, trainer))
            return None


def resume_command(command: str, overrides: Sequence[str]) -> str:
    """``agentrl <command> <overrides>`` with any ``resume=`` dropped for ``resume=auto`` (the
    newest intact checkpoint): ``resume=never`` would start over, and a named checkpoint would
    go back to it."""
    kept = [o for o in overrides if not o.lstrip("+").startswith("resume=")]
    if len(kept) != len(overrides):
        kept.append("resume=auto")
    return shlex.join(["agentrl", command, *kept])


def stopped_line(where: str, checkpoint: Path | None, command: str, *, resumes: bool = True
                 ) -> str:
    """The one line Ctrl-C leaves: where, the newest intact checkpoint, the command to go on."""
    if checkpoint is not None and resumes:
        return (f"stopped by Ctrl-C during {where}; last checkpoint {checkpoint} is intact; "
                f"resume with: {command}")
    if checkpoint is not None:
        return (f"stopped by Ctrl-C during {where}; nothing new was saved (the checkpoint "
                f"{checkpoint} is an earlier run's, intact); run again with: {command}")
    return f"stopped by Ctrl-C during {where}; no checkpoint saved yet; start again with: {command}"


def say(line: str) -> None:
    """The line on stderr, on a fresh line (a progress bar may be mid-line)."""
    print(f"\n{line}", file=sys.stderr, flush=True)
