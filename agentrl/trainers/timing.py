"""Seconds per named stage of a training step, reported as ``timing/<stage>_s`` metrics."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator

__all__ = ["StageTimer"]


class StageTimer:
    """Seconds per named stage of one step, as ``timing/<stage>_s`` metrics."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"timing/{name}_s": s for name, s in self.seconds.items()}
        out["timing/step_s"] = sum(self.seconds.values())
        return out
