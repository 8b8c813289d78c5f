"""Wilson's 95% interval of a success rate (known values, edges, bad input), and the paired
comparison of two players on the same games (McNemar, the interval of the difference)."""

from __future__ import annotations

import pytest

from agentrl.evaluation.stats import Z_95, binomial_p, mcnemar, paired_difference, wilson_interval


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


def test_mcnemar_counts_the_games_one_won_and_the_other_lost():
    a = [True, True, True, False, False, True]
    b = [True, False, False, False, True, True]
    assert mcnemar(a, b) == {"only_a": 2, "only_b": 1, "p": 1.0}  # 2 * (1 + 3) / 8 > 1
    # 6 against 0: two-sided p = 2 / 2^6
    assert mcnemar([True] * 6 + [False], [False] * 7)["p"] == pytest.approx(2 / 64)
    # 9 against 1: 2 * (C(10,0) + C(10,1)) / 2^10
    assert binomial_p(9, 1) == pytest.approx(2 * 11 / 1024)
    assert binomial_p(1, 9) == binomial_p(9, 1)
    assert binomial_p(0, 0) == 1.0  # no discordant game: no evidence either way
    assert binomial_p(5, 5) == 1.0
    with pytest.raises(ValueError, match="same games"):
        mcnemar([True], [True, False])


def test_the_paired_difference_and_its_interval():
    a = [True] * 6 + [False] * 4
    b = [True] * 3 + [False] * 7            # per game: 3 x +1, 7 x 0
    gain, (low, high) = paired_difference(a, b)
    assert gain == pytest.approx(0.3)
    sd = (sum((d - 0.3) ** 2 for d in [1] * 3 + [0] * 7) / 9) ** 0.5
    assert (low, high) == pytest.approx((0.3 - Z_95 * sd / 10 ** 0.5, 0.3 + Z_95 * sd / 10 ** 0.5))
    # the same two rates on games where the players disagree more: a wider interval
    _, (wide_low, wide_high) = paired_difference([True] * 6 + [False] * 4,
                                                 [False] * 6 + [True] * 3 + [False])
    assert wide_high - wide_low > high - low
    assert paired_difference([True, False], [True, False]) == (0.0, (0.0, 0.0))
    with pytest.raises(ValueError, match="same games"):
        paired_difference([True], [True, False])
    with pytest.raises(ValueError, match="same games"):
        paired_difference([], [])
