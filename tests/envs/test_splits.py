"""Splits: disjoint seed ranges, every game variant classified, training seeds per step."""

from __future__ import annotations

import importlib

import pytest

from agentrl.envs import GAMES
from agentrl.envs.splits import SEED_RANGES, VARIANTS, split_of, split_seeds, train_seeds


def test_seed_ranges_are_disjoint():
    ranges = list(SEED_RANGES.values())
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            assert a.stop <= b.start or b.stop <= a.start


def test_every_game_preset_is_a_classified_variant():
    classified = {(v.game, v.preset) for v in VARIANTS}
    for game, entry_point in GAMES.items():
        presets = set(importlib.import_module(entry_point.split(":")[0]).PRESETS)
        assert {(game, p) for p in presets} <= classified, f"{game}: unclassified presets"


def test_train_seeds_are_fresh_per_step_and_stay_in_the_train_range():
    first, second = train_seeds(1, 8, seed=0), train_seeds(2, 8, seed=0)
    assert len(set(first + second)) == 16
    assert all(split_of(s) == "train" for s in first + second)
    assert train_seeds(1, 8, seed=0) == first and train_seeds(1, 8, seed=1) != first


def test_split_seeds_rejects_unknown_splits_and_overflow():
    with pytest.raises(ValueError, match="allowed"):
        split_seeds("holdout", 1)
    with pytest.raises(ValueError, match="seeds"):
        split_seeds("val", 2, offset=len(SEED_RANGES["val"]) - 1)


def test_a_pool_is_played_in_turn_and_only_the_pool():
    """``train.pool``: step s plays the pool's next group_num games, wrapping around; the run
    seed does not move them."""
    pool = [11, 22, 33]
    games = [train_seeds(step, 2, seed=7, pool=pool) for step in (1, 2, 3)]
    assert games == [[11, 22], [33, 11], [22, 33]]
    assert train_seeds(1, 2, seed=0, pool=pool) == games[0]
    assert train_seeds(1, 2, seed=7) != games[0]  # without a pool: fresh games
