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
