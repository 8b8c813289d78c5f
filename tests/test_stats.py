"""Wilson's 95% interval of a success rate (known values, edges, bad input), and the paired
comparison of two players on the same games (McNemar, the interval of the difference)."""

from __future__ import annotations

import pytest

from agentrl.evaluation.stats import (
    Z_95, binomial_p, mcnemar, mean_difference, paired_difference, paired_over_seeds,
    seed_interval, student_t_95, student_t_p, wilson_interval,
)


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
    b = [True] * 3 + [False] * 7            # 3 games only a won, none only b won
    gain, (low, high) = paired_difference(a, b)
    assert gain == pytest.approx(0.3)
    # Agresti-Min by hand: 0.5 added to each cell of the 2x2 table, n = 10 + 2
    only_a, only_b = 3.5 / 12, 0.5 / 12
    half = Z_95 * ((only_a + only_b - (only_a - only_b) ** 2) / 12) ** 0.5
    assert (low, high) == pytest.approx((0.25 - half, 0.25 + half))
    # never a point: players that never disagree still leave a range, within [-1, 1]
    _, (same_low, same_high) = paired_difference([True, False] * 5, [True, False] * 5)
    assert same_low < 0 < same_high
    assert paired_difference([True] * 10, [False] * 10)[1][1] == 1.0
    # the same split on 10x the games: a narrower interval
    _, (many_low, many_high) = paired_difference(a * 10, b * 10)
    assert many_low < 0.3 < many_high and many_high - many_low < (high - low) / 2
    with pytest.raises(ValueError, match="same games"):
        paired_difference([True], [True, False])
    with pytest.raises(ValueError, match="same games"):
        paired_difference([], [])


def test_the_mean_of_per_game_differences_and_its_interval():
    diffs = [1.0, 0.0, 0.0, -1.0 / 3, 1.0 / 3]
    mean, (low, high) = mean_difference(diffs)
    assert mean == pytest.approx(0.2)
    sd = (sum((d - 0.2) ** 2 for d in diffs) / 4) ** 0.5
    assert (low, high) == pytest.approx((0.2 - Z_95 * sd / 5 ** 0.5, 0.2 + Z_95 * sd / 5 ** 0.5))
    assert mean_difference([1.0] * 4) == (1.0, (1.0, 1.0))
    with pytest.raises(ValueError, match="no games"):
        mean_difference([])


def test_seeds_on_the_same_games_count_each_game_once():
    # game 0: a wins on both seeds; game 1: a on seed 0, b on seed 1 (a tie over the seeds);
    # game 2: b on seed 1 only; game 3: never apart
    a = [[True, True, False, True], [True, False, False, False]]
    b = [[False, False, False, True], [False, True, True, False]]
    result = paired_over_seeds(a, b)
    assert (result["better"], result["worse"], result["games"]) == (1, 1, 4)
    assert result["gain"] == pytest.approx((1 + 0 - 0.5 + 0) / 4)
    assert result["p"] == pytest.approx(binomial_p(1, 1))
    # McNemar's counts added over the seeds would see 3 games for a and 2 for b
    assert sum(mcnemar(x, y)["only_a"] for x, y in zip(a, b)) == 3
    with pytest.raises(ValueError, match="same games"):
        paired_over_seeds(a, [b[0]])
    with pytest.raises(ValueError, match="same games"):
        paired_over_seeds([[True]], [[True, False]])


def test_the_seed_interval_has_the_runs_as_its_units():
    # 3 seeds on 4 games: per-seed differences +0.5, 0 and +0.25 (mean 0.25, sd 0.25)
    a = [[True, True, False, False], [True, False, False, False], [True, True, False, False]]
    b = [[False, False, False, False], [True, False, False, False], [True, False, False, False]]
    low, high = paired_over_seeds(a, b)["seed_ci95"]
    half = 4.303 * 0.25 / 3 ** 0.5  # Student's t, 2 degrees of freedom
    assert (low, high) == pytest.approx((0.25 - half, 0.25 + half))
    # seeds that agree leave no run-to-run spread, however the games differ
    agree = paired_over_seeds([a[0], a[0]], [b[0], b[0]])
    assert agree["seed_ci95"] == pytest.approx([0.5, 0.5])
    assert agree["gain_ci95"][1] - agree["gain_ci95"][0] > 0.5
    assert paired_over_seeds(a[:1], b[:1])["seed_ci95"] is None
    assert seed_interval([0.1, 0.1]) == pytest.approx([0.1, 0.1])


@pytest.mark.parametrize("df, exact", [(3, 3.182), (5, 2.571), (9, 2.262), (11, 2.201),
                                       (20, 2.086), (30, 2.042), (120, 1.980), (1000, 1.962)])
def test_student_t_quantiles(df, exact):
    assert student_t_95(df) == pytest.approx(exact, abs=0.0005)
    assert student_t_95(df) > Z_95


def test_student_t_needs_a_degree_of_freedom():
    with pytest.raises(ValueError, match="degrees of freedom"):
        student_t_95(0)


@pytest.mark.parametrize("t, df, p", [(2.447, 6, 0.05), (4.303, 2, 0.05), (12.706, 1, 0.05),
                                      (2.0, 30, 0.0546), (0.0, 5, 1.0), (1e9, 1, 0.0)])
def test_student_t_p(t, df, p):
    assert student_t_p(t, df) == pytest.approx(p, abs=2e-4)
