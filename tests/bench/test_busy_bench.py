"""scripts/bench/busy.py on the tiny model: each setting's process starts OpenMP with the wait
policy it names, times a step alone and beside a competitor, and leaves no competitor behind."""

from __future__ import annotations

import json
import os

import pytest


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_each_setting_runs_with_its_policy_and_ends_its_competitor(load_script, tmp_path):
    bench = load_script("scripts/bench/busy.py")
    out = tmp_path / "busy.json"
    result = bench.main(["--model", "tiny", "--settings", "default:1", "passive:2",
                         "--competitor", "python", "--repeats", "1", "--batch", "2",
                         "--new-tokens", "3", "--prompt-tokens", "8", "--train-tokens", "16",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = {row["setting"]: row for row in result["rows"]}
    assert rows["default:1"]["omp_wait_policy"] is None and rows["default:1"]["threads"] == 1
    assert rows["passive:2"]["omp_wait_policy"] == "PASSIVE" and rows["passive:2"]["threads"] == 2
    for row in rows.values():
        assert len(row["runs"]["alone"]) == 1 and len(row["runs"]["busy"]) == 1
        (alone,), (busy,) = row["runs"]["alone"], row["runs"]["busy"]   # decode, update
        assert row["alone_s"] == pytest.approx(sum(alone), abs=1e-3)
        assert row["slowdown"] == pytest.approx(sum(busy) / sum(alone), abs=0.006)
        assert row["competitor_pids"] and all(gone(pid) for pid in row["competitor_pids"])


@pytest.mark.parametrize("setting", ["spin:2", "passive:0", "passive", "active:x"])
def test_a_bad_setting_is_refused_naming_the_allowed_values(load_script, setting, capsys):
    bench = load_script("scripts/bench/busy.py")
    with pytest.raises(SystemExit):
        bench.parse_args(["--settings", setting])
    assert "POLICY:THREADS" in capsys.readouterr().err


def test_a_competitor_dies_with_the_process_that_started_it(tmp_path):
    """A worker killed mid-step (SIGKILL: no ``finally``) leaves no busy loop behind."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "busy.py"
    code = ("import importlib.util, time\n"
            f"spec = importlib.util.spec_from_file_location('busy', {str(script)!r})\n"
            "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
            "started = []\nbench.start_competitor('python', 1, started)\n"
            "print(started[0].pid, flush=True)\ntime.sleep(120)\n")
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    competitor = int(worker.stdout.readline())
    assert not gone(competitor)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 10
    while not ended(competitor) and time.monotonic() < deadline:
        time.sleep(0.1)
    survived = not ended(competitor)
    if survived:   # do not leave it spinning, then fail
        os.kill(competitor, signal.SIGKILL)
    assert not survived


def ended(pid: int) -> bool:
    """Gone, or dead and not yet reaped by its new parent."""
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return gone(pid) or state == "Z"
