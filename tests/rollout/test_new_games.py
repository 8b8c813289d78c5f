"""BabyAI and TextWorldExpress episodes in concurrent agent groups (TextWorldExpress steps run in
worker threads, all talking to one shared Java process)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.agents import format_response, load_agent_presets
from agentrl.engines import SamplingParams
from agentrl.rollout import run_groups
from rollout_fakes import FakeLLM

PRESETS = load_agent_presets(check_envs=False)
ALWAYS_LEGAL = {"Mission:": "turn left", "Task:": "look around"}
"""An action each game accepts in every state, keyed by how its observation opens."""


@pytest.mark.slow  # ~10 s: 36 turns, Java start-up
def test_groups_of_both_games_play_every_turn_with_valid_actions(chatml_tokenizer):
    def reply(prompt_ids, call):
        prompt = chatml_tokenizer.decode(prompt_ids)
        action = next(a for marker, a in ALWAYS_LEGAL.items() if marker in prompt)
        return format_response([action], separator="||", think="go")

    presets = {name: PRESETS[name] for name in ("babyaiGoTo3Agent", "twxCookingAgent")}
    llm = FakeLLM(chatml_tokenizer, reply)
    trajectories = asyncio.run(run_groups(
        presets, llm, chatml_tokenizer, SamplingParams(greedy=True, max_new_tokens=64),
        group_num=2, group_size=3, seeds=[5, 6], max_context_tokens=16384))
    assert [t.preset for t in trajectories] == ["babyaiGoTo3Agent"] * 3 + ["twxCookingAgent"] * 3
    for t in trajectories:
        config = presets[t.preset]
        assert t.num_turns == config.max_turns and not t.success
        assert t.metrics["num_actions"] == t.metrics["num_valid"] == config.max_turns
    twx = [t for t in trajectories if t.preset == "twxCookingAgent"]
    assert len({tuple(t.prompt_ids) for t in twx}) == 1  # one seed per group: the same game
