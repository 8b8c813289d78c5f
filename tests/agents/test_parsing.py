"""The answer parser: golden cases, limits, round-trip, and hypothesis on arbitrary text."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.agents.parsing import MAX_PARSE_CHARS, format_response, parse_response


def parse(text, *, think=True, separator="||", max_actions=5):
    return parse_response(text, enable_think=think, separator=separator, max_actions=max_actions)


GOOD = [
    # (reply, enable_think, actions, think)
    ("<think>push right</think><answer>Right || Up</answer>", True, ("Right", "Up"), "push right"),
    ("<answer>Right || Up</answer>", False, ("Right", "Up"), ""),
    ("<THINK>x</Think><Answer>Left</ANSWER>", True, ("Left",), "x"),  # tag case is ignored
    ("Sure! <think>a</think>\nthen\n<answer>Up</answer> done.", True, ("Up",), "a"),  # outside text
    ("<think>a</think><answer>Up</answer>", False, ("Up",), "a"),  # think tolerated without think
    ("<think></think><answer>Up</answer>", True, ("Up",), ""),  # empty think is still a block
    ("<answer>Up||Down</answer>", False, ("Up", "Down"), ""),
    ("<answer>  Up  ||\n  Down ||</answer>", False, ("Up", "Down"), ""),  # spacing, trailing sep
    ("<answer>Up |||| Down</answer>", False, ("Up", "Down"), ""),  # empty pieces skipped
    ("<answer>move   2\tto 0 || take  key</answer>", False, ("move 2 to 0", "take key"), ""),
    ("<answer>Up\nDown</answer>", False, ("Up Down",), ""),  # a newline is no separator
    ("<answer>⬆️ || ünï</answer>", False, ("⬆️", "ünï"), ""),
    ("<answer>< answer > x</answer>", False, ("< answer > x",), ""),  # not a tag
]


@pytest.mark.parametrize("reply, think, actions, thought", GOOD)
def test_well_formed(reply, think, actions, thought):
    parsed = parse(reply, think=think)
    assert parsed.format_ok and parsed.error is None
    assert parsed.actions == actions
    assert parsed.think == thought
    assert parsed.dropped_actions == 0


BAD = [
    # (reply, enable_think, words in the error)
    ("Up || Down", True, "no <answer>"),
    ("", False, "no <answer>"),
    ("<answer>Up || Down", False, "unclosed"),
    ("<think>x</think><answer>Up", True, "unclosed"),
    ("<answer>Up</answer>", True, "missing <think>"),
    ("<answer>Up</answer><answer>Down</answer>", False, "more than one <answer>"),
    ("<answer><answer>Up</answer></answer>", False, "more than one <answer>"),
    ("<think>a</think><think>b</think><answer>Up</answer>", True, "more than one <think>"),
    ("<think>I will write <answer>Up</answer></think><answer>Up</answer>", True, "more than one"),
    ("<answer>Up</answer><think>late</think>", True, "out of order"),
    ("<answer><think>x</think>Up</answer>", False, "out of order"),
    ("<think>x<answer>Up</answer>", True, "out of order"),
    ("</answer>Up<answer>", False, "out of order"),
    ("<answer></answer>", False, "empty"),
    ("<answer> ||  || </answer>", False, "empty"),
    ("<think>x</think><answer>\n</answer>", True, "empty"),
]


@pytest.mark.parametrize("reply, think, words", BAD)
def test_badly_formed(reply, think, words):
    parsed = parse(reply, think=think)
    assert not parsed.format_ok
    assert words in parsed.error
    assert parsed.actions == () and parsed.dropped_actions == 0


def test_too_many_actions_keeps_the_first_and_counts_the_rest():
    parsed = parse("<answer>" + " || ".join(f"a{i}" for i in range(8)) + "</answer>",
                   think=False, max_actions=3)
    assert parsed.format_ok
    assert parsed.actions == ("a0", "a1", "a2")
    assert parsed.dropped_actions == 5


def test_other_separator():
    parsed = parse("<answer>Up; Down ;Left || Right</answer>", think=False, separator=";")
    assert parsed.actions == ("Up", "Down", "Left || Right")


@pytest.mark.parametrize("value", [None, 42, b"<answer>Up</answer>", object(), ["<answer>"]])
def test_non_text_never_raises(value):
    parsed = parse(value, think=False)
    assert parsed.format_ok == (value == b"<answer>Up</answer>")


def test_huge_input_is_cut_and_fast():
    start = time.perf_counter()
    for reply in ["<answer>" * 200_000, "<" * 1_000_000, "x" * 1_000_000 + "<answer>Up</answer>",
                  "<answer>" + " || " * 300_000 + "</answer>", "<think>" + "a" * 2_000_000]:
        parsed = parse(reply)
        assert not parsed.format_ok
    assert time.perf_counter() - start < 1.0
    late = "a" * MAX_PARSE_CHARS + "<answer>Up</answer>"  # the answer lies past the cut
    assert parse(late, think=False).error == "no <answer> block"


# -- hypothesis ------------------------------------------------------------------------------------
PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<ANSWER>", "</Think>", "Up",
          "move 1 to 0", "||", " || ", "|", " ", "\n", "<", ">", "/", "é", "🤖", "answer", "\x00"]
TAG_SOUP = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=400), TAG_SOUP), think=st.booleans(),
       max_actions=st.integers(0, 6), separator=st.sampled_from(["||", ";", ",", "|"]))
def test_any_text_never_raises_and_respects_limits(text, think, max_actions, separator):
    parsed = parse(text, think=think, separator=separator, max_actions=max_actions)
    assert len(parsed.actions) <= max_actions
    assert parsed.dropped_actions >= 0
    assert (parsed.error is None) == parsed.format_ok
    if not parsed.format_ok:
        assert parsed.actions == () and parsed.dropped_actions == 0 and parsed.think == ""
    for action in parsed.actions:
        assert action and action == " ".join(action.split())
        assert separator not in action and "<answer>" not in action.lower()


ACTION = (st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
          .map(lambda s: " ".join(s.split()))
          .filter(lambda s: s and "|" not in s and "<" not in s))


@settings(max_examples=200, deadline=None)
@given(actions=st.lists(ACTION, min_size=1, max_size=8), think=st.booleans(),
       thought=st.text(max_size=50).filter(lambda s: "<" not in s))
def test_round_trip(actions, think, thought):
    reply = format_response(actions, separator="||", think=thought if think else None)
    parsed = parse(reply, think=think, max_actions=5)
    assert parsed.format_ok
    assert parsed.actions == tuple(actions[:5])
    assert parsed.dropped_actions == max(0, len(actions) - 5)
    assert parsed.think == (thought.strip() if think else "")


# -- plain answers ---------------------------------------------------------------------------------
def parse_plain(text, *, separator="||", max_actions=5, think=False):
    return parse_response(text, enable_think=think, separator=separator, max_actions=max_actions,
                          answer_format="plain")


PLAIN_GOOD = [
    # (reply, actions)
    ("A", ("A",)),
    ("  the \n", ("the",)),
    ("Up || Left", ("Up", "Left")),
    ("Up |||| Left ||", ("Up", "Left")),
    ("move   2\tto 0", ("move 2 to 0",)),
    ("Up\nDown", ("Up Down",)),
    ("<answer>Up</answer>", ("<answer>Up</answer>",)),  # tags are only text here
    ("<think>x</think> B", ("<think>x</think> B",)),
]


@pytest.mark.parametrize("reply, actions", PLAIN_GOOD)
@pytest.mark.parametrize("think", [False, True])  # enable_think plays no part
def test_plain_reply_is_the_answer(reply, actions, think):
    parsed = parse_plain(reply, think=think)
    assert parsed.format_ok and parsed.error is None
    assert parsed.actions == actions and parsed.think == "" and parsed.dropped_actions == 0


@pytest.mark.parametrize("reply", ["", "   ", "\n\t", " || || ", None])
def test_empty_plain_reply_is_a_format_error(reply):
    parsed = parse_plain(reply)
    assert not parsed.format_ok and parsed.actions == ()
    assert parsed.error == "empty reply: no action"


def test_plain_keeps_max_actions_and_counts_the_rest():
    parsed = parse_plain("a; b; c; d", separator=";", max_actions=1)
    assert parsed.actions == ("a",) and parsed.dropped_actions == 3


def test_unknown_answer_format_is_a_caller_error():
    with pytest.raises(ValueError, match=r"answer_format='xml'.*\['tagged', 'plain'\]"):
        parse_response("A", enable_think=False, separator="||", max_actions=1,
                       answer_format="xml")
    with pytest.raises(ValueError, match="answer_format"):
        format_response(["A"], answer_format="xml")
    with pytest.raises(ValueError, match="think"):
        format_response(["A"], think="x", answer_format="plain")


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=400), TAG_SOUP), think=st.booleans(),
       max_actions=st.integers(0, 6), separator=st.sampled_from(["||", ";", ",", "|"]))
def test_plain_never_raises_and_takes_the_whole_text(text, think, max_actions, separator):
    parsed = parse_plain(text, think=think, separator=separator, max_actions=max_actions)
    pieces = [" ".join(piece.split()) for piece in text.split(separator)]
    expected = [piece for piece in pieces if piece]
    assert parsed.format_ok == bool(expected)
    assert parsed.actions == tuple(expected[:max_actions])
    assert parsed.dropped_actions == (max(0, len(expected) - max_actions) if expected else 0)
    assert parsed.think == ""


@settings(max_examples=200, deadline=None)
@given(actions=st.lists(ACTION, min_size=1, max_size=8))
def test_plain_round_trip(actions):
    parsed = parse_plain(format_response(actions, separator="||", answer_format="plain"))
    assert parsed.format_ok and parsed.actions == tuple(actions[:5])


@pytest.mark.parametrize("reply, think, progress", [
    ("no tags at all", True, 0.0),
    ("I would write <think> then stop", True, 1 / 5),
    ("<think>a</think> and no answer", True, 2 / 5),
    ("<think>a</think><answer>", True, 3 / 5),
    ("<think>a</think><answer></answer>", True, 4 / 5),   # all tags, empty answer: still < 1
    ("<answer>Up", True, 0.0),                            # the think block comes first
    ("<answer>Up", False, 1 / 3),
    ("</answer><answer>", False, 1 / 3),                  # order counts
    ("<ANSWER></answer>", False, 2 / 3),
])
def test_format_progress_counts_the_formats_tags_in_order(reply, think, progress):
    from agentrl.agents.parsing import format_progress

    assert format_progress(reply, enable_think=think) == pytest.approx(progress)


@given(st.one_of(st.text(max_size=300), st.none(), st.integers(), st.binary(max_size=50)))
@settings(max_examples=200, deadline=None)
def test_format_progress_stays_below_one_on_anything(value):
    from agentrl.agents.parsing import format_progress

    for think in (True, False):
        assert 0.0 <= format_progress(value, enable_think=think) < 1.0
    assert format_progress(value, enable_think=False, answer_format="plain") == 0.0
