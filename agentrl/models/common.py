"""What every source of a model shares: the error a name that loads nothing raises, the cache
folder, and the fix-ups every loaded tokenizer and model gets.

Why apart: the name resolution (:mod:`agentrl.models.loading`), the embedded model's conversion
(:mod:`agentrl.models.embedded`) and the tiny test model (:mod:`agentrl.models.tiny`) all apply
them, and each of those imports this module rather than another.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl.models.templates import generation_eos_ids

__all__ = ["ModelNotFoundError", "cache_root", "fix_tokenizer", "sync_special_ids"]


class ModelNotFoundError(OSError):
    """A model name matched no allowed form; the message lists what was tried."""


def cache_root() -> Path:
    """``$AGENTRL_CACHE/models`` if set, else ``~/.cache/agentrl/models``."""
    cache = os.environ.get("AGENTRL_CACHE")
    base = Path(cache) if cache else Path.home() / ".cache" / "agentrl"
    return base / "models"


def fix_tokenizer(tokenizer: Any) -> Any:
    """pad_token always set (eos when missing); no space clean-up when decoding."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif tokenizer.unk_token is not None:
            tokenizer.pad_token = tokenizer.unk_token
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
    tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


def sync_special_ids(model: Any, tokenizer: Any, keep_generation_eos: bool = False) -> None:
    """Model and generation config agree with the tokenizer on eos/pad/bos. With
    ``keep_generation_eos`` (a model folder's own generation config) the generation config keeps
    its other end-of-sequence ids after the tokenizer's (Qwen2.5: ``<|im_end|>`` and
    ``<|endoftext|>``; every one ends a reply)."""
    generation = getattr(model, "generation_config", None)
    for config in (model.config, generation):
        if config is None:
            continue
        eos = tokenizer.eos_token_id
        if config is generation and keep_generation_eos:
            listed = [t for t in generation_eos_ids(config) if t != eos]
            eos = [eos, *listed] if listed else eos
        config.eos_token_id = eos
        config.pad_token_id = tokenizer.pad_token_id
        if tokenizer.bos_token_id is not None:
            config.bos_token_id = tokenizer.bos_token_id
