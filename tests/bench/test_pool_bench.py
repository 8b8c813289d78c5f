"""scripts/bench/pool.py: its checks, and a smoke run with the tiny model (one seed, four
candidate games, a pool of up to two, one PPO step) that writes the JSON the issue names
(``pool_before``/``pool_after`` per seed, the RL health numbers) and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/pool.py")


@pytest.mark.parametrize("argv,message", [
    (["--pool-size", "0"], "--pool-size must be >= 1"),
    (["--min-wins", "6", "--max-wins", "5"], "--min-wins"),
    (["--max-wins", "9"], "--samples"),
    (["--minutes", "0"], "--minutes must be > 0"),
])
def test_bad_arguments_are_refused_naming_the_flag(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_smoke_run_writes_each_seeds_pool_before_and_after(bench, tmp_path, one_torch_thread):
    out = tmp_path / "pool.json"
    result = bench.main(["--seeds", "1", "--candidates", "4", "--samples", "2",
                         "--pool-size", "2", "--groups", "2", "--group-size", "2",
                         "--steps", "1", "--sft-episodes", "2", "--val-groups", "2",
                         "--min-wins", "0", "--max-wins", "2",
                         "--run-dir", str(tmp_path / "runs"), "--out", str(out),
                         "model=tiny", "threads=1"])
    written = json.loads(out.read_text())
    assert written["seeds"] == [0] and written["runs"] == json.loads(json.dumps(result["runs"]))
    run = written["runs"][0]
    # min-wins 0: every greedy loss qualifies, and the tiny random model loses every game
    assert len(run["pool"]) == 2 and run["pool_before"] == 0.0
    assert 0.0 <= run["pool_after"] <= 1.0 and len(run["pool_after_wins"]) == 2
    assert written["mastered"] == int(run["pool_after"] >= 7 / 8)
    assert run["ppo_steps"] == 1
    assert set(run["health"]) == set(bench.HEALTH) and run["health"]["actor/entropy"] > 0
    # the critic's marks, as the learning benchmark's: one step gives none from step 5 on
    assert run["explained_variance_from_step_5"] is None
    assert run["mc_explained_variance_from_step_5"] is None and "explained_variance_pooled" in run
    assert run["held_out_after"]["episodes"] == 2
    assert Path(written["plot"]).stat().st_size > 0
