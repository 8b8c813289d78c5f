"""A verl run started again after it was killed (SIGKILL, the OOM killer, a lost node): what
the launcher puts right before verl starts, so the run resumes from its newest intact
checkpoint and nothing of the killed run is in its way.

    restart.end_leftovers(run_dir)                  # the killed launch's processes, ended
    restart.resume_point(checkpoints, "auto", roles=("actor", "critic"))  # tracker repaired

**What verl 0.9.1 does.** ``resume_mode=auto`` reads the step from
``checkpoints/latest_checkpointed_iteration.txt`` and loads ``global_step_<step>``
(``find_latest_ckpt_path``). Its trainer writes that tracker last, after the actor's, the
critic's and ``data.pt`` (the data loader's position), so a kill mid-save leaves a partial newer
folder that the tracker does not name. Where that goes wrong:

- the tracker is opened, then written (not renamed into place): a kill in between leaves it
  empty, and verl stops at start with ``int("")``'s ValueError;
- with ``trainer.keep_last: 1`` verl deletes the previous checkpoint's ``actor/`` as soon as
  the new actor is saved, before the critic: a kill then leaves no intact checkpoint, and verl
  loads the tracker's half-deleted folder and fails in its workers;
- a folder damaged later (a truncated copy) is loaded the same way.

:func:`resume_point` therefore picks the newest *intact* ``global_step_N`` (each role's shard
files for every rank of its ``fsdp_config.json``, every ``*.pt`` a whole ``torch.save`` zip
archive, ``data.pt`` present), names the skipped ones in a warning (as the local engine does,
:func:`agentrl.trainers.checkpoint.newest_intact_checkpoint`), and points the tracker at it
(written atomically). When folders exist and none is intact it stops, naming each: starting
over would overwrite the run. Partial folders are left: verl rewrites every file when it saves
that step again.

**Leftovers.** Every process of a launch carries ``AGENTRL_VERL_RUN=<run_dir>`` in its
environment (Ray's daemons and workers and vLLM's engine processes inherit it); the verl
process dies with its launcher (``PR_SET_PDEATHSIG``), and Ray's daemons with the verl process
(Ray's own fate sharing). :func:`end_leftovers` ends what is still marked with this run folder
(a worker or engine process orphaned by the kill holds GiBs of memory) and refuses to start
while a verl process of it still runs (a second launch into a running run's folder). Ray itself:
a CPU run always starts a Ray instance of its own (``ray_init.address=local``,
:mod:`.cpu_platform`), never joining a cluster an earlier ``ray start`` left.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agentrl.trainers.tracking import write_text_atomic
from agentrl.trainers.verl_checkpoints import checkpoint_problem, newest_intact, step_folders

__all__ = ["RUN_MARK", "TRACKER", "checkpoint_problem", "die_with_parent", "end_leftovers",
           "marked_processes", "resume_point", "run_mark"]

log = logging.getLogger(__name__)

RUN_MARK = "AGENTRL_VERL_RUN"
"""Environment variable naming the run folder in every process of a launch."""
TRACKER = "latest_checkpointed_iteration.txt"
"""verl's file naming the step it resumes from."""
VERL_DRIVER = "verl.trainer.main_ppo"
LEFTOVER_WAIT_S = 20.0


# -- checkpoints ---------------------------------------------------------------------------------
def _tracked_step(checkpoints: Path) -> int | None:
    try:
        return int((checkpoints / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def resume_point(checkpoints: Path, resume: str, roles: Sequence[str]) -> Path | None:
    """The checkpoint verl will resume from, made so (see the module docstring): ``resume``
    ``auto`` -> the newest intact ``global_step_N`` (the tracker pointed at it), None without
    checkpoints; ``never`` -> None; a folder -> that folder, which must be intact."""
    if resume == "never":
        return None
    if resume != "auto":
        folder = Path(resume)
        if (problem := checkpoint_problem(folder, roles)) is not None:
            raise ValueError(f"resume={resume!r}: not an intact verl checkpoint ({problem}); "
                             "allowed: auto, never, or an intact global_step_N folder")
        return folder
    skipped = []
    for step, folder in step_folders(checkpoints):
        problem = checkpoint_problem(folder, roles)
        if problem is None:
            _track(checkpoints, step, skipped)
            return folder
        skipped.append(f"{folder.name} ({problem})")
    if skipped:
        raise ValueError(f"no intact checkpoint in {checkpoints}: {'; '.join(skipped)}. Nothing "
                         "was started (a new run there would overwrite it); allowed: "
                         "resume=never (start over), resume=<an intact global_step_N folder>, "
                         "or another run_dir")
    (checkpoints / TRACKER).unlink(missing_ok=True)  # an empty one would stop verl
    return None


def _track(checkpoints: Path, step: int, skipped: Sequence[str]) -> None:
    for folder in skipped:
        log.warning("checkpoint %s is not intact: skipped, resuming from an older one", folder)
    tracked = _tracked_step(checkpoints)
    if tracked != step:
        log.warning("%s named step %s: resuming from global_step_%d, the newest intact "
                    "checkpoint", checkpoints / TRACKER, tracked, step)
        write_text_atomic(checkpoints / TRACKER, str(step))


# -- processes -------------------------------------------------------------------------------------
def run_mark(run_dir: Path) -> dict[str, str]:
    """The variable that marks every process of a launch into ``run_dir``."""
    return {RUN_MARK: str(Path(run_dir).resolve())}


def marked_processes(run_dir: Path) -> dict[int, str]:
    """pid -> command line of the processes (other than this one) marked with ``run_dir``."""
    (name, value), = run_mark(run_dir).items()
    mark = f"{name}={value}"
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) != os.getpid() and mark in _read_list(proc / "environ"):
                found[int(proc.name)] = " ".join(_read_list(proc / "cmdline")).strip()
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found


def _read_list(path: Path) -> list[str]:
    """A ``/proc`` file of NUL-separated strings (``environ``, ``cmdline``)."""
    return path.read_bytes().decode(errors="replace").split("\0")


def end_leftovers(run_dir: Path) -> list[int]:
    """End the processes an earlier, killed launch into ``run_dir`` left (returns their pids);
    ValueError while that launch's verl process still runs."""
    found = marked_processes(run_dir)
    running = [pid for pid, command in found.items() if VERL_DRIVER in command]
    if running:
        raise ValueError(f"a verl run into run_dir={run_dir} is still running (pid "
                         f"{', '.join(map(str, running))}): stop it first, or use another run_dir")
    if not found:
        return []
    log.warning("ending %d process(es) left by an earlier launch into %s: %s", len(found),
                run_dir, "; ".join(f"{pid} {command[:80]}" for pid, command in found.items()))
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in found):
        time.sleep(0.1)
    return sorted(found)


def _alive(pid: int) -> bool:
    """Running (a zombie, which holds no memory, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
"""libc's ``prctl``, looked up here: a forked child must not load libraries before ``exec``."""


def die_with_parent() -> None:
    """For ``subprocess``'s ``preexec_fn``: the child is SIGKILLed when its parent dies (Linux;
    elsewhere nothing)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
