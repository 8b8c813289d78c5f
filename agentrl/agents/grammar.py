"""The replies a constrained engine may write this turn, as a character automaton.

    grammar = agent.answer_grammar()       # this turn's valid actions, in the preset's format
    states = grammar.start()
    states = grammar.run(states, "<answer>Up || Le")     # empty: not a prefix of a reply
    grammar.can_stop(grammar.run(grammar.start(), "<answer>Up</answer>"))   # True

A reply is, in characters (``||`` stands for the preset's separator)::

    tagged, enable_think:   <think> FREE </think><answer> ACTION ( || ACTION )* </answer>
    tagged, no thinking:    <answer> ACTION ( || ACTION )* </answer>
    plain:                  ACTION ( || ACTION )*

with at most ``max_actions`` actions, each one of ``actions`` (this turn's valid actions),
written as :func:`agentrl.agents.parsing.format_response` writes them (one space either side
of the separator). ``FREE`` is the thinking: any text without ``<`` (a ``<`` starts the
closing ``</think>``), so no stray tag can break the format. Every string of this language is
a well-formed reply for :func:`agentrl.agents.parsing.parse_response`.

Why characters and not tokens: a token may span an action's end and the separator (``Up``
``" ||"`` ``" Down"``), and the tokenizer merges across spaces, so a prefix tree of one
tokenization per action misses the tokens the model actually uses. The engine instead allows a
token when the reply's text so far plus the token's text is still a prefix of this language
(:mod:`agentrl.engines.constrained`). The automaton is nondeterministic (``take key`` may be
followed by the separator's space or by `` from box``), so a state is a frozenset of positions.

Pure Python, no model or tokenizer: the agent layer builds it, the engine reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

__all__ = ["AnswerGrammar", "THINK_CLOSE", "THINK_OPEN"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FREE_STOP = "<"
"""The one character the free thinking may not hold: it starts the closing tag."""

# NFA positions: ("lit", part, pos, count) | ("free",) | ("act", node, count) | ("end",)
_FREE = ("free",)
_END = ("end",)


@dataclass(frozen=True)
class AnswerGrammar:
    """This turn's well-formed replies (see the module docstring). Hashable: engines cache
    their token masks per grammar and state."""

    actions: tuple[str, ...]
    """The actions allowed in the answer (the game's ``valid_actions()`` this turn)."""
    separator: str = " || "
    """The text between two actions, spaces included."""
    max_actions: int = 1
    """Most actions in one answer."""
    opening: str = "<answer>"
    """Text that opens the answer ('' for the plain format)."""
    closing: str = "</answer>"
    """Text that closes it ('' for the plain format: the reply ends after an action)."""
    think: bool = False
    """The reply opens with ``<think>``, free thinking without ``<``, then ``</think>``."""
    _trie: tuple = field(init=False, repr=False, compare=False, hash=False, default=())

    def __post_init__(self) -> None:
        actions = tuple(dict.fromkeys(a for a in self.actions if a))
        if not actions:
            raise ValueError("an answer grammar needs at least one non-empty action")
        if self.max_actions < 1:
            raise ValueError(f"max_actions must be >= 1, got {self.max_actions}")
        object.__setattr__(self, "actions", actions)
        children: list[dict[str, int]] = [{}]
        terminal = [False]
        for action in actions:
            node = 0
            for char in action:
                nxt = children[node].get(char)
                if nxt is None:
                    nxt = children[node][char] = len(children)
                    children.append({})
                    terminal.append(False)
                node = nxt
            terminal[node] = True
        object.__setattr__(self, "_trie", (tuple(children), tuple(terminal)))

    # -- the automaton -----------------------------------------------------------------------------
    @cached_property
    def _parts(self) -> dict[str, str]:
        return {"head": THINK_OPEN if self.think else self.opening,
                "mid": THINK_CLOSE + self.opening, "sep": self.separator,
                "close": self.closing}

    def start(self) -> frozenset:
        """The state before the reply's first character."""
        return frozenset(self._enter("head", 0))

    def _enter(self, part: str, count: int) -> list[tuple]:
        """Positions at the start of literal ``part`` (skipping it when it is empty)."""
        if self._parts[part]:
            return [("lit", part, 0, count)]
        return self._after(part, count)

    def _after(self, part: str, count: int) -> list[tuple]:
        if part == "head":
            return [_FREE] if self.think else [("act", 0, 0)]
        if part in ("mid", "sep"):
            return [("act", 0, count)]
        return [_END]  # after the closing

    def _step_one(self, position: tuple, char: str) -> list[tuple]:
        kind = position[0]
        if kind == "free":
            return [("lit", "mid", 1, 0)] if char == FREE_STOP else [_FREE]
        if kind == "lit":
            _, part, pos, count = position
            text = self._parts[part]
            if text[pos] != char:
                return []
            if pos + 1 < len(text):
                return [("lit", part, pos + 1, count)]
            return self._after(part, count)
        if kind == "act":
            _, node, count = position
            children, terminal = self._trie
            out = []
            child = children[node].get(char)
            if child is not None:
                out.append(("act", child, count))
            if terminal[node]:
                if count + 1 < self.max_actions and self.separator[:1] == char:
                    out += self._step_one(("lit", "sep", 0, count + 1), char)
                if self.closing[:1] == char:
                    out += self._step_one(("lit", "close", 0, count), char)
            return out
        return []  # the end: nothing more

    def step(self, states: frozenset, char: str) -> frozenset:
        """The state after one more character (empty: no reply starts this way)."""
        return frozenset(p for position in states for p in self._step_one(position, char))

    def run(self, states: frozenset, text: str) -> frozenset:
        """The state after ``text`` (empty as soon as it leaves the language)."""
        for char in text:
            if not states:
                break
            states = self.step(states, char)
        return states

    def next_chars(self, states: frozenset) -> set[str] | None:
        """The characters that can come next; None in the free thinking (anything but ``<``)."""
        if _FREE in states:
            return None
        chars: set[str] = set()
        children, terminal = self._trie
        for position in states:
            if position[0] == "lit":
                chars.add(self._parts[position[1]][position[2]])
            elif position[0] == "act":
                _, node, count = position
                chars.update(children[node])
                if terminal[node]:
                    if count + 1 < self.max_actions and self.separator:
                        chars.add(self.separator[0])
                    if self.closing:
                        chars.add(self.closing[0])
        return chars

    def can_stop(self, states: frozenset) -> bool:
        """The reply may end here (the engine's end-of-turn token)."""
        if _END in states:
            return True
        _, terminal = self._trie
        return not self.closing and any(p[0] == "act" and terminal[p[1]] for p in states)

    def is_free(self, states: frozenset) -> bool:
        """Inside the free thinking."""
        return _FREE in states

    # -- endings (for the canonical tokenization) ---------------------------------------------------
    def endings(self, states: frozenset) -> list[str]:
        """Texts that finish a reply from ``states``, enough to decide the reply's next token in
        the tokenizer's own encoding: every action that can be written from here, each followed
        by the closing or by the separator and the shortest action (an action's last token may
        depend on what follows it; nothing further on does). Nothing from the free thinking;
        ``<think>``'s literal ends where the thinking starts."""
        out: set[str] = set()
        for position in states:
            kind = position[0]
            if kind == "end":
                out.add("")
            elif kind == "lit":
                _, part, pos, count = position
                rest = self._parts[part][pos:]
                if part == "close":
                    out.add(rest)
                elif part == "head" and self.think:
                    out.add(rest)
                else:
                    out.update(rest + action + tail for action in self.actions
                               for tail in self._tails(count))
            elif kind == "act":
                _, node, count = position
                out.update(action + tail for action in self._actions_from(node)
                           for tail in self._tails(count))
        return sorted(out)

    def _tails(self, count: int) -> list[str]:
        """What may follow the ``count``-th action (0-based): the closing, or one more action."""
        tails = [self.closing]
        if count + 1 < self.max_actions and self.separator:
            tails.append(self.separator + self._shortest_from_node[0] + self.closing)
        return tails

    def _actions_from(self, node: int) -> list[str]:
        """The rests of every action below trie ``node`` ('' when ``node`` ends one)."""
        children, terminal = self._trie
        rests = [""] if terminal[node] else []
        for char, child in children[node].items():
            rests += [char + rest for rest in self._actions_from(child)]
        return rests

    # -- shortest completions (for the token budget) -----------------------------------------------
    @cached_property
    def _shortest_from_node(self) -> tuple[str, ...]:
        """Per trie node, the shortest text that completes an action from it."""
        children, terminal = self._trie
        best: list[str | None] = [None] * len(children)

        def solve(node: int) -> str:
            if best[node] is None:
                options = [""] if terminal[node] else []
                options += [char + solve(child) for char, child in children[node].items()]
                best[node] = min(options, key=len)
            return best[node]

        for node in range(len(children)):
            solve(node)
        return tuple(best)

    def completion(self, states: frozenset, longest_action: bool = False) -> str | None:
        """The shortest text that finishes a reply from ``states`` (None when none does).
        ``longest_action``: from the free thinking, finish with the longest action instead
        (the budget reserved so the model can still pick any one action)."""
        action = (max(self.actions, key=len) if longest_action else self._shortest_from_node[0])
        options = []
        for position in states:
            kind = position[0]
            if kind == "end":
                options.append("")
            elif kind == "free":
                options.append(self._parts["mid"] + action + self.closing)
            elif kind == "lit":
                _, part, pos, _count = position
                rest = self._parts[part][pos:]
                if part == "close":
                    options.append(rest)
                else:
                    after = "" if part == "head" and self.think else self._shortest_from_node[0]
                    tail = (self._parts["mid"] + action if part == "head" and self.think
                            else after)
                    options.append(rest + tail + self.closing)
            else:
                options.append(self._shortest_from_node[position[1]] + self.closing)
        return min(options, key=len) if options else None
