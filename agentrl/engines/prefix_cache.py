"""Keys and values of recent sequences, so a prompt that extends one prefills only its new tokens.

Every turn of an episode sends the previous turn's prompt, the reply and the new observation:
without a cache, each turn re-reads the whole conversation, and on a CPU that prefill is most of
an evaluation's time. :class:`~agentrl.engines.local.BatchingLLM` stores each finished request's
keys and values under its token ids (the prompt and the reply, less the reply's last token,
whose keys were never computed) and starts each new request from the longest stored prefix.

Entries are evicted least-recently-used beyond ``max_tokens``. They are the model's keys and
values under its weights at the time: whoever changes the weights must :meth:`PrefixCache.clear`
it (:class:`~agentrl.trainers.local.LocalTrainer` does after every update).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["CachedPrefix", "PrefixCache"]


@dataclass(frozen=True)
class CachedPrefix:
    """The keys and values of the tokens ``ids``, per layer ``[kv_heads, len(ids), head_dim]``."""

    ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]


class PrefixCache:
    """Least-recently-used store of :class:`CachedPrefix`, at most ``max_tokens`` tokens in all
    (0 stores nothing). Safe to use from several threads."""

    def __init__(self, max_tokens: int):
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 = off), got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def longest_prefix(self, prompt: Sequence[int]) -> CachedPrefix | None:
        """The longest stored sequence that starts ``prompt`` and leaves at least one of its
        tokens to prefill (the model needs one to give the next token's logits)."""
        best: CachedPrefix | None = None
        with self._lock:
            for ids, entry in self._entries.items():
                n = len(ids)
                if n >= len(prompt) or (best is not None and n <= len(best.ids)):
                    continue
                if prompt[n - 1] == ids[-1] and prompt[0] == ids[0] and tuple(prompt[:n]) == ids:
                    best = entry
            if best is not None:
                self._entries.move_to_end(best.ids)
        return best

    def put(self, ids: Sequence[int], keys: Sequence[torch.Tensor],
            values: Sequence[torch.Tensor]) -> None:
        ids = tuple(ids)
        if not ids or len(ids) > self.max_tokens:
            return
        with self._lock:
            if ids in self._entries:
                self._entries.move_to_end(ids)
                return
            self._entries[ids] = CachedPrefix(ids, tuple(keys), tuple(values))
            self._tokens += len(ids)
            while self._tokens > self.max_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tokens = 0
