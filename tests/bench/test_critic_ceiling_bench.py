"""scripts/bench/critic_ceiling.py: its game model plays the environment's rules, and a
baseline that knows more explains more."""

from __future__ import annotations

import json
import random

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("scripts/bench/critic_ceiling.py")


def test_a_perfect_policy_wins_in_the_oracle_distance_with_the_games_rewards(bench):
    rng = random.Random(0)
    for _ in range(50):
        start, goal = bench.new_game(rng)
        distance = bench.distances(len(start))[goal][start]
        rows, won = bench.episode(rng, start, goal, skill=1.0)
        assert won and len(rows) == distance <= bench.TURNS
        assert [g for *_, g in rows] == [10.0 - (distance - t) for t in range(distance)]
        assert [key[1] for key, *_ in rows] == list(range(distance, 0, -1))  # distance falls


def test_a_random_policy_rarely_wins_and_its_returns_count_every_move(bench):
    rng = random.Random(1)
    results = [bench.episode(rng, *bench.new_game(rng), skill=0.0) for _ in range(300)]
    assert 0 < sum(won for _, won in results) < 150
    for rows, won in results:
        if not won:
            assert len(rows) == bench.TURNS and rows[0][-1] == -bench.TURNS


def test_knowing_the_skill_explains_more_and_dropping_keeps_fewer_groups(bench, tmp_path):
    out = tmp_path / "ceiling.json"
    result = bench.main(["--steps", "60", "--skill", "0.7", "--table-episodes", "4000",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == result
    keepall, dropwon = result["rows"]
    assert (keepall["groups"], dropwon["groups"]) == ("keepall", "dropwon")
    assert keepall["kept_groups_share"] == 1 and dropwon["kept_groups_share"] < 1
    assert keepall["success"] == dropwon["success"]  # the same games and episodes
    for row in result["rows"]:
        assert row["state+skill"]["ev_mean"] > row["state"]["ev_mean"] > 0


def test_only_groups_that_all_won_alike_are_dropped_as_the_trainer_drops_them(bench):
    """The trainer leaves out a group whose returns do not differ and that all won: an all-won
    group whose wins took different move counts still compares something and is kept."""
    def won_in(moves):
        return [(None, None, None, 10.0 - moves)], True

    lost = ([(None, None, None, -6.0)], False)
    assert bench.dropped([won_in(2)] * 8)
    assert not bench.dropped([won_in(2)] * 7 + [won_in(3)])
    assert not bench.dropped([lost] * 8)  # all lost alike: the preset keeps it
    assert not bench.dropped([won_in(2)] * 7 + [lost])


def test_siblings_are_the_other_episodes_of_the_group_from_the_same_board_and_turn(bench):
    """Turn 1 of group 0's three episodes shares a board; group 1 plays the same board but is
    another game; turn 2 of episode 0 meets that board again, but later: not a sibling."""
    board = ((0, 1, 2),)
    rows = [((3, 2, 6), None, board, 4.0), ((3, 1, 5), None, board, 5.0),
            ((3, 2, 6), None, board, 8.0), ((3, 2, 6), None, board, 0.0),
            ((3, 2, 6), None, board, -6.0)]
    places = [(0, 0), (0, 0), (0, 1), (0, 2), (1, 0)]
    prior = torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0])
    values = bench.with_siblings(prior, rows, places, pseudocount=2.0)
    assert values.tolist() == pytest.approx([(2 * 4.0 + 2 * 1.0) / 4, 2.0, (2 * 2.0 + 2) / 4,
                                             (2 * 6.0 + 2) / 4, 1.0])
