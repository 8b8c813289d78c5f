"""Wilson's 95% interval of a success rate: known values, edges, bad input."""

from __future__ import annotations

import pytest

from agentrl.evaluation.stats import wilson_interval


@pytest.mark.parametrize("successes, n, low, high", [
    (16, 32, 0.336309, 0.663691),   # 50% of 32 games: +-16.4 points
    (0, 32, 0.0, 0.107179),         # none solved: still up to 10.7%
    (32, 32, 0.892821, 1.0),
    (1, 2, 0.094531, 0.905469),     # the old CPU validation: 2 games say next to nothing
    (81, 263, 0.255289, 0.366210),
])
def test_known_values(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=1e-6)


def test_matches_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 5, 32, 200):
        for k in range(0, n + 1, max(1, n // 7)):
            ci = stats.binomtest(k, n).proportion_ci(method="wilson")
            assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_a_logged_rate_times_its_count_is_rounded_to_a_count():
    assert wilson_interval(0.3 * 10, 10) == wilson_interval(3, 10)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("successes, n", [(-1, 4), (5, 4), (1, -1)])
def test_impossible_counts_fail(successes, n):
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(successes, n)
