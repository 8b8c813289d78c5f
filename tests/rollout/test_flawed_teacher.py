"""A flawed teacher (``sft.flawed_first_move``): each demonstration opens with a random legal
move that is learned, then the oracle plays on from the board that move left.

Seen failing first: with the opening flagged as a random turn (``choose_reply`` returning
``True`` for it, the ``random_action_share`` treatment), the opening's tokens get mask 0 and
the lost episodes are dropped, and ``test_the_opening_is_a_learned_random_legal_move`` fails.
"""

from __future__ import annotations

import asyncio

import pytest

from agentrl.agents import Agent, parse_response
from agentrl.config import build_config, compose_config
from agentrl.envs.splits import split_seeds
from agentrl.rollout.demonstrations import (
    DEMO_SEED_OFFSET, demonstration_chats, play_demonstrations,
)

PRESET = "tightBlocksworldTurnsAgent"  # the benchmark's default: one move a turn, 6 turns
SEEDS = split_seeds("train", 16, DEMO_SEED_OFFSET)


@pytest.fixture(scope="module")
def preset():
    config = compose_config([f"train.presets=[{PRESET}]", f"val.presets=[{PRESET}]"])
    return config.playing_presets([PRESET], config.rollout.max_new_tokens)[0]


def play(preset, tokenizer, flawed: bool, seed: int = 0):
    return asyncio.run(play_demonstrations(
        [preset], tokenizer, SEEDS, max_context_tokens=2048, max_new_tokens=32,
        flawed_first_move=flawed, seed=seed))


def moves(text: str, config) -> list[str]:
    return list(parse_response(text, enable_think=config.enable_think,
                               separator=config.action_separator, max_actions=8,
                               answer_format=config.answer_format).actions)


def test_the_opening_is_a_learned_random_legal_move(preset, chatml_tokenizer):
    name, config = preset
    flawed = play(preset, chatml_tokenizer, flawed=True)
    assert [t.seed for t in flawed] == SEEDS  # every flawed episode is kept, won or lost
    off_path = 0
    with Agent(config) as agent:
        for demo in flawed:
            agent.reset(seed=demo.seed)
            legal = agent.answer_grammar().actions
            oracle_opening = agent.oracle_response()
            opening = demo.turns[0]
            assert len(moves(opening.text, config)) == 1
            assert moves(opening.text, config)[0] in legal
            off_path += opening.text != oracle_opening
            # learned: the opening's reply tokens (its end-of-turn token too) carry the loss
            end = demo.turn_end_positions[0]
            start = end - len(opening.response_ids) + 1
            assert demo.response_mask[start:end + 1] == [1] * len(opening.response_ids)
            assert sum(demo.response_mask) == sum(len(t.response_ids) for t in demo.turns)
            # then the oracle, from the board the opening left
            agent.step(opening.text)
            for turn in demo.turns[1:]:
                assert turn.text == agent.oracle_response()
                agent.step(turn.text)
            assert agent.success == demo.success
    assert off_path >= len(SEEDS) // 4, "a uniform legal opening often leaves the oracle's path"


def test_the_clean_teacher_and_the_chat_text_agree(preset, chatml_tokenizer):
    """Off, the demonstrations are the oracle's; on, the chat form (verl's data path) plays the
    same opening as the token form for the same seeds."""
    name, config = preset
    clean = play(preset, chatml_tokenizer, flawed=False)
    with Agent(config) as agent:
        for demo in clean:
            agent.reset(seed=demo.seed)
            assert demo.turns[0].text == agent.oracle_response()
    for demo in play(preset, chatml_tokenizer, flawed=True, seed=3)[:4]:
        chats, used_random = demonstration_chats(config, demo.seed, flawed_first_move=True,
                                                 rng_seed=3)
        replies = [chat[-1]["content"] for chat in chats]
        assert not used_random and replies == [t.text for t in demo.turns]


def test_the_config_key_is_checked():
    assert compose_config(["sft.flawed_first_move=true"]).sft.flawed_first_move
    with pytest.raises(ValueError, match="sft.flawed_first_move='maybe' is not allowed"):
        compose_config(["sft.flawed_first_move=maybe"])
    with pytest.raises(ValueError, match="sft.flawed_first_move=true is not allowed with "
                                         "backend=verl"):
        build_config({"backend": "verl", "sft": {"flawed_first_move": True}})


def test_the_sft_key_reaches_the_warm_starts_demonstrations(chatml_tokenizer):
    """``sft.flawed_first_move`` in a config changes what ``agentrl sft`` and the in-run warm
    start train on (agentrl.trainers.imitation.oracle_demonstrations), and nothing else."""
    from agentrl.trainers.imitation import oracle_demonstrations

    def openings(flawed: bool) -> list[str]:
        config = compose_config([f"train.presets=[{PRESET}]", f"val.presets=[{PRESET}]",
                                 "sft.episodes=12", f"sft.flawed_first_move={flawed}"])
        loop = asyncio.new_event_loop()
        try:
            demos = oracle_demonstrations(config, chatml_tokenizer, loop)
        finally:
            loop.close()
        return [t.turns[0].text for t in demos]

    clean, flawed = openings(False), openings(True)
    assert len(clean) == len(flawed) == 12
    assert clean != flawed
