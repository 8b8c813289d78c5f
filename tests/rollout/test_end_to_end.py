"""run_groups end to end: every preset with a scripted LLM, and the tiny model via BatchingLLM."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.agents import load_agent_presets
from agentrl.engines import BatchingLLM, SamplingParams
from agentrl.models import load_model
from agentrl.rollout import rollout_metrics, run_groups, to_batch

from rollout_fakes import FakeLLM, game_reply

PRESETS = load_agent_presets()


def test_every_preset_runs_in_groups(chatml_tokenizer):
    """One group of 2 per preset, all concurrent; members share the game; batch + metrics work."""
    tok = chatml_tokenizer
    def reply(prompt_ids, call):
        return game_reply(_game_of(tok.decode(prompt_ids)))

    llm = FakeLLM(tok, reply)
    trajs = asyncio.run(run_groups(PRESETS, llm, tok, SamplingParams(max_new_tokens=48),
                                   group_num=len(PRESETS), group_size=2,
                                   max_context_tokens=16384))
    assert [t.preset for t in trajs] == [n for n in PRESETS for _ in range(2)]
    for a, b in zip(trajs[::2], trajs[1::2]):
        assert a.seed == b.seed and a.group_index == b.group_index
        assert a.prompt_ids == b.prompt_ids  # the same game in one group
        assert a.num_turns >= 1 and sum(a.response_mask) > 0
    batch = to_batch(trajs, pad_token_id=tok.pad_token_id)
    # one row an episode, more where a history window dropped turns or each turn is a fresh
    # chat (one row per window)
    windowed = {i for i, t in enumerate(trajs) if PRESETS[t.preset].windowed}
    rows = batch["episode_index"].tolist()
    assert sorted(set(rows)) == list(range(len(trajs)))
    assert all(rows.count(i) == 1 for i in range(len(trajs)) if i not in windowed)
    assert any(rows.count(i) > 1 for i in windowed)
    assert batch["token_level_rewards"].sum().item() == pytest.approx(
        sum(t.episode_return for t in trajs), abs=1e-4)
    metrics = rollout_metrics(trajs, split="train")
    for name in PRESETS:
        for key in ("success", "return", "turns", "num_actions", "action_is_valid",
                    "action_is_effective", "format_error", "response_length", "truncated_turns"):
            assert f"train/{name}/{key}" in metrics
        assert metrics[f"train/{name}/format_error"] == 0.0  # the scripted replies are well formed


def _game_of(prompt_text: str) -> str:
    """Which game a prompt is about, from words in its rules (for the scripted reply)."""
    for game, word in (("Sokoban", "Room:"), ("Tetris", "Board:"),
                       ("BlocksWorld", "Current state"), ("TextWorld", "Admissible")):
        if word in prompt_text:
            return game
    return "Sokoban"


@pytest.mark.parametrize("name", ["tiny", "tiny-llama3"])
def test_tiny_model_through_batching_llm(name):
    """Real sampling: the engine saw exactly the stored ids (checked by wrapping generate)."""
    model, tok = load_model(name)
    engine = BatchingLLM(model, tok, max_batch=8, seed=0)
    seen: list[tuple[list[int], list[int]]] = []

    class Recording:
        async def generate(self, prompt_ids, sampling):
            ids, lps = await engine.generate(prompt_ids, sampling)
            seen.append((list(prompt_ids), list(ids)))
            return ids, lps

    config = PRESETS["simpleSokobanAgent"]
    try:
        trajs = asyncio.run(run_groups({"simpleSokobanAgent": config}, Recording(), tok,
                                       SamplingParams(temperature=1.0, max_new_tokens=8),
                                       group_num=2, group_size=2, max_context_tokens=4096))
    finally:
        engine.close()
    assert len(trajs) == 4
    for t in trajs:
        full = t.input_ids
        calls = [(p, ids) for p, ids in seen if full[: len(p)] == p
                 and full[len(p): len(p) + len(ids)] == ids]
        assert len(calls) >= t.num_turns
        assert sum(t.response_mask) == sum(len(r) for r in (tu.response_ids for tu in t.turns))
        assert len(t.response_logprobs) == len(t.response_ids)
        assert all(lp <= 0 for lp in t.response_logprobs)
        # 8 tokens cannot hold a well-formed answer: every turn is cut and closed (mask 0)
        assert t.metrics["truncated_turns"] == sum(tu.truncated_by_length for tu in t.turns)
