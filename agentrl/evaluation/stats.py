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

Two models on the same games are compared game by game: the games one won and the other lost
carry the whole difference (McNemar), and the interval of the paired difference is narrower
than two rates' intervals side by side, since a game hard for one is mostly hard for both.

    >>> mcnemar([True, True, False, True], [False, True, False, False])
    {'only_a': 2, 'only_b': 0, 'p': 0.5}

Models trained on several seeds are compared with the games as the units (how sure the games
make the difference between these runs) and with the seeds as the units (Student's t over the
per-seed differences: what another training run would move).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["Z_95", "binomial_p", "mcnemar", "mean_difference", "paired_difference",
           "paired_over_seeds", "rounded", "seed_interval", "student_t_95",
           "student_t_p", "wilson_interval"]

Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""

_T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t quantile of a two-sided 95% interval with 1-10 degrees of freedom."""


def student_t_95(df: int) -> float:
    """Student's t quantile of a two-sided 95% interval with ``df`` degrees of freedom: the
    table to 10, then the Cornish-Fisher series through ``1 / df^3`` (within 0.00015 of the
    exact quantile from 11 on)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T_95):
        return _T_95[df - 1]
    z = Z_95
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


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


def mcnemar(a: list[bool], b: list[bool]) -> dict[str, Any]:
    """McNemar's exact test of two players on the same games: ``only_a`` (games ``a`` won and
    ``b`` lost), ``only_b``, and the two-sided p of that split under Binomial(n, 1/2), n the
    discordant games (1.0 when there are none)."""
    if len(a) != len(b):
        raise ValueError(f"paired results need the same games, got {len(a)} and {len(b)}")
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    return {"only_a": only_a, "only_b": only_b, "p": binomial_p(only_a, only_b)}


def binomial_p(only_a: int, only_b: int) -> float:
    """Two-sided exact p of ``only_a`` against ``only_b`` discordant games under p = 1/2."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_difference(a: list[bool], b: list[bool], z: float = Z_95
                      ) -> tuple[float, tuple[float, float]]:
    """``a``'s success rate minus ``b``'s on the same games, and the Agresti-Min 95% interval of
    that paired difference: Wald's on the 2x2 table with 0.5 added to each cell, which keeps a
    width when the players never disagree (plain Wald's is then a point) and its coverage near
    the edges."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired results need the same games, got {len(a)} and {len(b)}")
    split = mcnemar(a, b)
    n = len(a) + 2
    only_a, only_b = (split["only_a"] + 0.5) / n, (split["only_b"] + 0.5) / n
    shifted = only_a - only_b
    half = z * math.sqrt(max(only_a + only_b - shifted ** 2, 0.0) / n)
    return ((split["only_a"] - split["only_b"]) / len(a),
            (max(-1.0, shifted - half), min(1.0, shifted + half)))


def student_t_p(t: float, df: int) -> float:
    """The two-sided p of Student's ``t`` with ``df`` degrees of freedom: one minus the density's
    integral over ``[-|t|, |t|]``. With ``x = sqrt(df) tan(a)`` the integrand is ``cos(a) ** (df
    - 1)`` on ``[0, atan(|t| / sqrt(df))]``, smooth and bounded for any ``t``: Simpson's rule,
    2,000 intervals."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    norm = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    n, end = 2000, math.atan(abs(t) / math.sqrt(df))
    h = end / n
    inner = sum((4 if i % 2 else 2) * math.cos(i * h) ** (df - 1) for i in range(1, n))
    area = norm * h / 3 * (1.0 + inner + math.cos(end) ** (df - 1))
    return min(1.0, max(0.0, 1.0 - 2.0 * area))


def mean_difference(diffs: list[float], z: float = Z_95) -> tuple[float, tuple[float, float]]:
    """The mean of per-game differences (each game's over several runs, say) and its normal
    interval ``mean +- z sd / sqrt(n)``: the games, not the runs, are the independent units."""
    if not diffs:
        raise ValueError("no games to compare")
    n = len(diffs)
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(variance / n)
    return mean, (max(-1.0, mean - half), min(1.0, mean + half))


def paired_over_seeds(a: list[list[bool]], b: list[list[bool]]) -> dict[str, Any]:
    """Two players trained on several seeds (``a[seed][game]``), every seed on the same games:
    the games, not the seeds' wins, are the independent units. Each game's difference ``a - b``
    averaged over the seeds; their mean and interval (:func:`mean_difference`); and the sign
    test of the games the seeds favour ``a`` on (``better``) against those they favour ``b``
    on (``worse``). Adding McNemar's counts over seeds instead would count a game once per seed,
    as if each were new.

    That interval holds the training runs fixed: it says how sure the games make the
    difference between these runs, not how much another run would move it. ``seed_ci95`` has
    the seeds as the units: Student's t interval of the per-seed differences of the success
    rates (n - 1 degrees of freedom; None with one seed). With 3 seeds it is wide (t = 4.3),
    and it is the one a run-to-run spread shows in."""
    if len(a) != len(b) or not a or len({len(wins) for wins in (*a, *b)}) != 1:
        raise ValueError("paired seeds need the same games on every seed for both players")
    per_game = [sum(int(x) - int(y) for x, y in zip(games_a, games_b)) / len(a)
                for games_a, games_b in zip(zip(*a), zip(*b))]
    gain, interval = mean_difference(per_game)
    better, worse = sum(d > 0 for d in per_game), sum(d < 0 for d in per_game)
    per_seed = [(sum(games_a) - sum(games_b)) / len(games_a) for games_a, games_b in zip(a, b)]
    return {"gain": gain, "gain_ci95": list(interval), "games": len(per_game),
            "better": better, "worse": worse, "p": binomial_p(better, worse),
            "seed_ci95": seed_interval(per_seed)}


def seed_interval(per_seed: list[float]) -> list[float] | None:
    """Student's t 95% interval of the mean of ``per_seed`` differences of rates (fractions,
    so the interval is kept inside [-1, 1]): :func:`mean_difference` with t's quantile in
    place of z's; None for one."""
    if len(per_seed) < 2:
        return None
    return list(mean_difference(per_seed, student_t_95(len(per_seed) - 1))[1])
