"""scripts/bench/rollout.py: the simulated model, and a tiny run of both schedulers."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl.agents import Agent, load_agent_presets, parse_response
from agentrl.engines import SamplingParams
from agentrl.models import end_of_turn_ids, load_tokenizer
from agentrl.rollout import first_prompt_ids

MODE_KEYS = {"episodes", "turns", "reply_tokens", "wall_s", "episodes_per_s",
             "model_critical_path_s", "model_compute_s", "overhead_s", "overhead_share",
             "startup_s", "cpu_s", "cpu_over_wall"}


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/rollout.py")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def first_prompt(tokenizer, preset: str, seed: int = 0) -> list[int]:
    with Agent(load_agent_presets()[preset]) as agent:
        return first_prompt_ids(tokenizer, agent.reset(seed=seed))


def test_replies_are_well_formed_game_actions_and_vary_per_repeat(bench, tokenizer):
    llm = bench.SimulatedLLM(tokenizer, bench.Latency(0, 0), mean_think_tokens=20)
    sampling = SamplingParams(max_new_tokens=400)
    prompt = first_prompt(tokenizer, "simpleSokobanAgent")
    replies = [llm.reply(prompt, sampling) for _ in range(4)]
    assert len({tuple(r) for r in replies}) > 1  # the k-th repeat of a prompt gets variant k
    for ids in replies:
        assert ids[-1] == end_of_turn_ids(tokenizer)[0]
        parsed = parse_response(tokenizer.decode(ids, skip_special_tokens=True),
                                enable_think=True, separator="||", max_actions=5)
        assert parsed.format_ok
        assert set(parsed.actions) <= set(bench.GAME_ACTIONS["Sokoban"])
    again = bench.SimulatedLLM(tokenizer, bench.Latency(0, 0), mean_think_tokens=20)
    assert [again.reply(prompt, sampling) for _ in range(4)] == replies


def test_reply_cut_at_the_length_limit_and_batch_waits_for_its_longest(bench, tokenizer):
    llm = bench.SimulatedLLM(tokenizer, bench.Latency(base_ms=1, ms_per_token=0.01),
                             mean_think_tokens=50)
    prompts = [first_prompt(tokenizer, "tetrisType1Agent", seed) for seed in range(3)]
    cut = llm.reply(prompts[0], SamplingParams(max_new_tokens=3))
    assert len(cut) == 3 and cut[-1] != end_of_turn_ids(tokenizer)[0]
    replies = asyncio.run(llm.generate_batch([(p, SamplingParams()) for p in prompts]))
    longest = max(len(ids) for ids, _ in replies)
    assert llm.slept_s == pytest.approx((1 + 0.01 * longest) / 1000)
    assert all(len(ids) == len(logprobs) for ids, logprobs in replies)


def test_small_run_plays_the_same_episodes_both_ways(bench, tmp_path):
    out = tmp_path / "rollout.json"
    bench.main(["--groups", "3", "--group-size", "2", "--ms-per-token", "0.05",
                "--out", str(out)])
    result = json.loads(out.read_text())
    ours, barrier = result["ours"], result["barrier"]
    assert set(ours) == set(barrier) == MODE_KEYS
    assert result["same_episodes"] is True
    assert ours["episodes"] == barrier["episodes"] == 6
    assert ours["turns"] == barrier["turns"] >= 6
    assert ours["reply_tokens"] == barrier["reply_tokens"] > 0
    # The barrier waits for each turn's longest reply: its model time is never below ours.
    assert barrier["model_critical_path_s"] >= ours["model_critical_path_s"] > 0
    assert result["speedup"] == pytest.approx(barrier["wall_s"] / ours["wall_s"], rel=0.05)
    assert result["episode_turns"]["min"] >= 1
    assert result["embedded"] is None


def test_unknown_preset_is_named(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--presets", "noSuchAgent"])
    assert "noSuchAgent" in capsys.readouterr().err


def test_jump_forward_runs_both_modes_side_by_side(bench, tmp_path):
    """``--jump-forward`` on the tiny model: the same episodes' count both ways, fewer decode
    steps with jump-forward, and the reductions computed from the rows."""
    out = tmp_path / "jump.json"
    bench.main(["--jump-forward", "--jf-model", "tiny", "--groups", "1", "--group-size", "2",
                "--out", str(out)])
    result = json.loads(out.read_text())
    before, after = result["step_by_step"], result["jump_forward"]
    assert before["episodes"] == after["episodes"] == 2
    assert before["jumped_tokens"] == 0 < after["jumped_tokens"]
    assert after["decode_steps_per_episode"] < before["decode_steps_per_episode"]
    assert result["fewer_decode_steps"] == pytest.approx(
        1 - after["decode_steps_per_episode"] / before["decode_steps_per_episode"], abs=1e-3)
    assert len(result["load_average_1m"]) == 4
