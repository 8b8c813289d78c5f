"""Model reply -> actions: the answer format, checked without ever raising.

Formats (``separator`` is the preset's ``action_separator``, ``||`` by default)::

    <think>free reasoning</think><answer>Up || Left</answer>     tagged, enable_think=True
    <answer>Up || Left</answer>                                  tagged, enable_think=False
    Up || Left                                                   plain

``answer_format="tagged"`` (the default) is the format of GRL and RAGEN. ``"plain"`` is for a
model that cannot be expected to write tags (a tiny one trained from scratch on a one-word
task): the whole reply is the answer.

    >>> parse_response("<answer>Up || Left</answer>", enable_think=False, separator="||",
    ...                max_actions=5).actions
    ('Up', 'Left')
    >>> parse_response(" Up ", enable_think=False, separator="||", max_actions=5,
    ...                answer_format="plain").actions
    ('Up',)

Rules of the tagged format (what is *well-formed*, ``format_ok=True``):

- Tags are the four literal strings ``<think>``, ``</think>``, ``<answer>``, ``</answer>``, in
  any letter case (``<ANSWER>`` counts); variants such as ``< answer >`` are plain text.
- The tags present must be exactly ``<answer></answer>`` or ``<think></think><answer></answer>``,
  in that order: no missing, unclosed, duplicated or nested tag. With ``enable_think`` the think
  block is required; without it a think block before the answer is tolerated (thinking models
  emit one anyway) and returned in ``think``.
- Text outside the blocks (before, between, after) is ignored, as in GRL: a stray sentence is
  not worth a penalty, an ambiguous structure is.
- The answer splits on ``separator``; each piece is stripped and its inner whitespace collapsed
  to single spaces; empty pieces (``Up |||| Down``, a trailing separator) are skipped. No action
  left => not well-formed. More than ``max_actions`` => the first ``max_actions`` are kept, the
  rest are counted in ``dropped_actions``, and the reply is still well-formed.
- Newlines are not separators: ``Up\\nDown`` is one action (the game then finds it invalid).

Rules of the plain format: the whole reply is the answer block, split and cleaned by the same
rules (separator, spacing, empty pieces, ``max_actions``, newlines). No tag is needed, and tags
present are not read as tags: ``<answer>Up</answer>`` is the one action ``<answer>Up</answer>``
(which the game then finds invalid). An empty or blank reply is not well-formed. ``enable_think``
plays no part (a plain reply has no think block; ``think`` is always '').

Bounded work: input is cut to ``MAX_PARSE_CHARS`` first, and the only regex is a literal
alternation (linear time). Anything (``None``, bytes, an int) is accepted: non-text becomes its
text form or empty, so the parser never raises on a reply (only on an unknown
``answer_format``, which is the caller's bug).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_PARSE_CHARS = 16_384
"""Characters of a reply read; the rest is ignored (~4k tokens: past any sane max_response_tokens,
so only runaway replies are cut, and an answer after the cut counts as missing)."""

ANSWER_FORMATS = ("tagged", "plain")
"""``tagged``: ``<think>..</think><answer>..</answer>``; ``plain``: the whole reply is the
answer."""

_TAG = re.compile(r"<(/?)(think|answer)>", re.IGNORECASE)
_THINK_OPEN, _THINK_CLOSE, _ANSWER_OPEN, _ANSWER_CLOSE = (
    "<think>", "</think>", "<answer>", "</answer>",
)
_WELL_FORMED = (
    (_ANSWER_OPEN, _ANSWER_CLOSE),
    (_THINK_OPEN, _THINK_CLOSE, _ANSWER_OPEN, _ANSWER_CLOSE),
)


@dataclass(frozen=True)
class ParsedResponse:
    """What a reply says, and whether it followed the format."""

    think: str
    """Text of the think block, stripped ('' when there is none or the format is bad)."""
    actions: tuple[str, ...]
    """Actions to run, in order, at most ``max_actions``; empty when ``format_ok`` is False."""
    format_ok: bool
    """True when the reply follows the format and names at least one action."""
    dropped_actions: int
    """Actions past ``max_actions`` that were cut off (0 when the format is bad)."""
    error: str | None
    """Why the format is bad, in a few words (None when ``format_ok``)."""


def format_response(actions, *, separator: str = "||", think: str | None = None,
                    answer_format: str = "tagged") -> str:
    """The well-formed reply for ``actions`` (with a think block when ``think`` is not None).

    A plain reply is the actions alone and cannot carry a think block (ValueError)."""
    answer = f" {separator} ".join(actions)
    if _checked_format(answer_format) == "plain":
        if think is not None:
            raise ValueError("answer_format='plain' has no think block; pass think=None")
        return answer
    answer = f"<answer>{answer}</answer>"
    return answer if think is None else f"<think>{think}</think>{answer}"


def parse_response(text: Any, *, enable_think: bool, separator: str, max_actions: int,
                   answer_format: str = "tagged") -> ParsedResponse:
    """Parse a model reply by the module's rules; never raises on the reply.

    Args:
        text: the reply (anything: non-text is treated as its ``str`` form, ``None`` as empty).
        enable_think: whether a ``<think>`` block is required before the answer (tagged only).
        separator: the text between actions, e.g. ``"||"`` (empty: the answer is one action).
        max_actions: actions kept (>= 0); the rest are counted in ``dropped_actions``.
        answer_format: one of ``ANSWER_FORMATS``; another value is a caller's bug (ValueError).
    """
    plain = _checked_format(answer_format) == "plain"
    text = _as_text(text)[:MAX_PARSE_CHARS]
    if plain:
        return _split_answer(text, "", separator, max_actions, "empty reply: no action")
    tags = [(match.group(0).lower(), match.start(), match.end()) for match in _TAG.finditer(text)]
    names = tuple(name for name, _, _ in tags)
    error = _structure_error(names, enable_think)
    if error is not None:
        return _bad(error)
    think = text[tags[0][2]:tags[1][1]].strip() if len(tags) == 4 else ""
    answer = text[tags[-2][2]:tags[-1][1]]
    return _split_answer(answer, think, separator, max_actions, "empty <answer>: no action")


def format_progress(text: Any, *, enable_think: bool, answer_format: str = "tagged") -> float:
    """How far a reply got toward the tagged format, in [0, 1): the share of the format's tags
    (``<think></think><answer></answer>``, or the answer's two without ``enable_think``) found
    in order from the first, over one more than their number, so that no malformed reply
    reaches 1. A plain-format reply has no tags to grade (0). Never raises on the reply."""
    if _checked_format(answer_format) == "plain":
        return 0.0
    wanted = _WELL_FORMED[1] if enable_think else _WELL_FORMED[0]
    found = 0
    for match in _TAG.finditer(_as_text(text)[:MAX_PARSE_CHARS]):
        if found < len(wanted) and match.group(0).lower() == wanted[found]:
            found += 1
    return found / (len(wanted) + 1)


def _split_answer(answer: str, think: str, separator: str, max_actions: int,
                  empty_error: str) -> ParsedResponse:
    """The answer's actions: split on ``separator``, spacing collapsed, empty pieces skipped."""
    pieces = [" ".join(piece.split()) for piece in (answer.split(separator) if separator
                                                     else [answer])]
    actions = [piece for piece in pieces if piece]
    if not actions:
        return _bad(empty_error)
    keep = max(0, int(max_actions))
    return ParsedResponse(think=think, actions=tuple(actions[:keep]), format_ok=True,
                          dropped_actions=max(0, len(actions) - keep), error=None)


def _checked_format(answer_format: Any) -> str:
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format={answer_format!r} is not allowed; allowed: "
                         f"one of {list(ANSWER_FORMATS)}")
    return answer_format


def _structure_error(names: tuple[str, ...], enable_think: bool) -> str | None:
    """None when the tag sequence is well-formed, else a short reason."""
    if enable_think and names == _WELL_FORMED[0]:
        return "missing <think> block before <answer>"
    if names in _WELL_FORMED:
        return None
    answers_open, answers_close = names.count(_ANSWER_OPEN), names.count(_ANSWER_CLOSE)
    if answers_open == 0:
        return "no <answer> block"
    if answers_open > 1 or answers_close > 1:
        return "more than one <answer> tag"
    if answers_close == 0:
        return "unclosed <answer>"
    if names.count(_THINK_OPEN) > 1 or names.count(_THINK_CLOSE) > 1:
        return "more than one <think> tag"
    return "tags nested, unclosed or out of order"


def _bad(error: str) -> ParsedResponse:
    return ParsedResponse(think="", actions=(), format_ok=False, dropped_actions=0, error=error)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[: MAX_PARSE_CHARS * 4]).decode("utf-8", errors="replace")
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not crash a rollout
        return ""
