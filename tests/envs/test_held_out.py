"""Held out means never seen: over large seed samples of each split, no held-out game of any
preset is an instance of a training game of the same game (any preset: renderings share
instances), and the first observations of the fully observed games agree."""

from __future__ import annotations

import importlib
from collections import defaultdict

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the games)
from agentrl.envs import GAMES, env_id
from agentrl.envs.base import TextGameEnv
from agentrl.envs.splits import INSTANCE_SHARES, instance_split, split_seeds

SAMPLE = {"BlocksWorld": 3000, "Tetris": 500, "Sokoban": 150, "BabyAI": 120,
          "TextWorldExpress": 60, "TextWorld": 3}
"""Training seeds sampled per preset (held-out splits: a third as many each); sized by how long
a game takes to generate (TextWorld compiles each game: ~1-2 s)."""
FULLY_OBSERVED = {"BlocksWorld", "Sokoban"}
"""Games whose first observation is the whole instance: equal observations, equal games."""


def presets(game: str) -> list[str]:
    return sorted(importlib.import_module(GAMES[game].split(":")[0]).PRESETS)


def first_games(game: str, preset: str, split: str, count: int) -> tuple[set, set]:
    """(instance keys, first observations) of ``count`` seeds of ``split``."""
    env = gymnasium.make(env_id(game), preset=preset)
    keys, observations = set(), set()
    for seed in split_seeds(split, count):
        obs, _ = env.reset(seed=seed)
        keys.add(env.unwrapped.instance_key())
        observations.add(obs)
    env.close()
    return keys, observations


@pytest.mark.slow
@pytest.mark.parametrize("game", sorted(set(GAMES) - {"Bandit"}))
def test_held_out_games_are_never_training_instances(game):
    seen = defaultdict(set)
    for preset in presets(game):
        count = SAMPLE[game]
        for split, n in (("train", count), ("val", max(1, count // 3)), ("test", max(1, count // 3))):
            keys, observations = first_games(game, preset, split, n)
            seen[split, "key"] |= keys
            seen[split, "obs", preset] |= observations
    for held_out in ("val", "test"):
        shared = seen["train", "key"] & seen[held_out, "key"]
        assert not shared, f"{game}: {len(shared)} {held_out} games are training instances"
        if game in FULLY_OBSERVED:
            for preset in presets(game):
                same = seen["train", "obs", preset] & seen[held_out, "obs", preset]
                assert not same, f"{game} {preset}: {len(same)} {held_out} first views repeat"


@pytest.mark.parametrize("game", sorted(GAMES))
def test_every_game_declares_how_its_held_out_games_stay_apart(game):
    module, name = GAMES[game].split(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, TextGameEnv)
    assert cls.instance_partition in ("hash", "seed", "none")
    if cls.instance_partition == "none":
        assert game == "Bandit", f"{game} must split its instances: only the Bandit is too small"


def test_small_instance_spaces_split_every_instance_one_way():
    """Every 3-block BlocksWorld pair lands in exactly the split its key says, and every split
    gets a share near its own (156 pairs)."""
    env = gymnasium.make(env_id("BlocksWorld"), min_blocks=3, max_blocks=3)
    owner = {}
    for split in INSTANCE_SHARES:
        for seed in split_seeds(split, 600):
            env.reset(seed=seed)
            key = env.unwrapped.instance_key()
            assert owner.setdefault(key, split) == split, f"{key} in {owner[key]} and {split}"
            assert instance_split(key) == split
    counts = {split: sum(1 for s in owner.values() if s == split) for split in INSTANCE_SHARES}
    assert sum(counts.values()) == 156
    assert all(counts[split] >= 0.5 * share * 156 for split, share in INSTANCE_SHARES.items())


def test_a_redrawn_game_is_still_a_function_of_its_seed():
    env = gymnasium.make(env_id("Sokoban"), preset="6x6")
    seed = next(s for s in split_seeds("val", 50) if env.reset(seed=s) and env.unwrapped.instance_draw)
    first, _ = env.reset(seed=seed)
    again = gymnasium.make(env_id("Sokoban"), preset="6x6")
    assert again.reset(seed=seed)[0] == first


def test_a_fixed_board_resets_with_any_split_seed():
    from agentrl.envs.sokoban import SokobanEnv

    env = SokobanEnv.from_board("######\n#PX_O#\n######")
    boards = {env.reset(seed=seed)[0] for seed in (0, 1_000_000, 2_000_000)}
    assert len(boards) == 1


def test_a_tetris_game_does_not_depend_on_the_step_budget():
    """Redraws take one number of np_random per game, so max_steps (the sequence's length)
    cannot change which game a seed plays."""
    short = gymnasium.make(env_id("Tetris"), max_steps=40).unwrapped
    long = gymnasium.make(env_id("Tetris")).unwrapped
    for seed in split_seeds("val", 20):
        short.reset(seed=seed)
        long.reset(seed=seed)
        assert short.instance_key() == long.instance_key()
