"""``context: state`` through the rollout: each turn is generated from its own chat and trained
as its own row, on the rollout, the warm start's demonstrations and the batch alike."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agentrl.agents import Agent, load_agent_presets
from agentrl.engines import SamplingParams
from agentrl.rollout import run_episode, to_batch
from agentrl.rollout.batch import context_samples
from agentrl.rollout.demonstrations import (demonstration_chats, demonstration_messages,
                                             play_demonstrations)
from agentrl.rollout.episode import first_prompt_ids

from rollout_fakes import FakeLLM

PRESETS = load_agent_presets()
DEFAULT = PRESETS["tightBlocksworldTurnsAgent"]  # context: state
SAMPLING = SamplingParams(max_new_tokens=64)


def turn_chats(config, seed: int, replies: list[str]) -> list[list[dict]]:
    """The chat a plain Agent shows before each of ``replies``."""
    chats = []
    with Agent(config) as agent:
        chat = agent.reset(seed=seed)
        for reply in replies:
            chats.append(chat)
            result = agent.step(reply)
            chat = Agent.next_chat(chat, reply, result)
    return chats


def oracle_llm(tokenizer, config, seed):
    replies: list[str] = []

    def reply(ids, call):
        with Agent(config) as probe:
            probe.reset(seed=seed)
            for past in replies:
                probe.step(past)
            replies.append(probe.oracle_response())
        return replies[-1]

    return FakeLLM(tokenizer, reply), replies


def test_each_turn_is_generated_from_its_own_chat_and_trained_as_its_own_row(chatml_tokenizer):
    tok = chatml_tokenizer
    llm, replies = oracle_llm(tok, DEFAULT, 3)
    with Agent(DEFAULT) as agent:
        traj = asyncio.run(run_episode(agent, 3, llm, tok, SAMPLING, max_context_tokens=8192))
    assert traj.success and traj.num_turns >= 2
    chats = turn_chats(DEFAULT, 3, replies)
    assert llm.calls == [first_prompt_ids(tok, chat) for chat in chats]  # the Agent's chats
    assert [t.fresh_context for t in traj.turns] == [False] + [True] * (traj.num_turns - 1)
    rows = context_samples(traj)
    assert len(rows) == traj.num_turns
    for k, (row, call, output) in enumerate(zip(rows, llm.calls, llm.outputs)):
        assert row.prompt_ids == call == traj.turn_context(k)
        assert row.response_ids == output and all(row.response_mask)
        text = tok.decode(row.prompt_ids)
        assert not any(earlier in text for earlier in replies[:k])  # no earlier reply
        assert text.count("<|im_start|>user") == 1
        assert f"Turns left: {DEFAULT.max_turns - k}." in text
    assert sum(sum(row.response_mask) for row in rows) == sum(traj.response_mask)
    batch = to_batch([traj], pad_token_id=0, reward_placement="turn")
    assert batch["responses"].shape[0] == traj.num_turns
    assert batch["token_level_rewards"].sum().item() == traj.episode_return


def test_the_warm_starts_demonstrations_have_the_rollouts_rows(chatml_tokenizer):
    tok = chatml_tokenizer
    [demo] = asyncio.run(play_demonstrations([("p", DEFAULT)], tok, [3],
                                             max_context_tokens=8192, max_new_tokens=64))
    llm, replies = oracle_llm(tok, DEFAULT, 3)
    with Agent(DEFAULT) as agent:
        played = asyncio.run(run_episode(agent, 3, llm, tok, SAMPLING, max_context_tokens=8192))
    assert [t.text for t in demo.turns] == replies
    assert ([s.prompt_ids for s in context_samples(demo)]
            == [s.prompt_ids for s in context_samples(played)])


def test_the_context_budget_counts_a_turns_own_chat_only(chatml_tokenizer):
    """A budget that holds the longest turn's chat and a reply plays the whole episode: the
    first prompt is not part of a later turn's context. One token less ends it where that
    chat does not fit, without a dangling chat."""
    tok = chatml_tokenizer
    llm, _ = oracle_llm(tok, DEFAULT, 3)
    with Agent(DEFAULT) as agent:
        full = asyncio.run(run_episode(agent, 3, llm, tok, SAMPLING, max_context_tokens=8192))
    budget = max(map(len, llm.calls)) + SAMPLING.max_new_tokens
    assert budget < len(full.prompt_ids) + len(full.response_ids)  # the episode would not fit
    llm, _ = oracle_llm(tok, DEFAULT, 3)
    with Agent(DEFAULT) as agent:
        fits = asyncio.run(run_episode(agent, 3, llm, tok, SAMPLING, max_context_tokens=budget))
    assert fits.response_ids == full.response_ids and fits.metrics["context_exhausted"] == 0
    longest = max(range(len(llm.calls)), key=lambda k: len(llm.calls[k]))
    llm, _ = oracle_llm(tok, DEFAULT, 3)
    with Agent(DEFAULT) as agent:
        if longest == 0:  # the first chat must fit
            return
        cut = asyncio.run(run_episode(agent, 3, llm, tok, SAMPLING,
                                      max_context_tokens=budget - 1))
    assert cut.metrics["context_exhausted"] == 1 and cut.num_turns == longest
    assert cut.response_ids == full.response_ids[:full.turn_end_positions[longest - 1] + 1]


def test_verls_sft_demonstrations_are_one_chat_a_turn_as_the_rollout_shows_them():
    """verl's SFT rows (``agentrl.verl.sft``) of a ``context: state`` preset: each turn's own
    chat and its reply, the chats the rollout generates from; never one chat with every
    turn's opening appended (a system message mid-chat, trained on every earlier reply)."""
    chats, used_random = demonstration_chats(DEFAULT, 3)
    replies = [chat[-1]["content"] for chat in chats]
    assert not used_random and len(chats) >= 2
    assert [chat[:-1] for chat in chats] == turn_chats(DEFAULT, 3, replies)
    assert all([m["role"] for m in chat] == ["system", "user", "assistant"] for chat in chats)
    with pytest.raises(ValueError, match="context='state' makes a chat a turn"):
        demonstration_messages(DEFAULT, 3)
    history = dataclasses.replace(DEFAULT, context="history")
    [whole], _ = demonstration_chats(history, 3)
    assert demonstration_messages(history, 3)[0] == whole
    assert [m["role"] for m in whole].count("system") == 1
