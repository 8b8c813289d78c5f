"""Models and tokenizers by name (``embedded``, ``tiny``, a local folder, a hub id)."""

from agentrl.models.common import ModelNotFoundError, cache_root
from agentrl.models.embedded import embedded_gguf_path
from agentrl.models.loading import load_model, load_tokenizer
from agentrl.models.templates import CHAT_TEMPLATES, ChatTemplate, end_of_turn_ids
from agentrl.models.tiny import TINY

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
