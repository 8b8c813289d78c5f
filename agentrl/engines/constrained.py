"""Constrained decoding: a reply grammar's next characters -> the token ids allowed next.

    texts = TokenTexts.of(tokenizer)                    # once per tokenizer (~0.5 s, cached)
    row = RowConstraint(agent.answer_grammar(), texts, stop_ids={2}, max_new_tokens=48)
    mask = row.mask(tokens_left=48)                     # a TokenMask: allowed (or banned) ids
    row.advance(token_id)                               # after the token is chosen

The grammar (:class:`agentrl.agents.grammar.AnswerGrammar`, read by duck typing) is a
character automaton. A token is allowed when the reply's text so far plus the token's text is
still a prefix of a well-formed reply, found by walking the grammar's next characters and the
set of every token text's prefixes together (a depth-first search that stops where no token
text continues): no tokenization of the actions is assumed, so BPE merges across spaces and
across an action's end are all found. The end-of-turn tokens are allowed once the reply is
complete, and only then.

- **Free thinking** is one cached mask: every token but the stop tokens, special tokens, the
  few whose text has a ``<`` that does not continue ``</think>``, and the ids past the
  tokenizer's where the model's logits are wider (Qwen2.5: 151,936 logits, 151,665 tokens):
  those have no text, so they are never sampled, and :meth:`RowConstraint.advance` reads them
  as no text rather than failing.
- **Only real choices**: outside the thinking, the allowed tokens are the next tokens of the
  tokenizer's own encodings of the replies that continue the region's tokens
  (:meth:`AnswerGrammar.endings`): fixed text is forced as the warm start's demonstrations spell
  it, and a reply samples only where replies differ. The character search stands in where no
  encoding continues the reply.
- **End of the reply**: ``stop_ids`` are the tokens that end it once it is complete; the engine
  passes only the chat template's end-of-turn token there (not every end-of-sequence id), so a
  constrained reply always closes the turn the next observation follows.
- **Token budget**: the engine passes the tokens a row has left. A choice is allowed only if
  the shortest rest of a reply still fits after it (measured as the tokenizer's own encoding of
  that rest, plus the end-of-turn token): the thinking closes in time and the separator is
  refused when a further action would not fit. So a reply never runs out of tokens mid-answer.
- **Cost**: masks are cached per (grammar, state) on the tokenizer's :class:`TokenTexts`; the
  members of a group share a grammar, so most steps are a dictionary look-up.

The engine renormalizes over the allowed tokens (the masked logits' softmax) and returns each
token's mask, so the trainer can recompute the same distribution (docs/TRAINING.md,
"Constrained action decoding").
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

__all__ = ["Generation", "RowConstraint", "TokenMask", "TokenTexts", "apply_masks"]

MAX_CACHED_MASKS = 200_000
"""Masks kept per tokenizer before the cache is emptied (a long run meets many games)."""


@dataclass(frozen=True, eq=False)
class TokenMask:
    """Which tokens one decoding step could choose: only ``ids`` (``allow``) or all but them."""

    ids: tuple[int, ...]
    allow: bool

    @cached_property
    def index(self) -> torch.Tensor:
        return torch.tensor(self.ids, dtype=torch.long)


class Generation(tuple):
    """``(response_ids, logprobs)`` as every engine returns them, plus ``token_masks``: one
    :class:`TokenMask` per response token when the request was constrained (None otherwise),
    and ``features``: the last hidden state before each token ``[tokens, hidden]`` when the
    request asked for them (``SamplingParams.return_features``; None otherwise)."""

    token_masks: tuple[TokenMask | None, ...] | None
    features: torch.Tensor | None

    def __new__(cls, ids: list[int], logprobs: list[float],
                token_masks: Iterable[TokenMask | None] | None = None,
                features: torch.Tensor | None = None):
        self = super().__new__(cls, (ids, logprobs))
        self.token_masks = None if token_masks is None else tuple(token_masks)
        self.features = features
        return self


@dataclass(eq=False)
class TokenTexts:
    """A tokenizer's token texts, indexed for the search (built once per tokenizer)."""

    texts: list[str]
    special: frozenset[int]
    by_text: dict[str, list[int]] = field(init=False)
    prefixes: set[str] = field(init=False)
    sorted_texts: list[tuple[str, int]] = field(init=False)
    angle_tokens: list[int] = field(init=False)
    unusable: frozenset[int] = field(init=False)
    """Special tokens and tokens with no text or a broken character: never in an answer."""
    _encode: Any = None
    _masks: dict = field(default_factory=dict)
    _encodings: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.by_text, self.prefixes, self.angle_tokens = {}, set(), []
        unusable = set(self.special)
        for token, text in enumerate(self.texts):
            if token in self.special or not text or "\ufffd" in text:
                unusable.add(token)
                continue
            self.by_text.setdefault(text, []).append(token)
            self.prefixes.update(text[:k] for k in range(1, len(text) + 1))
            if "<" in text:
                self.angle_tokens.append(token)
        self.unusable = frozenset(unusable)
        self.sorted_texts = sorted((text, token) for text, tokens in self.by_text.items()
                                   for token in tokens)

    @classmethod
    def of(cls, tokenizer: Any) -> TokenTexts:
        """The (cached) texts of ``tokenizer``'s tokens."""
        with _BUILD_LOCK:
            cached = _BY_TOKENIZER.get(tokenizer)
            if cached is None:
                cached = cls(token_texts(tokenizer), _special_ids(tokenizer),
                             _encode=lambda text: tokenizer.encode(text, add_special_tokens=False))
                _BY_TOKENIZER[tokenizer] = cached
            return cached

    def text(self, token: int) -> str:
        """``token``'s text; '' for an id past the tokenizer's (a wider logits row)."""
        return self.texts[token] if 0 <= token < len(self.texts) else ""

    def encoded_length(self, text: str) -> int:
        """Tokens the tokenizer writes ``text`` in: a path the constraint allows."""
        return len(self.encode(text))

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokenizer's own encoding of ``text`` (cached): the canonical tokenization the
        warm start's demonstrations use."""
        ids = self._encodings.get(text)
        if ids is None:
            if len(self._encodings) >= MAX_CACHED_MASKS:
                self._encodings.clear()
            ids = self._encodings[text] = tuple(self._encode(text)) if text else ()
        return ids

    def starting_with(self, prefix: str) -> list[tuple[str, int]]:
        """(text, token) of every usable token whose text starts with ``prefix``."""
        start = bisect.bisect_left(self.sorted_texts, (prefix, -1))
        out = []
        for text, token in self.sorted_texts[start:]:
            if not text.startswith(prefix):
                break
            out.append((text, token))
        return out

    def clear(self) -> None:
        """Forget the cached masks (a benchmark times each mode from the same cold start)."""
        with self._lock:
            self._masks.clear()

    def cached(self, key: tuple, build) -> Any:
        value = self._masks.get(key)
        if value is None:
            value = build()
            with self._lock:
                if len(self._masks) >= MAX_CACHED_MASKS:
                    self._masks.clear()
                self._masks[key] = value
        return value


