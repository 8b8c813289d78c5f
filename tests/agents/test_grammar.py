"""The answer grammar: exactly the well-formed replies of the turn's valid actions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.agents import Agent, format_response, load_agent_presets, parse_response
from agentrl.agents.grammar import AnswerGrammar

ACTIONS = ("take key", "take key from box", "open box", "go east")
TAGGED = AnswerGrammar(actions=ACTIONS, max_actions=3)
THINK = AnswerGrammar(actions=ACTIONS, max_actions=3, think=True)
PLAIN = AnswerGrammar(actions=ACTIONS, max_actions=2, opening="", closing="")


def accepts(grammar: AnswerGrammar, text: str) -> bool:
    return grammar.can_stop(grammar.run(grammar.start(), text))


@given(st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=3))
def test_every_formatted_reply_is_accepted(actions):
    assert accepts(TAGGED, format_response(actions))
    assert accepts(THINK, format_response(actions, think="free text, no tags"))
    if len(actions) <= 2:
        assert accepts(PLAIN, format_response(actions, answer_format="plain"))


@pytest.mark.parametrize("grammar, text", [
    (TAGGED, "<answer>take key || take key || open box || go east</answer>"),  # 4 > max 3
    (TAGGED, "<answer>jump</answer>"),                        # not an action
    (TAGGED, "<answer>take</answer>"),                        # an action's prefix only
    (TAGGED, "<answer>take key||open box</answer>"),          # not the separator's spacing
    (TAGGED, "<answer>take key</answer> trailing"),           # text after the end
    (TAGGED, "take key"),                                     # no tags
    (THINK, "<answer>take key</answer>"),                     # the think block is required
    (THINK, "<think>a <b> c</think><answer>open box</answer>"),  # '<' inside the thinking
    (PLAIN, "<answer>go east</answer>"),
    (PLAIN, ""),
])
def test_malformed_or_invalid_replies_are_refused(grammar, text):
    assert not accepts(grammar, text)


def test_prefixes_and_nondeterminism():
    """'take key' may end an action or go on (' from box'): both stay open after the space."""
    states = TAGGED.run(TAGGED.start(), "<answer>take key ")
    assert states and {"f", "|"} <= TAGGED.next_chars(states)
    assert TAGGED.is_free(THINK.run(THINK.start(), "<think>anything at all"))
    assert THINK.next_chars(THINK.run(THINK.start(), "<think>x")) is None


def test_random_walks_end_in_replies_the_parser_accepts():
    """Any walk that follows next_chars until it may stop is a well-formed reply of valid
    actions, for the parser the agent uses."""
    rng = random.Random(0)
    for grammar, think, fmt in ((TAGGED, False, "tagged"), (THINK, True, "tagged"),
                                (PLAIN, False, "plain")):
        for _ in range(200):
            text, states = "", grammar.start()
            while not (grammar.can_stop(states) and rng.random() < 0.3):
                chars = grammar.next_chars(states)
                if chars is None:  # free thinking: a few letters, then the closing '<'
                    chars = {"<"} if rng.random() < 0.2 else {"a", " ", "z"}
                if not chars:
                    break
                char = rng.choice(sorted(chars))
                text, states = text + char, grammar.step(states, char)
            parsed = parse_response(text, enable_think=think, separator="||",
                                    max_actions=grammar.max_actions, answer_format=fmt)
            assert parsed.format_ok and set(parsed.actions) <= set(ACTIONS), text
            assert parsed.dropped_actions == 0


def test_completion_is_the_shortest_way_to_finish():
    assert TAGGED.completion(TAGGED.start()) == "<answer>go east</answer>"
    assert TAGGED.completion(TAGGED.run(TAGGED.start(), "<answer>take key fr")) == (
        "om box</answer>")
    assert THINK.completion(THINK.run(THINK.start(), "<think>hm"), longest_action=True) == (
        "</think><answer>take key from box</answer>")


def test_the_agent_builds_the_turns_grammar():
    config = load_agent_presets()["blocksworldTextAgent"]
    with Agent(config) as agent:
        agent.reset(seed=1)
        grammar = agent.answer_grammar()
        assert set(grammar.actions) == set(agent.env.unwrapped.valid_actions())
        assert grammar.think == config.enable_think
        assert grammar.max_actions == min(config.max_actions_per_turn,
                                          config.max_actions_all_turns)
        assert grammar.separator == f" {config.action_separator} "
