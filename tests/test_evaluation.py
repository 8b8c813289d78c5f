"""evaluate(): held-out seeds, the oracle and random reference policies, the model policy."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from rich.console import Console

from agentrl.agents import load_agent_presets
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.envs.splits import SEED_RANGES
from agentrl.evaluation import TABLE_COLUMNS, evaluate
from agentrl.evaluation.stats import wilson_interval

PRESETS = load_agent_presets()
SMALL = ("tetrisType1Agent", "blocksworldTextAgent", "blocksworld1dAgent", "blocksworld2dAgent")
ROW_KEYS = {key for key, _, _ in TABLE_COLUMNS}


def pick(*names: str) -> dict:
    return {name: PRESETS[name] for name in names}


def run(presets, policy, **kwargs):
    kwargs.setdefault("progress", False)
    return asyncio.run(evaluate(presets, policy, **kwargs))


def solved(result) -> int:
    return sum(t.success for t in result.trajectories)


def texts(result) -> list[str]:
    return [turn.text for t in result.trajectories for turn in t.turns]


def test_oracle_solves_every_held_out_game():
    result = run(pick(*SMALL), "oracle", groups=4)
    assert result.presets == list(SMALL)
    for name in SMALL:
        row = result.preset_metrics(name)
        assert row["episodes"] == 4
        assert row["success"] == 1.0 and row["action_is_valid"] == 1.0
        assert row["format_error"] == 0.0 and row["response_length"] == 0.0
        assert result.metrics[f"val/{name}/success"] == 1.0


def test_seeds_come_from_the_held_out_range_and_are_shared_by_presets():
    result = run(pick(*SMALL[:2]), "oracle", groups=3, group_size=2, seed_offset=5)
    assert result.seeds == tuple(SEED_RANGES["val"][5:8])
    for name in SMALL[:2]:
        seeds = [t.seed for t in result.trajectories if t.preset == name]
        assert seeds == [s for s in result.seeds for _ in range(2)]
    test = run(pick(SMALL[0]), "oracle", groups=2, split="test")
    assert all(t.seed in SEED_RANGES["test"] for t in test.trajectories)
    assert not any(t.seed in SEED_RANGES["train"] for t in result.trajectories + test.trajectories)


def test_random_policy_does_worse_than_the_oracle_on_the_same_games():
    presets = pick(*SMALL)
    oracle = run(presets, "oracle", groups=8)
    random = run(presets, "random", groups=8, seed=0)
    assert [t.seed for t in random.trajectories] == [t.seed for t in oracle.trajectories]
    assert solved(random) < solved(oracle) == len(oracle.trajectories)
    assert random.preset_metrics("blocksworldTextAgent")["action_is_valid"] < 1.0
    assert random.preset_metrics("blocksworldTextAgent")["turns"] > 1


def test_random_policy_is_reproducible_by_seed():
    presets = pick("blocksworld2dAgent")
    first = run(presets, "random", groups=3, seed=7)
    again = run(presets, "random", groups=3, seed=7)
    other = run(presets, "random", groups=3, seed=8)
    assert texts(first) == texts(again)
    assert texts(first) != texts(other)


def test_result_table_and_json():
    result = run(pick(*SMALL[:2]), "random", groups=2)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["policy"] == "random" and data["split"] == "val"
    assert list(data["presets"]) == list(SMALL[:2])
    for row in data["presets"].values():
        assert ROW_KEYS <= set(row) and row["episodes"] == 2
    assert set(data["timing"]) == {"generate_s", "env_s", "tokenize_s"}
    console = Console(file=io.StringIO(), width=200)
    console.print(result.table())
    text = console.file.getvalue()
    for heading in ["preset"] + [heading for _, heading, _ in TABLE_COLUMNS] + list(SMALL[:2]):
        assert heading in text


def test_every_success_rate_comes_with_its_95_percent_interval():
    result = run(pick(*SMALL[:2]), "random", groups=12)
    data = json.loads(json.dumps(result.to_dict()))
    console = Console(file=io.StringIO(), width=200)
    console.print(result.table())
    text = console.file.getvalue()
    assert "95% interval" in text
    for name, row in data["presets"].items():
        low, high = row["success_ci95"]
        assert (low, high) == pytest.approx(wilson_interval(row["success"] * 12, 12))
        assert low < row["success"] < high or row["success"] in (low, high)
        assert f"{100 * low:.1f}-{100 * high:.1f}" in text
        assert result.metrics[f"val/{name}/episodes"] == 12


def test_progress_bar_counts_episodes(capsys):
    run(pick(SMALL[0]), "oracle", groups=3, progress=True)
    err = capsys.readouterr().err
    assert "eval oracle" in err and "3/3" in err and "success=3/3" in err


@pytest.mark.parametrize("policy, message", [("expert", "unknown policy='expert'"),
                                             (object(), "needs its tokenizer")])
def test_bad_policy_fails_with_a_message(policy, message):
    with pytest.raises(ValueError, match=message):
        run(pick(SMALL[0]), policy, groups=1)


def test_bad_sizes_fail_with_a_message():
    with pytest.raises(ValueError, match="groups and group_size"):
        run(pick(SMALL[0]), "oracle", groups=0)
    with pytest.raises(ValueError, match="no presets"):
        run({}, "oracle", groups=1)


def test_tiny_model_plays_greedily(tiny, one_torch_thread):
    model, tokenizer = tiny
    llm = BatchingLLM(model, tokenizer, max_batch=8, seed=0)
    try:
        result = run(pick("simpleSokobanAgent"), llm, groups=2, group_size=2, label="tiny",
                     sampling=SamplingParams(greedy=True, max_new_tokens=4))
    finally:
        llm.close()
    assert result.policy == "tiny" and len(result.trajectories) == 4
    row = result.preset_metrics("simpleSokobanAgent")
    assert ROW_KEYS <= set(row) and row["episodes"] == 4
    assert 0 < row["response_length"] <= 4 * row["turns"]
    assert result.metrics["timing/generate_s"] > 0
    first, second = result.trajectories[:2]  # one group: same game, greedy => same replies
    assert first.seed == second.seed in SEED_RANGES["val"]
    assert first.response_ids == second.response_ids and first.response_ids
