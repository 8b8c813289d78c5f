"""scripts/bench/train.py on the tiny model: quick_train's CPU step, its stage seconds and the
engine's work in each step."""

from __future__ import annotations

import json

import pytest
import torch

# Each test runs whole PPO steps (the CPU preset's 4 x 8 episodes where the test is about that
# preset, one group of 4 elsewhere; 20-70 s): the full suite runs them.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]
ONE_GROUP = ("train.group_num=1", "train.group_size=4")


def test_one_step_reports_stage_seconds_engine_work_and_load(tmp_path, load_script):
    bench = load_script("scripts/bench/train.py")
    out = tmp_path / "train.json"
    result = bench.main(["--steps", "1", "--out", str(out), "model=tiny",
                         "rollout.max_new_tokens=8"])
    assert json.loads(out.read_text())["seconds_per_step"] == result["seconds_per_step"]
    assert result["episodes_per_step"] == 32  # the CPU preset: 4 groups of 8
    step = result["per_step"][0]
    assert result["stage_seconds"]["rollout"] == pytest.approx(step["timing/rollout_s"])
    assert sum(result["stage_share"].values()) <= 1 + 1e-9
    assert step["engine/generated_tokens"] == result["generation"]["generated_tokens"] > 0
    assert step["engine/decode_tokens_per_s"] > 0
    assert len(result["load_average"]["before"]) == 3


def test_the_update_is_compared_with_a_bare_loop_on_its_shapes(tmp_path, load_script, tiny):
    bench = load_script("scripts/bench/train.py")
    result = bench.main(["--steps", "1", "--out", str(tmp_path / "t.json"), "model=tiny",
                         "rollout.max_new_tokens=8", *ONE_GROUP])
    assert result["bare_update_tokens_per_s"] > 0
    assert result["actor_update_vs_bare"] == pytest.approx(
        result["actor_update_tokens_per_s"] / result["bare_update_tokens_per_s"])
    model, _ = tiny
    before = [p.detach().clone() for p in model.parameters()]
    assert bench.bare_update_tokens_per_s(model, rows=3, width=5, micro_batch_size=2) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it stepped


def test_the_tokens_the_update_reads_fall_with_the_shared_prefix(tmp_path, load_script):
    bench = load_script("scripts/bench/train.py")
    read = {}
    for share in (0, 16):
        result = bench.main(["--steps", "1", "--out", str(tmp_path / f"{share}.json"),
                             "model=tiny", "rollout.max_new_tokens=8", *ONE_GROUP,
                             f"actor.shared_prefix_tokens={share}"])
        step = result["per_step"][0]
        assert result["update_tokens_read_per_step"] == step["update_tokens_read"]
        read[share] = step["update_tokens_read"], step["update_tokens"]
    assert read[0][0] >= read[0][1]  # every row's tokens, in at least one pass
    assert 0 < read[16][0] < read[0][0]


def test_a_step_whose_groups_were_all_dropped_is_not_an_update(tmp_path, load_script):
    """Replies cut at one token lose every game; dropping the all-lost groups leaves the step
    nothing to update: a clear stop, not a crash on the missing update's counts."""
    bench = load_script("scripts/bench/train.py")
    with pytest.raises(SystemExit, match="no step updated the model"):
        bench.main(["--steps", "1", "--out", str(tmp_path / "t.json"), "model=tiny",
                    "rollout.max_new_tokens=1", "rollout.drop_uniform_groups=true",
                    "rollout.drop_uniform_outcome=lost", *ONE_GROUP])
