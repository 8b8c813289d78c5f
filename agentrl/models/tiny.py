"""The tiny test model: a seeded random Llama on the embedded tokenizer, built in-process.

    model, tokenizer = load_model("tiny")       # agentrl.models.loading resolves the name

Why apart: it is built, not loaded (a config and a seed, no file), and tests, the CPU presets
and verl's CPU trainer (``tiny-vllm``, written to a folder by
:func:`agentrl.models.loading.save_tiny_model`) rely on its sizes and seed staying put.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TINY", "TINY_MODELS", "TINY_VLLM", "TinyConfig", "tiny_model"]


@dataclass(frozen=True)
class TinyConfig:
    """The random test model: small enough that a forward pass is a millisecond on CPU."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 8192
    """As long as SmolLM2's context, so long multi-turn test episodes fit."""
    initializer_range: float = 0.02
    seed: int = 0


TINY = TinyConfig()
TINY_VLLM = TinyConfig(num_attention_heads=2, num_key_value_heads=1)
"""``tiny-vllm``: the same sizes with head_dim 32, the smallest vLLM's CPU attention serves."""
TINY_MODELS = {"tiny": TINY, "tiny-vllm": TINY_VLLM}


def tiny_model(vocab_size: int, tokenizer: Any, config: TinyConfig = TINY) -> Any:
    """A seeded random LlamaForCausalLM; the same weights on every call.

    Input and output embeddings are separate: with tied random embeddings the logits favour
    the input token itself, so greedy decoding just repeats the prompt's last token.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    llama_config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama_config)
    return model
