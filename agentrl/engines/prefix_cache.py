"""Keys and values of recent sequences, so a prompt that starts like one prefills only the rest.

Every turn of an episode sends the previous turn's prompt, the reply and the new observation:
without a cache, each turn re-reads the whole conversation, and on a CPU that prefill is most of
an evaluation's time. :class:`~agentrl.engines.local.BatchingLLM` stores each finished request's
keys and values under its token ids (the prompt and the reply, less the reply's last token,
whose keys were never computed) and starts each new request from the longest start it shares
with a stored sequence: a whole stored turn (the next turn extends it) or a part of one, at
least ``min_shared`` tokens (a history window dropped a turn, yet the episode's first message
is the same; another episode of the game shares the rules). A token's keys and values depend
only on the tokens before it, so a shared start's are the same in both.

Storing a sequence drops the stored ones it extends (the episode's earlier turns: only its
newest turn is extended again), and entries are evicted least-recently-used beyond
``max_tokens``; a budget below an evaluation's live conversations makes every turn re-read
some of them whole. They are the model's keys and
values under its weights at the time: whoever changes the weights must :meth:`PrefixCache.clear`
it (:class:`~agentrl.trainers.local.LocalTrainer` does after every update).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

__all__ = ["CachedPrefix", "PrefixCache"]


@dataclass(frozen=True)
class CachedPrefix:
    """The keys and values of the tokens ``ids``, per layer ``[kv_heads, len(ids), head_dim]``."""

    ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @cached_property
    def array(self) -> np.ndarray:
        return np.asarray(self.ids)

    def head(self, length: int) -> CachedPrefix:
        """The first ``length`` tokens' keys and values (views, no copy)."""
        if length == len(self.ids):
            return self
        return CachedPrefix(self.ids[:length], tuple(k[:, :length] for k in self.keys),
                            tuple(v[:, :length] for v in self.values))


def shared_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many tokens the two id arrays share from their start."""
    length = min(len(a), len(b))
    differ = np.flatnonzero(a[:length] != b[:length])
    return int(differ[0]) if differ.size else length


class PrefixCache:
    """Least-recently-used store of :class:`CachedPrefix`, at most ``max_tokens`` tokens in all
    (0 stores nothing). Safe to use from several threads."""

    def __init__(self, max_tokens: int, min_shared: int = 32):
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 = off), got {max_tokens}")
        self.max_tokens = max_tokens
        self.min_shared = min_shared
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def longest_prefix(self, prompt: Sequence[int]) -> CachedPrefix | None:
        """The keys and values of the longest start ``prompt`` shares with a stored sequence:
        a whole one, or at least ``min_shared`` tokens of one. At least one prompt token is left
        to prefill (the model needs one to give the next token's logits)."""
        limit = len(prompt) - 1
        if limit < 1 or not self._entries:
            return None
        query = np.asarray(prompt[:limit])
        best, best_length = None, 0
        with self._lock:
            for ids, entry in self._entries.items():
                if ids[0] != prompt[0] or min(len(ids), limit) <= best_length:
                    continue
                length = shared_length(entry.array, query)
                if length > best_length and (length == len(ids) or length >= self.min_shared):
                    best, best_length = entry, length
            if best is None:
                return None
            self._entries.move_to_end(best.ids)
        return best.head(best_length)

    def put(self, ids: Sequence[int], keys: Sequence[torch.Tensor],
            values: Sequence[torch.Tensor]) -> None:
        ids = tuple(ids)
        if not ids or len(ids) > self.max_tokens:
            return
        with self._lock:
            if ids in self._entries:
                self._entries.move_to_end(ids)
                return
            # an entry this one extends is the same episode's previous turn: its next turn
            # starts from this one, so the older copy would only push live entries out
            for old in [old for old in self._entries
                        if len(old) < len(ids) and old[-1] == ids[len(old) - 1]
                        and ids[: len(old)] == old]:
                del self._entries[old]
                self._tokens -= len(old)
            self._entries[ids] = CachedPrefix(ids, tuple(keys), tuple(values))
            self._tokens += len(ids)
            while self._tokens > self.max_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tokens = 0
