"""A verl trainer run as a child process: started in a session of its own, waited for with a
timeout, everything it started ended with it, its console's step metrics read back.

    process = start([python, "-m", "agentrl.cli", "train", ...], log)
    output = finish(process, log, timeout_s=900)      # the session ended, even on a timeout
    console_steps(output)                              # {1: {"timing_s/step": 12.5, ...}, ...}

Why a session: Ray's daemons and workers and vLLM's engine processes outlive a killed launcher
unless they are ended by session (they keep the launcher's session id); a caller that runs verl
(the slow tests, ``scripts/bench/learn.py``'s ``verl`` recipe, ``scripts/bench/verl_startup.py``)
never keeps Ray in its own process, and leaves nothing behind. Imports neither verl nor Ray.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ChildRunError", "console_steps", "end_session", "finish", "session_pids", "start",
           "survivors", "verl_cpu_python", "verl_cpu_venv_python"]

ROOT = Path(__file__).resolve().parents[2]
VERL_CPU_VENV = ".venv-verl-cpu"
"""The venv ``env_setup.sh --verl-cpu`` makes in the checkout, with vLLM's CPU build."""
STEP_LINE = re.compile(r"step:(\d+) - (.*)")
METRIC = re.compile(r"([\w/@.-]+):(?:np\.\w+\()?(-?[\d.]+(?:e[-+]?\d+)?)\)?(?= - |$)")
"""verl's console logger: ``step:N - key:value - ...``; a worker's value may be printed as
numpy's ``np.float64(value)``."""


class ChildRunError(RuntimeError):
    """A child run that failed or ran out of time (its output's tail in the message)."""


def verl_cpu_venv_python() -> Path | None:
    """Another interpreter with vLLM's CPU build: ``$AGENTRL_VERL_CPU_PYTHON``, else the
    ``.venv-verl-cpu`` of ``env_setup.sh --verl-cpu`` (or ``$AGENTRL_VERL_CPU_VENV``); None when
    neither is a file other than this interpreter."""
    named = os.environ.get("AGENTRL_VERL_CPU_PYTHON")
    venv = Path(os.environ.get("AGENTRL_VERL_CPU_VENV", ROOT / VERL_CPU_VENV))
    for candidate in (named, venv / "bin" / "python"):
        if candidate and Path(candidate).is_file() and Path(candidate) != Path(sys.executable):
            return Path(candidate)
    return None


def verl_cpu_python() -> str | None:
    """An interpreter that can run ``hardware=cpu-verl``: ``$AGENTRL_VERL_CPU_PYTHON`` as named,
    else :func:`verl_cpu_venv_python`, else this one when it has vLLM; None otherwise."""
    if named := os.environ.get("AGENTRL_VERL_CPU_PYTHON"):
        return named
    other = verl_cpu_venv_python()
    if other is not None:
        return str(other)
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This environment for a child run: WandB off and never this process's WandB service (a
    killed child's run would stay open in it), Ray's logs not deduplicated, output unbuffered,
    then ``env``."""
    inherited = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    return {**inherited, "WANDB_MODE": "disabled", "RAY_DEDUP_LOGS": "0",
            "PYTHONUNBUFFERED": "1", **(env or {})}


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``command`` from the checkout's root in a session of its own, its stdout and stderr
    into ``log``; ``env`` adds to :func:`child_env`."""
    env = child_env(env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


def finish(process: subprocess.Popen, log: Path, timeout_s: float) -> str:
    """Wait for ``process`` at most ``timeout_s`` seconds, then end its session; its output.
    A timeout or a non-zero exit raises :class:`ChildRunError` with the output's tail."""
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # never leave Ray behind: everything the run started shares its session
        end_session(process.pid)
        process.wait()
    output = log.read_text(errors="replace")
    if timed_out or process.returncode != 0:
        why = f"ran past {timeout_s:.0f} s" if timed_out else f"exited {process.returncode}"
        raise ChildRunError(f"{' '.join(process.args[2:4])} {why} (log: {log}); its last "
                            f"lines:\n{output[-4000:]}")
    return output


def session_pids(session: int) -> list[int]:
    """The live processes of ``session`` (``/proc/<pid>/stat`` field 6: the session id; a
    zombie, killed and not yet reaped by its new parent, holds nothing and is left out)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def survivors(session: int) -> list[str]:
    """The command lines of the processes left in ``session``."""
    found = []
    for pid in session_pids(session):
        with contextlib.suppress(OSError):
            found.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:160])
    return found


def end_session(session: int, wait_s: float = 10.0) -> None:
    """Kill every process of ``session`` (Ray's daemons and workers keep the launch's), and
    wait up to ``wait_s`` for them to be gone (their memory freed before the next run)."""
    deadline = time.monotonic() + wait_s
    while (pids := session_pids(session)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def console_steps(output: str, keys: tuple[str, ...] | None = None
                  ) -> dict[int, dict[str, float]]:
    """Step -> metrics of each ``step:N - ...`` line of verl's console logger (``keys``: only
    those, or every metric); a step logged twice (a resumed run) keeps its last line."""
    steps = {}
    for line in output.splitlines():
        found = STEP_LINE.search(line)
        if found:
            steps[int(found[1])] = {key: float(value) for key, value in METRIC.findall(found[2])
                                    if keys is None or key in keys}
    return steps