_BY_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BUILD_LOCK = threading.Lock()


def token_texts(tokenizer: Any) -> list[str]:
    """Each token's text as it reads inside a reply: decoded after a probe token and cut
    after the probe, so a SentencePiece word start keeps its space (decoding a token alone
    drops it) and byte-level BPE gives its exact bytes."""
    probe = tokenizer.encode("a", add_special_tokens=False)[-1:]
    base = tokenizer.decode(probe)
    size = len(tokenizer)
    texts = []
    for token in range(size):
        text = tokenizer.decode(probe + [token])
        texts.append(text[len(base):] if text.startswith(base) else tokenizer.decode([token]))
    return texts


def _special_ids(tokenizer: Any) -> frozenset[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token))
    return frozenset(int(t) for t in ids)


class RowConstraint:
    """One request's grammar as its reply is decoded, token by token. ``stop_ids``: the tokens
    that end a complete reply; ``width``: the model's logits per row (the ids from
    ``len(texts.texts)`` to it have no text and are never allowed; default: none)."""

    def __init__(self, grammar: Any, texts: TokenTexts, stop_ids: Iterable[int],
                 width: int | None = None):
        self.grammar = grammar
        self.texts = texts
        self.stop_ids = tuple(sorted(set(int(t) for t in stop_ids)))
        self.width = max(len(texts.texts), width or 0)
        self.states = grammar.start()
        self.region_states = None if grammar.is_free(self.states) else self.states
        """Where the fixed-text region began (None in the free thinking): the reply's start, or
        the state after the token that closed the thinking."""
        self.region_ids: list[int] = []
        """The tokens written since the region began: a prefix of a canonical encoding."""

    def mask(self, tokens_left: int) -> TokenMask:
        """The tokens allowed now, with ``tokens_left`` tokens (this one included) to go."""
        grammar, texts, states = self.grammar, self.texts, self.states
        key = (grammar, states, self.stop_ids, self.width)
        if grammar.is_free(states):
            if tokens_left - 1 >= self._free_reserve():
                return texts.cached(key, self._free_mask)
            states = ("close-now",)  # the thinking must close now: only '<...' continues
            options = texts.cached((*key, "options"), lambda: self._options(states))
        else:
            key = (grammar, self.region_states, tuple(self.region_ids), self.stop_ids,
                   self.width)
            options = texts.cached((*key, "canonical"), self._canonical_options)
        worst = max((need for _, _, need in options), default=0)
        if tokens_left - 1 >= worst:
            return texts.cached((*key, "mask"), lambda: _allow(t for t, _, _ in options))
        return texts.cached((*key, tokens_left), lambda: self._within(options, tokens_left))

    def advance(self, token: int) -> None:
        """Move past ``token`` (a stop token ends the reply)."""
        if token in self.stop_ids:
            return
        was_free = self.grammar.is_free(self.states)
        self.states = self.grammar.run(self.states, self.texts.text(token))
        if self.grammar.is_free(self.states):
            self.region_states = None
        elif was_free:  # the thinking closed inside this token: the fixed text starts after it
            self.region_states, self.region_ids = self.states, []
        else:
            self.region_ids.append(token)

    # -- building masks --------------------------------------------------------------------------
    def _free_reserve(self) -> int:
        return self.texts.cached((self.grammar, "reserve"), lambda: 1 + self.texts.encoded_length(
            self.grammar.completion(frozenset([("free",)]), longest_action=True)))

    def _free_mask(self) -> TokenMask:
        """Banned in the free thinking: stop and special tokens, and '<' tokens that do not
        start the closing tag."""
        grammar, texts = self.grammar, self.texts
        banned = set(self.stop_ids) | set(texts.special)
        banned.update(t for t in texts.angle_tokens
                      if not grammar.run(self.states, texts.texts[t]))
        banned.update(t for t in texts.unusable if not texts.texts[t])
        banned.update(range(len(texts.texts), self.width))  # logits past the tokenizer
        return TokenMask(tuple(sorted(banned)), allow=False)

    def _canonical_options(self) -> list[tuple[int, None, int]]:
        """(token, None, tokens still needed after it) for the next token of the tokenizer's own
        encoding of every reply that continues the region's tokens: fixed text gets one token
        (forced: no choice, no decode pass, no loss), a free field one per distinct spelling the
        tokenizer itself writes. The character search (:meth:`_options`) stands in where no
        encoding continues the region (a tokenizer whose encoding does not read back as its
        token texts)."""
        grammar, texts, region = self.grammar, self.texts, self.region_ids
        written = "".join(texts.text(token) for token in region)
        needs: dict[int, int] = {}
        for ending in grammar.endings(self.states):
            ids = texts.encode(written + ending)
            if list(ids[:len(region)]) != region:
                continue
            if len(ids) == len(region):  # the reply is complete: its end-of-turn token
                if grammar.can_stop(self.states):
                    needs.update((token, 0) for token in self.stop_ids)
                continue
            token = ids[len(region)]
            if not grammar.run(self.states, texts.text(token)):
                continue
            need = len(ids) - len(region)  # this token's followers and the end-of-turn token
            if grammar.think and grammar.is_free(grammar.run(self.states, ending)):
                need += self._free_reserve() - 1  # '<think>': then the thinking
            needs[token] = min(need, needs.get(token, need))
        if not needs:
            return self._options(self.states)
        return [(token, None, need) for token, need in sorted(needs.items())]

    def _options(self, states) -> list[tuple[int, frozenset | None, int]]:
        """(token, state after it, tokens still needed after it) for every allowed token."""
        grammar, texts = self.grammar, self.texts
        found: dict[int, frozenset | None] = {}
        if states == ("close-now",):  # from the free thinking, a token that starts with '<'
            stack = [("", self.states, {"<"})]
        else:
            stack = [("", states, None)]
            if grammar.can_stop(states):
                found.update((t, None) for t in self.stop_ids)
        while stack:
            text, now, chars = stack.pop()
            for char in (chars if chars is not None else grammar.next_chars(now) or ()):
                longer = text + char
                if longer not in texts.prefixes:
                    continue
                after = grammar.step(now, char)
                if not after:
                    continue
                if grammar.is_free(after):  # the thinking opened inside this token
                    for full, token in texts.starting_with(longer):
                        rest = grammar.run(after, full[len(longer):])
                        if rest:
                            found.setdefault(token, rest)
                    continue
                for token in texts.by_text.get(longer, ()):
                    found.setdefault(token, after)
                stack.append((longer, after, None))
        if not found:  # off the grammar (cannot happen from its own masks): end the reply
            found.update((t, None) for t in self.stop_ids)
        return [(token, after, self._need(after)) for token, after in sorted(found.items())]

    def _need(self, states: frozenset | None) -> int:
        """Tokens a reply still needs from ``states`` (its end-of-turn token included)."""
        if states is None:  # a stop token: done
            return 0
        return self.texts.cached((self.grammar, states, "need"), lambda: 1 + (
            self.texts.encoded_length(self.grammar.completion(states) or "")))

    def _within(self, options, tokens_left: int) -> TokenMask:
        fitting = [t for t, _, need in options if need <= tokens_left - 1]
        return _allow(fitting or [t for t, _, _ in options] or self.stop_ids)


def _allow(tokens: Iterable[int]) -> TokenMask:
    return TokenMask(tuple(tokens), allow=True)


def apply_masks(logits: torch.Tensor, masks: list[TokenMask | None]) -> torch.Tensor:
    """``logits`` ``[rows, vocab]`` with each row's disallowed tokens at -inf (in place)."""
    for row, mask in enumerate(masks):
        if mask is None:
            continue
        index = mask.index if mask.index.device == logits.device else mask.index.to(logits.device)
        if mask.allow:
            kept = logits[row, index]
            logits[row].fill_(float("-inf"))
            logits[row, index] = kept
        else:
            logits[row, index] = float("-inf")
    return logits
