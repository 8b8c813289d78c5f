"""The parts of a causal LM that the engine and the trainers run separately: the transformer
under the head, and whether the head is nothing but the output embedding."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["PLAIN_HEAD_MODEL_TYPES", "backbone_of", "causal_lm", "plain_head"]


def causal_lm(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (its adapters sit inside it), or ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def backbone_of(model: Any) -> nn.Module:
    """The transformer under a causal LM's head (``model.model`` for Llama-like models)."""
    base = causal_lm(model)
    backbone = getattr(base, base.base_model_prefix, None)
    if backbone is None:
        raise ValueError(f"cannot find the backbone of {type(base).__name__}")
    return backbone


PLAIN_HEAD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""Architectures whose logits are ``lm_head(last_hidden_state)`` and nothing else (others scale
or soft-cap them: Gemma 2 and 3, Cohere, Granite, Falcon-H1, ...)."""


def plain_head(model: Any) -> bool:
    """Whether ``model``'s logits are its output embedding applied to the backbone's last hidden
    state, nothing else (:data:`PLAIN_HEAD_MODEL_TYPES`), so the head can run on chosen
    positions alone."""
    base = causal_lm(model)
    config = getattr(base, "config", None)
    return (getattr(config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
            and base.get_output_embeddings() is not None)
