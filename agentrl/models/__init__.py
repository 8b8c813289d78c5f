"""Models and tokenizers by name (``embedded``, ``tiny``, a local folder, a hub id)."""

from agentrl.models.loading import (
    TINY,
    ModelNotFoundError,
    cache_root,
    embedded_gguf_path,
    load_model,
    load_tokenizer,
)
from agentrl.models.templates import CHAT_TEMPLATES, ChatTemplate, end_of_turn_ids

__all__ = [
    "CHAT_TEMPLATES",
    "TINY",
    "ChatTemplate",
    "ModelNotFoundError",
    "cache_root",
    "embedded_gguf_path",
    "end_of_turn_ids",
    "load_model",
    "load_tokenizer",
]
