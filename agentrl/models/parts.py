"""The parts of a causal LM that the engine and the trainers run separately: the transformer
under the head, and whether the head is nothing but the output embedding."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["backbone_of", "plain_head"]


def backbone_of(model: Any) -> nn.Module:
    """The transformer under a causal LM's head (``model.model`` for Llama-like models; through
    a PEFT wrapper, whose adapters sit inside it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(base, base.base_model_prefix, None)
    if backbone is None:
        raise ValueError(f"cannot find the backbone of {type(base).__name__}")
    return backbone


def plain_head(model: Any) -> bool:
    """Whether ``model``'s logits are its output embedding applied to the backbone's last hidden
    state, nothing else (no soft-capping or scaling, as Gemma 2 or Cohere add), so the head can
    run on chosen positions alone."""
    config = getattr(model, "config", None)
    return (model.get_output_embeddings() is not None
            and not getattr(config, "final_logit_softcapping", None)
            and getattr(config, "logit_scale", None) in (None, 1, 1.0))
