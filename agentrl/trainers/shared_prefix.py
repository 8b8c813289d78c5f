"""A micro-batch's common leading tokens run once: the prefix's keys and values serve every row.

    inputs = shared_prefix_inputs(model, backbone_of(model), inputs, response_length=R,
                                  min_tokens=32)
    out = model(**inputs, logits_to_keep=R + 1)            # the same log-probs, fewer tokens read

The members of a group share their whole first prompt, and every episode of a preset shares the
system prompt and the instructions: on the CPU preset ~300 of an episode's ~320 tokens are the
same in every row of a micro-batch. Here the longest common prefix of the rows' real tokens
(``L``, at most each row's prompt but its last token) runs once, batch 1, with gradients; its
keys and values, repeated to the batch (:meth:`transformers.DynamicCache.batch_repeat_interleave`,
whose backward sums the rows' gradients into the one prefix pass), are the ``past_key_values``
of a second pass over each row's remainder. Log-probs, hidden states and gradients are the
unshared pass's up to float rounding (tests/trainers/test_shared_prefix.py).

Layout. A row is ``left padding | prompt | response | right padding``
(:func:`agentrl.rollout.to_batch`), so the prefix starts at a different column in each row. The
remainder drops the prefix's ``L`` columns from each row and keeps everything else in place:
``left padding | rest of prompt | response | right padding``, ``L`` columns narrower. Positions
are gathered with the tokens (the real tokens keep theirs), the attention mask is ``L`` ones
(the prefix) followed by the remainder's, and the response columns stay the last ``R`` ones, so
``logits_to_keep`` and the hidden-state slice read the same positions as before.

Runs of micro-batches. A group's rows often fill several micro-batches (an episode in context
windows is a row per window, each starting with the group's first prompt), and the same prefix
would run once per micro-batch. :func:`plan_prefix_runs` cuts the ordered rows into micro-batches
and groups consecutive ones into runs that read one :class:`SharedPrefix`: its keys and values
are computed once per model on first use, every micro-batch of the run reads them (sliced
leaves, detached from the prefix pass), and under autograd each micro-batch's backward leaves its
gradient on those leaves, where they add up; :meth:`PrefixRun.backward` then sends the sum
through the prefix pass once, so the weights get the same gradients as from the unshared pass
(the chain rule is linear in the upstream gradient). Which micro-batches form a run is chosen to
read the fewest tokens (a dynamic program over the micro-batches, each prefix pass counted with
``min_tokens`` extra for its fixed cost): a run never reads more than its micro-batches sharing
their own prefixes would.

Falls back to the unshared inputs (returned unchanged) when
- fewer than 2 rows, or fewer than ``min_tokens`` shared tokens: the second pass has a fixed
  cost (every weight's gradient is computed twice and summed, and the smaller matmuls run less
  efficiently): 2 rows of the embedded model on a CPU take 9% longer sharing 16 tokens, 7%
  less sharing 32 and 1.6x less sharing 308 (CPU time, one thread);
- gradient checkpointing is active (:func:`agentrl.trainers.policy.checkpointing`):
  transformers' ``GradientCheckpointingLayer`` sets ``past_key_values=None`` in a checkpointed
  layer, so the remainder would not see the prefix;
- the attention is not ``sdpa`` or ``eager`` (flash-attention's varlen path with padding inside
  a row, after a cache, is untested here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["SHARING_ATTENTION", "PrefixRun", "SharedPrefix", "plan_prefix_runs",
           "shared_prefix_inputs", "shared_prefix_length", "sharing_blocked"]

SHARING_ATTENTION = ("sdpa", "eager")
"""Attention implementations whose masks take a cache plus padding inside a row."""


def shared_prefix_length(inputs: dict[str, torch.Tensor], response_length: int) -> int:
    """Tokens every row's prompt starts with (real tokens, after its left padding), at most each
    prompt's length minus one: the last prompt token predicts the first response token, so it
    stays in the remainder with the response."""
    mask = inputs["attention_mask"]
    prompt_width = mask.shape[1] - response_length
    prompt_tokens = mask[:, :prompt_width].sum(1)
    limit = int(prompt_tokens.min()) - 1
    if mask.shape[0] < 2 or limit <= 0:
        return 0
    start = prompt_width - prompt_tokens  # each row's first real column
    columns = start[:, None] + torch.arange(limit, device=mask.device)
    aligned = inputs["input_ids"].gather(1, columns)
    differs = (aligned != aligned[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else limit


def sharing_blocked(model: nn.Module) -> str | None:
    """Why ``model`` cannot read a shared prefix's cache now (see the module docstring), or None."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention not in SHARING_ATTENTION:
        return f"attention {attention!r} is not one of {SHARING_ATTENTION}"
    if any(isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing and m.training
           for m in model.modules()):
        return "gradient checkpointing drops past_key_values"
    return None


