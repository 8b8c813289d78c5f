"""Every random number generator a run draws from, saved with a checkpoint and put back on resume.

    state = capture_rng_state({"llm": sampler_generator})    # into the trainer's state
    restore_rng_state(state, {"llm": sampler_generator})     # the next draws repeat
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]

def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """The state of Python's ``random``, numpy's global RNG, torch's CPU (and CUDA) RNG and of
    the named ``generators``, as tensors and plain values (``torch.load(weights_only=True)``
    reads them back)."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {**np_state, "state": {"key": np_state["state"]["key"].tolist(),
                                        "pos": int(np_state["state"]["pos"])}},
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any],
                      generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Put back what :func:`capture_rng_state` took: the next draws repeat the ones after it.
    States may have been loaded onto a GPU (``load_checkpoint(map_location="cuda")``); torch
    takes them from the CPU."""
    random.setstate(_as_tuple(state["python"]))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.asarray(np_state["state"]["key"], dtype=np.uint32),
                         "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"][:torch.cuda.device_count()]])
    saved = state.get("generators", {})
    for name, generator in (generators or {}).items():
        if name not in saved:
            raise KeyError(f"no saved state for generator {name!r} (saved: {sorted(saved)})")
        generator.set_state(saved[name].cpu())


def _as_tuple(value: Any) -> Any:
    """Python's RNG state is nested tuples; keep it so after any list conversion."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
