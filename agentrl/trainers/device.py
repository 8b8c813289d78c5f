"""The torch device a trainer runs on, from the ``device`` config key (auto | cpu | cuda)."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when there is one; ``cuda`` without one fails naming the alternatives."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but no CUDA device is available; use device=cpu or auto")
    return torch.device(name)