def shared_prefix_inputs(model: nn.Module, backbone: nn.Module, inputs: dict[str, torch.Tensor],
                         *, response_length: int, min_tokens: int,
                         prefix: SharedPrefix | None = None) -> dict[str, Any]:
    """``inputs`` (``input_ids``, ``attention_mask``, ``position_ids``) for ``model``, with the
    rows' shared prefix already run through ``backbone`` (the transformer under ``model``'s
    head, or ``model`` itself) and passed as ``past_key_values``; unchanged (with
    ``use_cache=False``) where sharing does not apply (module docstring). ``min_tokens`` 0 = off.
    ``prefix``: a run's prefix (:func:`plan_prefix_runs`) that every row starts with, read instead
    of running the rows' own.
    """
    if min_tokens <= 0 or sharing_blocked(model) is not None:
        return {**inputs, "use_cache": False}
    if prefix is not None:
        length = prefix.length
    else:
        length = shared_prefix_length(inputs, response_length)
        if length < min_tokens:
            return {**inputs, "use_cache": False}
    ids, mask, positions = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    rows, width = ids.shape
    prompt_width = width - response_length
    padding = prompt_width - mask[:, :prompt_width].sum(1)
    if prefix is not None:
        cache = prefix.cache(backbone, ids, padding)
    else:
        first = int(padding[0])
        cache = backbone(input_ids=ids[:1, first:first + length],
                         position_ids=positions[:1, first:first + length],
                         use_cache=True).past_key_values
        cache.batch_repeat_interleave(rows)
    column = torch.arange(width - length, device=ids.device)[None]
    kept = torch.where(column < padding[:, None], column, column + length)  # drop the prefix
    return {
        "input_ids": ids.gather(1, kept),
        "position_ids": positions.gather(1, kept),
        "attention_mask": torch.cat([mask.new_ones(rows, length), mask.gather(1, kept)], dim=1),
        "past_key_values": cache,
        "use_cache": True,
    }


