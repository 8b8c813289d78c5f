"""Mixed precision for training: float32 master weights, matmuls in a half dtype under autocast.

    with compute_precision("cpu", "bfloat16"):      # linear layers in bf16, the rest in fp32
        logits = model(input_ids).logits

Casting the weights themselves to bfloat16 makes AdamW update them in bfloat16: an update
smaller than ~2^-8 of a weight rounds away (at lr 1e-6 almost nothing moves). So the local
trainer keeps its weights in float32 and computes under autocast, in the sampler as in the
trainer's recompute, so the sampled and the recomputed log-probs come from the same arithmetic.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

__all__ = ["compute_precision"]


def compute_precision(device: str | torch.device,
                      dtype: str | torch.dtype | None) -> ContextManager:
    """Autocast to ``dtype`` on ``device``'s type; a no-op for ``None`` and float32."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
