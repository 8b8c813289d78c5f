"""scripts/bench/context_rows.py on the tiny model: the former and the current layout of the
default preset on the same games, rows counted and one PPO update timed for each."""

from __future__ import annotations

import json


def test_the_state_layout_reads_a_third_of_the_tokens_on_the_same_games(load_script, tmp_path,
                                                                        one_torch_thread):
    bench = load_script("scripts/bench/context_rows.py")
    out = tmp_path / "context_rows.json"
    result = bench.main(["--episodes", "12", "--repeats", "1", "--out", str(out), "model=tiny",
                         "threads=1", "train.group_num=1", "train.group_size=2"])
    assert json.loads(out.read_text()) == result
    tokens = result["tokens"]
    for policy in ("oracle", "random"):
        old, new = tokens["history"][policy], tokens["state"][policy]
        assert old["success"] == new["success"]  # the same games, the same moves
        assert old["model_tokens_per_episode"] == new["model_tokens_per_episode"]
        assert new["rows_per_episode"] > old["rows_per_episode"]  # a row a turn
        assert result["token_ratio"][policy] <= 1 / 3
    assert tokens["state"]["oracle"]["success"] == 1.0
    step = result["step"]
    assert step["episodes"] == 2 and set(step["timing"]) == {"history", "state"}
    assert all(len(t["seconds"]) == 1 for t in step["timing"].values())
    assert 0 < result["step_token_ratio"] < 1 and result["step_time_ratio"] > 0
