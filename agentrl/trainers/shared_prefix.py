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

from typing import Any

import torch
from torch import nn

__all__ = ["SHARING_ATTENTION", "shared_prefix_inputs", "shared_prefix_length", "sharing_blocked"]

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
                         *, response_length: int, min_tokens: int) -> dict[str, Any]:
    """``inputs`` (``input_ids``, ``attention_mask``, ``position_ids``) for ``model``, with the
    rows' shared prefix already run through ``backbone`` (the transformer under ``model``'s
    head, or ``model`` itself) and passed as ``past_key_values``; unchanged (with
    ``use_cache=False``) where sharing does not apply (module docstring). ``min_tokens`` 0 = off.
    """
    length = shared_prefix_length(inputs, response_length) if min_tokens > 0 else 0
    if length < max(1, min_tokens) or sharing_blocked(model) is not None:
        return {**inputs, "use_cache": False}
    ids, mask, positions = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    rows, width = ids.shape
    prompt_width = width - response_length
    padding = prompt_width - mask[:, :prompt_width].sum(1)
    first = int(padding[0])
    prefix = backbone(input_ids=ids[:1, first:first + length],
                      position_ids=positions[:1, first:first + length], use_cache=True)
    cache = prefix.past_key_values
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
