"""Only real choices are sampled: under constrained decoding the fixed text of an answer is
forced in the tokenizer's own encoding (the ids the warm start's demonstrations use), so a
reply samples only where replies differ: which action, and whether another follows."""

from __future__ import annotations

import dataclasses
import random

import pytest

from agentrl.agents import Agent, load_agent_presets
from agentrl.agents.grammar import AnswerGrammar
from agentrl.engines.constrained import RowConstraint, TokenTexts
from agentrl.models.loading import load_tokenizer
from agentrl.rollout.demonstrations import scripted_reply_ids

PRESETS = load_agent_presets()
EXHAUSTIVE_ACTIONS = 2
"""Actions a reply holds at most in the exhaustive check (n + n^2 replies to encode)."""


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded")


@pytest.fixture(scope="module")
def end_of_turn(tokenizer):
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def every_reply(grammar: AnswerGrammar) -> list[str]:
    """Every reply of an answer-only grammar, written out."""
    replies, answers = [], [[a] for a in grammar.actions]
    for _ in range(grammar.max_actions):
        replies += [grammar.opening + grammar.separator.join(answer) + grammar.closing
                    for answer in answers]
        answers = [answer + [a] for answer in answers for a in grammar.actions]
    return replies


def branch_points(encodings: list[list[int]], path: list[int]) -> int:
    """Positions along ``path`` where the encodings that agree with it so far go on with more
    than one distinct next id: the reply's real choices, found without the constraint."""
    count = 0
    for length in range(len(path)):
        following = {ids[length] for ids in encodings if ids[:length] == path[:length]}
        count += len(following) > 1
    return count


def decode(grammar, texts, end_of_turn, choose, limit: int = 96) -> tuple[list[int], int]:
    """A reply decoded by ``choose(allowed ids)`` under the constraint; also how many of its
    positions offered a choice."""
    row, ids, choices = RowConstraint(grammar, texts, {end_of_turn}), [], 0
    for left in range(limit, 0, -1):
        mask = row.mask(left)
        assert mask.allow, "an answer-only reply has no free text"
        choices += len(mask.ids) > 1
        token = choose(list(mask.ids))
        ids.append(token)
        if token == end_of_turn:
            return ids, choices
        row.advance(token)
    raise AssertionError("the reply did not end within its budget")


def preset_grammar(name: str) -> AnswerGrammar:
    with Agent(PRESETS[name]) as agent:
        agent.reset(seed=3)
        grammar = agent.answer_grammar()
    return dataclasses.replace(grammar, think=False,
                               max_actions=min(grammar.max_actions, EXHAUSTIVE_ACTIONS))


GAMES = sorted({PRESETS[name].game: name for name in sorted(PRESETS)}.values())


@pytest.mark.parametrize("name", GAMES)
def test_a_reply_samples_only_where_replies_differ(name, tokenizer, end_of_turn):
    """On one preset of every game (its turn's actions and format): every reply decoded under
    the constraint is the tokenizer's encoding of its text, and it offers a choice exactly at
    the branch points of the encodings of every well-formed reply."""
    grammar = preset_grammar(name)
    texts = TokenTexts.of(tokenizer)
    encodings = [list(tokenizer.encode(reply, add_special_tokens=False)) + [end_of_turn]
                 for reply in every_reply(grammar)]
    rng = random.Random(0)
    for _ in range(12):
        ids, choices = decode(grammar, texts, end_of_turn, rng.choice)
        text = tokenizer.decode(ids[:-1])
        assert list(tokenizer.encode(text, add_special_tokens=False)) == ids[:-1], text
        assert ids in encodings, text
        assert choices == branch_points(encodings, ids), text


def test_a_one_move_blocksworld_reply_samples_the_block_and_the_target(tokenizer, end_of_turn):
    """The default preset's reply: ``<answer>move B to A</answer>`` is 11 tokens and 2 choices
    where two blocks can move and each has two targets (before: 7 positions, 5 of them
    spellings of fixed text)."""
    grammar = AnswerGrammar(actions=("move A to B", "move A to table", "move B to A",
                                     "move B to table"))
    ids, choices = decode(grammar, TokenTexts.of(tokenizer), end_of_turn, lambda ids: ids[-1])
    assert choices == 2
    assert tokenizer.decode(ids[:-1]) in {f"<answer>{a}</answer>" for a in grammar.actions}


def test_the_warm_starts_demonstrations_are_on_the_constrained_path(tokenizer, end_of_turn):
    """Each oracle reply's ids (as the warm start trains them) are allowed at every position,
    and every position the constraint forces holds the demonstration's own id."""
    texts = TokenTexts.of(tokenizer)
    for name in ("tightBlocksworldTurnsAgent", "tightSokobanAgent", "quickSokobanAgent"):
        with Agent(PRESETS[name]) as agent:
            agent.reset(seed=5)
            grammar = agent.answer_grammar()
            reply = agent.oracle_response()
        demonstration = scripted_reply_ids(reply, tokenizer, 96, end_of_turn)
        row = RowConstraint(grammar, texts, {end_of_turn})
        for step, token in enumerate(demonstration):
            mask = row.mask(96 - step)
            assert token in mask.ids, (name, reply, step)
            row.advance(token)


def test_the_thinking_closes_into_the_canonical_answer(tokenizer, end_of_turn):
    """With thinking on: ``<think>`` is forced in its encoding, the thinking is free, and once a
    token closes it the rest of the fixed text is forced as the tokenizer writes it."""
    grammar = AnswerGrammar(actions=("Up", "Down"), think=True)
    texts = TokenTexts.of(tokenizer)
    row = RowConstraint(grammar, texts, {end_of_turn})
    head = list(tokenizer.encode("<think>", add_special_tokens=False))
    for token in head:
        mask = row.mask(64)
        assert mask.allow and mask.ids == (token,)
        row.advance(token)
    for token in tokenizer.encode(" go up", add_special_tokens=False):
        assert not row.mask(64).allow and token not in row.mask(64).ids  # free thinking
        row.advance(token)
    close = tokenizer.convert_tokens_to_ids("</")
    assert close in row.mask(64).ids or not row.mask(64).allow
    row.advance(close)
    rest = list(tokenizer.encode("think><answer>", add_special_tokens=False))
    for token in rest:
        mask = row.mask(64)
        assert mask.allow and mask.ids == (token,)
        row.advance(token)
    assert set(row.mask(64).ids) == {tokenizer.encode("Up", add_special_tokens=False)[0],
                                     tokenizer.encode("Down", add_special_tokens=False)[0]}
