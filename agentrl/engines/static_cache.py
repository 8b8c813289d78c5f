"""Decode steps over a preallocated key/value cache, for Llama-style models on the local engine.

    decoder = StaticCacheDecoder.build(model, prefill_cache, attention_mask, rows, steps)
    logits, hidden = decoder.step(tokens, positions)   # tokens, positions: [batch, width]
    # logits [batch, vocab] float32 of each row's last token, hidden [batch, width, hidden]
    decoder.keep([0, 2])                       # rows 1, 3, ... finished: drop them
    keys, values = decoder.row(0)              # a row's real keys/values, for the prefix cache

Why: transformers' ``DynamicCache`` concatenates every layer's keys and values with the new
token at every step (a copy of the whole cache per token), and its SDPA path expands grouped
key/value heads to every query head (another copy) before a flash kernel that is slow for one
query token. On a 2-core CPU those copies took half as long as the matmuls at batch 16.

Here each layer's keys and values live in buffers allocated once per batch (keys transposed,
``[rows, kv_heads, head_dim, capacity]``, the layout the score matmul reads ~1.7x faster on a
CPU; values ``[rows, kv_heads, capacity, head_dim]``). A step writes one column and attends over
the filled columns with two batched matmuls per layer, the grouped query heads as a view of the
key/value heads (no copy). The layers' own modules (norms, projections, MLP, rotary embedding,
LoRA adapters if any) compute everything else, so a row's tokens and log-probs are those of the
model's own forward pass (the tests compare them).

A step may feed several tokens a row (jump-forward decoding: the tokens a grammar forces),
left-padded to the widest row: the step writes that many columns, ``valid`` marks the pads out,
and the new tokens attend causally to each other.

The prefill stays the model's forward with a ``DynamicCache``; :meth:`StaticCacheDecoder.build`
copies it into the buffer once. Models whose attention differs (sliding windows, per-head
norms, other architectures) keep the ``DynamicCache`` path (:func:`supports`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.models.parts import causal_lm

__all__ = ["StaticCacheDecoder", "supports"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
"""Decoder-only models whose layers are exactly: RMSNorm, attention with q/k/v/o projections
and rotary embeddings, RMSNorm, MLP (what :meth:`StaticCacheDecoder.step` reproduces)."""


def supports(model: Any) -> bool:
    """Whether :class:`StaticCacheDecoder` computes this model's decode steps exactly."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    decoder = getattr(lm, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or not hasattr(lm, "lm_head"):
        return False
    attention = layers[0].self_attn
    return (all(hasattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and not hasattr(attention, "q_norm")
            and hasattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb"))


class StaticCacheDecoder:
    """One batch's decode steps: keys/values in preallocated buffers, attention by matmul.

    Invariant: columns (positions) ``[0, length)`` of every buffer are written (prefill pads
    included) and ``valid[row, column]`` says which hold the row's real tokens; later columns
    are never read (the buffers are allocated uninitialized).
    """

    def __init__(self, model: Any, keys: list[torch.Tensor], values: list[torch.Tensor],
                 valid: torch.Tensor, length: int):
        lm = causal_lm(model)
        self.lm = lm
        self.decoder = lm.model
        attention = self.decoder.layers[0].self_attn
        self.rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb
        self.head_dim = keys[0].shape[2]
        self.kv_heads = keys[0].shape[1]
        self.scaling = attention.scaling
        self.keys, self.values, self.valid = keys, values, valid
        self.length = length
        self.rows = valid.shape[0]

    @classmethod
    def build(cls, model: Any, prefill_cache: Any, attention_mask: torch.Tensor,
              rows: torch.Tensor | None, steps: int) -> StaticCacheDecoder:
        """From a prefill's ``DynamicCache`` (one row per distinct prompt) and its attention mask
        ``[rows, columns]``: buffers with room for ``steps`` more tokens a row. ``rows`` repeats
        the prefill's rows (identical prompts read once), None keeps them as they are."""
        layers = prefill_cache.layers
        if rows is not None:
            attention_mask = attention_mask[rows]
        count, length = attention_mask.shape
        capacity = length + steps
        keys, values = [], []
        for layer in layers:
            source_keys, source_values = ((layer.keys, layer.values) if rows is None
                                          else (layer.keys[rows], layer.values[rows]))
            heads, dim = source_keys.shape[1], source_keys.shape[3]
            keys.append(source_keys.new_empty(count, heads, dim, capacity))
            keys[-1][..., :length] = source_keys.transpose(2, 3)
            values.append(source_values.new_empty(count, heads, capacity, dim))
            values[-1][:, :, :length] = source_values
        valid = attention_mask.new_zeros(count, capacity, dtype=torch.bool)
        valid[:, :length] = attention_mask.bool()
        return cls(model, keys, values, valid, length)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor,
             valid: torch.Tensor | None = None,
             allowed: Sequence[torch.Tensor | None] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens`` ``[rows, width]`` at ``positions`` (``valid``: which are real, the
        rest left pads; None = all): the logits ``[rows, vocab]`` (float32) after each row's
        last token, and the last hidden states ``[rows, width, hidden]`` they are read from.
        ``allowed``: per row, the only ids its next token may be (a constrained row's mask;
        None = any): only their logits are computed, the others are -inf."""
        rows, width, column = self.rows, tokens.shape[1], self.length
        self._reserve(column + width)
        self.valid[:rows, column:column + width] = True if valid is None else valid
        hidden = self.decoder.embed_tokens(tokens)  # [rows, width, hidden]
        cos, sin = self.decoder.rotary_emb(hidden, positions)
        bias = self._bias(hidden.dtype, width)
        for index, layer in enumerate(self.decoder.layers):
            attended = self._attend(layer.self_attn, layer.input_layernorm(hidden), cos, sin,
                                    bias, index)
            hidden = hidden + attended
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        self.length = column + width
        hidden = self.decoder.norm(hidden)
        return self._head(hidden[:, -1], allowed), hidden

    def _head(self, last: torch.Tensor, allowed: Sequence[torch.Tensor | None] | None
              ) -> torch.Tensor:
        """The LM head on ``last`` ``[rows, hidden]``: only a row's allowed ids where it has
        them (a masked answer step then reads a few rows of the head's weight, not 49k)."""
        head = self.lm.lm_head
        if (allowed is None or all(ids is None for ids in allowed)
                or type(head) is not torch.nn.Linear):  # not with an adapter on the head
            return head(last).float()
        logits = torch.full((len(last), head.out_features), float("-inf"),
                            dtype=torch.float32, device=last.device)
        full = [row for row, ids in enumerate(allowed) if ids is None]
        if full:
            logits[full] = head(last[full]).float()
        for row, ids in enumerate(allowed):
            if ids is not None:
                ids = ids.to(last.device)
                bias = None if head.bias is None else head.bias[ids]
                logits[row, ids] = F.linear(last[row], head.weight[ids], bias).float()
        return logits

    def _bias(self, dtype: torch.dtype, width: int) -> torch.Tensor:
        """``[rows, 1, 1, width, columns]``: 0 where a new token may attend (a real column,
        not after itself), -inf elsewhere."""
        end = self.length + width
        allowed = self.valid[:self.rows, None, :end].expand(-1, width, -1).clone()
        if width > 1:
            new = torch.arange(width, device=allowed.device)
            allowed[:, :, self.length:] &= new[None, :, None] >= new[None, None, :]
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return bias.masked_fill_(~allowed, float("-inf"))[:, None, None]

    def _reserve(self, columns: int) -> None:
        """Grow the buffers to hold ``columns`` (jump-forward steps write pads too)."""
        capacity = self.valid.shape[1]
        if columns <= capacity:
            return
        grown = max(columns, capacity + capacity // 2)
        for buffers, axis in ((self.keys, 3), (self.values, 2)):
            for index, buffer in enumerate(buffers):
                shape = list(buffer.shape)
                shape[axis] = grown
                bigger = buffer.new_empty(shape)
                bigger.narrow(axis, 0, capacity).copy_(buffer)
                buffers[index] = bigger
        valid = self.valid.new_zeros(self.valid.shape[0], grown)
        valid[:, :capacity] = self.valid
        self.valid = valid

    def _attend(self, attention: Any, hidden: torch.Tensor, cos, sin, bias,
                index: int) -> torch.Tensor:
        """One layer's attention output ``[rows, width, hidden]`` for the new tokens."""
        rows, width, dim, kv_heads = hidden.shape[0], hidden.shape[1], self.head_dim, self.kv_heads
        query = attention.q_proj(hidden).view(rows, width, -1, dim).transpose(1, 2)
        key = attention.k_proj(hidden).view(rows, width, -1, dim).transpose(1, 2)
        value = attention.v_proj(hidden).view(rows, width, -1, dim).transpose(1, 2)
        query, key = self.rotate(query, key, cos, sin)
        column, end = self.length, self.length + width
        keys, values = self.keys[index][:rows], self.values[index][:rows]
        keys[..., column:end] = key.transpose(2, 3)
        values[:, :, column:end] = value
        # grouped heads as a view: [rows, kv_heads, group x width, dim] @ [.., dim, cols]
        heads = query.shape[1]
        grouped = query.reshape(rows, kv_heads, -1, dim)
        scores = torch.matmul(grouped, keys[..., :end]) * self.scaling
        scores = scores.view(rows, kv_heads, heads // kv_heads, width, end) + bias
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(weights.view(rows, kv_heads, -1, end), values[:, :, :end])
        out = out.view(rows, heads, width, dim).transpose(1, 2).reshape(rows, width, -1)
        return attention.o_proj(out)

    def keep(self, kept: Sequence[int]) -> None:
        """Keep only the rows ``kept`` (ascending), moved to the front of the buffers."""
        if list(kept) == list(range(len(kept))):
            self.rows = len(kept)
            return
        index = torch.tensor(kept, device=self.valid.device)
        count = len(kept)
        for buffer in (*self.keys, *self.values, self.valid):
            buffer[:count] = buffer[index]
        self.rows = count

    def row(self, batch_row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The keys and values ``[kv_heads, tokens, dim]`` per layer of a row's real tokens."""
        real = self.valid[batch_row, : self.length].nonzero().squeeze(1)
        return ([keys[batch_row][:, :, real].transpose(1, 2) for keys in self.keys],
                [values[batch_row][:, real] for values in self.values])