class SharedPrefix:
    """The leading tokens of a run of micro-batches, for one model: run through it on first use,
    then read by every micro-batch. With autograd on, micro-batches read detached copies (leaves)
    whose gradients add up over the run; :meth:`backward` sends them through the prefix pass."""

    def __init__(self, ids: torch.Tensor, positions: torch.Tensor):
        self.ids, self.positions = ids, positions  # (1, L)
        self._outputs: list[torch.Tensor] | None = None  # keys, values of each layer (graph)
        self._leaves: list[torch.Tensor] | None = None

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    def cache(self, backbone: nn.Module, ids: torch.Tensor, padding: torch.Tensor) -> Any:
        """A ``DynamicCache`` of the prefix for the rows of ``ids`` (left ``padding`` each),
        which must start with it."""
        from transformers import DynamicCache

        length, device = self.length, ids.device
        columns = padding[:, None] + torch.arange(length, device=device)
        if not torch.equal(ids.gather(1, columns), self.ids.to(device).expand(len(ids), -1)):
            raise ValueError("rows read a shared prefix they do not start with")
        if self._leaves is None:
            past = backbone(input_ids=self.ids.to(device), position_ids=self.positions.to(device),
                            use_cache=True).past_key_values
            outputs = [t for layer in past.layers for t in (layer.keys, layer.values)]
            if any(t.requires_grad for t in outputs):  # a leaf for each one with a gradient
                self._outputs = outputs  # (LoRA on some projections leaves others constant)
                self._leaves = [t.detach().requires_grad_() if t.requires_grad else t
                                for t in outputs]
            else:
                self._leaves = outputs
        cache = DynamicCache()
        for layer in range(len(self._leaves) // 2):
            cache.update(self._leaves[2 * layer], self._leaves[2 * layer + 1], layer)
        cache.batch_repeat_interleave(len(ids))
        return cache

    def backward(self) -> None:
        """The run's summed gradients on the keys and values, through the prefix pass: each
        weight gets the prefix's share of the gradient once. Then the prefix is freed."""
        if self._outputs is not None:
            pairs = [(out, leaf.grad) for out, leaf in zip(self._outputs, self._leaves)
                     if out.requires_grad and leaf.grad is not None]
            if pairs:
                torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self._outputs = self._leaves = None


@dataclass
class PrefixRun:
    """Consecutive micro-batches (row indices of the batch) that read one shared prefix (none
    when ``ids`` is None: each micro-batch shares its own rows' prefix, if long enough)."""

    micro_batches: list[torch.Tensor]
    ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    _prefixes: dict[str, SharedPrefix] = field(default_factory=dict)

    def prefix(self, model: str) -> SharedPrefix | None:
        """The prefix as ``model`` (a name: "actor", "ref", ...) computes it, made on first use."""
        if self.ids is None:
            return None
        if model not in self._prefixes:
            self._prefixes[model] = SharedPrefix(self.ids, self.positions)
        return self._prefixes[model]

    def backward(self) -> None:
        """After the run's micro-batches' backward passes: the prefixes' share (see
        :meth:`SharedPrefix.backward`); then they are freed (also the way to free the prefixes
        of a no-grad pass)."""
        for prefix in self._prefixes.values():
            prefix.backward()
        self._prefixes.clear()


def plan_prefix_runs(batch: dict[str, torch.Tensor], rows: torch.Tensor, micro_batch_size: int,
                     min_tokens: int) -> list[PrefixRun]:
    """``rows`` (in this order) cut into micro-batches of ``micro_batch_size``, grouped into runs
    that share a prefix so that the fewest tokens are read (module docstring). ``min_tokens``:
    the shortest prefix worth a pass of its own (0 = no sharing: one run per micro-batch)."""
    micro_batches = [rows[start:start + micro_batch_size]
                     for start in range(0, len(rows), micro_batch_size)]
    if min_tokens <= 0 or len(rows) < 2:
        return [PrefixRun([micro]) for micro in micro_batches]
    prompts = batch["prompts"]
    real = batch["attention_mask"][:, :prompts.shape[1]].bool()
    listed = rows.tolist()
    tokens = [prompts[row][real[row]].numpy() for row in listed]
    # a set of rows shares the min over neighbours of their common leading tokens, and at most
    # each prompt but its last token (it predicts the first response token)
    common = np.array([_common_start(a, b) for a, b in zip(tokens, tokens[1:])] + [0])
    limit = np.array([len(t) - 1 for t in tokens])
    row_cost = np.cumsum([0, *batch["attention_mask"][rows].sum(1).tolist()])
    bounds = np.cumsum([0, *map(len, micro_batches)])
    m = len(micro_batches)
    best = [0.0] + [float("inf")] * m  # best[k]: fewest tokens read by micro-batches 0..k-1
    last_run: list[tuple[int, int]] = [(0, 0)] * (m + 1)  # (start, prefix length) of its last run
    for end in range(1, m + 1):
        for start in range(end - 1, -1, -1):
            lo, hi = bounds[start], bounds[end]
            length = int(min(common[lo:hi - 1].min(), limit[lo:hi].min())) if hi - lo > 1 else 0
            if length < min_tokens:
                if start < end - 1:
                    break  # a run of several needs a prefix; an earlier start shares no more
                length = 0
            cost = row_cost[hi] - row_cost[lo] - (hi - lo - 1) * length + min_tokens * (length > 0)
            if best[start] + cost < best[end]:
                best[end], last_run[end] = best[start] + cost, (start, length)
    runs, end = [], m
    while end > 0:
        start, length = last_run[end]
        run = PrefixRun(micro_batches[start:end])
        if length:
            row = listed[bounds[start]]
            first = int(real[row].int().argmax())
            run.ids = batch["input_ids"][row:row + 1, first:first + length]
            run.positions = batch["position_ids"][row:row + 1, first:first + length]
        runs.append(run)
        end = start
    return runs[::-1]


def _common_start(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if len(differs) else n
