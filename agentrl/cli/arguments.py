"""What the commands' options must be, checked before any work: counts, numbers, a path to
write, a device. An argparse ``type=`` fails as argparse's usage error; the others raise a
``ValueError`` naming the flag, which :func:`agentrl.cli.main` turns into the same exit 2.

    parser.add_argument("--groups", type=positive_int, default=4)
    writable_path(args.out, "--out")
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

__all__ = ["check_device", "check_folder_to_write", "non_negative_float", "non_negative_int",
           "positive_int", "writable_path"]


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (temperatures, delays)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def writable_path(path: str | Path, flag: str, folder: bool = False) -> Path:
    """``path`` (a file, or a ``folder``) checked before any work: not the other kind, and
    its folder can be made and written. ``ValueError`` naming ``flag`` otherwise."""
    path = Path(path).expanduser()
    kind = "folder" if folder else "file"
    if path.exists() and path.is_dir() != folder:
        raise ValueError(f"{flag} {str(path)!r} is a {'file' if folder else 'folder'}; allowed: "
                         f"the path of a {kind} to write")
    parent = path if folder else path.parent
    blocking = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: {blocking} is a file, not a folder; allowed: a "
                         f"{kind} under a writable folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{flag} {str(path)!r}: cannot make {parent} ({error.strerror}); "
                         f"allowed: a {kind} under a writable folder") from None
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {str(path)!r}: {parent} is not writable; allowed: a {kind} "
                         "under a writable folder")
    return path


def check_folder_to_write(path: str | Path, key: str) -> None:
    """A folder a command will make and write later (a config key like ``sft.output_dir``),
    checked now and made not: not a file, under no file, and its nearest existing folder
    writable. ``ValueError`` naming ``key`` otherwise."""
    path = Path(path).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under {existing}, a file"
        raise ValueError(f"{key}={str(path)!r} {where}; allowed: a folder to write (new or "
                         "existing) under a writable folder")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{key}={str(path)!r}: {existing} is not writable; allowed: a folder "
                         "under a writable folder")


def check_device(device: str, flag: str = "--device") -> None:
    """``cuda`` only where torch sees a CUDA GPU."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag} cuda: this torch sees no CUDA GPU ({torch.__version__}); "
                         "allowed: cpu, or auto (cuda when available)")
