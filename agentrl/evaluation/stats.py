"""Confidence intervals for success rates: a rate from 32 games is a range, not a number; and
the 4 significant digits a report keeps of a metric.

    >>> from agentrl.evaluation.stats import wilson_interval
    >>> wilson_interval(16, 32)          # 50% of 32 games
    (0.336..., 0.663...)

Wilson's score interval, not the normal approximation ``p +- 1.96 sqrt(p (1 - p) / n)``: that
one collapses to a width of 0 at 0 and 100% success (the rates an untrained and a solved policy
sit at) and leaves [0, 1] near them; Wilson's stays inside [0, 1] and keeps its coverage with
few games.

    >>> rounded(0.123456), rounded(float("nan"))
    (0.1235, None)
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["Z_95", "rounded", "wilson_interval"]

Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a success rate ``successes / n``; ``(0, 1)`` when n = 0.

    ``successes`` may be a float (a logged rate times n); it is rounded to the nearest count.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = round(successes) / n
    z2 = z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def rounded(value: Any) -> float | None:
    """``value`` to 4 significant digits; ``None`` where it is no finite number (a missing or
    non-numeric metric), so a report page or a reference file never holds NaN."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")
