"""Which seeds, game instances and game variants are for training and which are held out.

Seeds: every split owns a disjoint range. Disjoint seeds are not enough where a game's instance
space is small (3 000 training seeds give only 1 879 distinct 6x6 Sokoban rooms; 3-block
BlocksWorld has 156 (start, goal) pairs), so the **instances** are partitioned too: each
instance (room, start and goal, piece sequence, world and mission) has a key, the key's hash
gives it one split (:func:`instance_split`, shares :data:`INSTANCE_SHARES`), and a game reset
with a seed of one split redraws until its instance belongs to that split
(:meth:`agentrl.envs.base.TextGameEnv.reset`). A held-out game is then never a training
instance by construction, whatever the seeds.
Variants: each game has training presets and harder held-out presets (bigger boards, more
boxes, more blocks, longer quests) that training never sees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

SEED_RANGES: dict[str, range] = {
    "train": range(0, 1_000_000),
    "val": range(1_000_000, 2_000_000),
    "test": range(2_000_000, 3_000_000),
}


def split_seeds(split: str, count: int, offset: int = 0) -> list[int]:
    """``count`` consecutive seeds of ``split``, starting ``offset`` seeds into its range."""
    if split not in SEED_RANGES:
        raise ValueError(f"unknown split={split!r}; allowed: {sorted(SEED_RANGES)}")
    seeds = SEED_RANGES[split]
    if count < 0 or offset < 0 or offset + count > len(seeds):
        raise ValueError(f"split {split!r} has {len(seeds)} seeds; asked for {count} from {offset}")
    return list(seeds[offset : offset + count])


def train_seeds(step: int, group_num: int, seed: int, pool: Sequence[int] = ()) -> list[int]:
    """Training seeds of ``step`` (from 1): a fresh block of the train range per step, a function
    of the step and the run seed only, so a resumed step replays the same games and both
    trainers (local, verl task files) play the same ones. With a ``pool`` (``train.pool``), the
    step's games are the pool's next ``group_num`` in turn instead."""
    if pool:
        return [pool[((step - 1) * group_num + g) % len(pool)] for g in range(group_num)]
    span = len(SEED_RANGES["train"]) - group_num
    offset = (seed * 100_003 + (step - 1) * group_num) % span
    return split_seeds("train", group_num, offset)


def split_of(seed: int) -> str:
    for split, seeds in SEED_RANGES.items():
        if seed in seeds:
            return split
    raise ValueError(f"seed {seed} is in no split; ranges: {SEED_RANGES}")


def split_of_or_none(seed: int | None) -> str | None:
    """The split of ``seed``, or None for no seed or one outside every range (plain Gymnasium
    use: any seed is allowed, and it constrains nothing)."""
    if seed is None or not any(seed in seeds for seeds in SEED_RANGES.values()):
        return None
    return split_of(seed)


INSTANCE_SHARES: dict[str, float] = {"train": 0.6, "val": 0.2, "test": 0.2}
"""The share of every game's instance space each split owns. Held-out splits are large enough
that a held-out reset redraws ~5 times on average (a millisecond for the generated games)."""


def instance_split(key: str) -> str:
    """The split that owns the instance with ``key``: a stable hash (the same on every machine
    and Python), mapped onto :data:`INSTANCE_SHARES`."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    point = int.from_bytes(digest, "big") / 2**64
    for split, share in INSTANCE_SHARES.items():
        if point < share:
            return split
        point -= share
    return split  # rounding at the top end


@dataclass(frozen=True)
class Variant:
    game: str
    preset: str
    held_out: bool
    why: str = ""


VARIANTS: tuple[Variant, ...] = (
    Variant("Sokoban", "6x6", False),
    Variant("Sokoban", "8x8", False),
    Variant("Sokoban", "8x8-2boxes", True, "bigger room and a second box"),
    Variant("Tetris", "3x3-type1", False),
    Variant("Tetris", "4x4-type1", True, "bigger board"),
    Variant("Tetris", "3x3-type2", True, "two piece types"),
    Variant("Tetris", "4x4-type2", True, "bigger board and two piece types"),
    Variant("BlocksWorld", "text", False),
    Variant("BlocksWorld", "1d", False),
    Variant("BlocksWorld", "2d", False),
    Variant("BlocksWorld", "text-5", True, "five blocks"),
    Variant("BlocksWorld", "1d-5", True, "five blocks"),
    Variant("BlocksWorld", "2d-5", True, "five blocks"),
    Variant("TextWorld", "easy", False),
    Variant("TextWorld", "medium", True, "more rooms and objects, longer quest"),
    Variant("TextWorld", "hard", True, "larger world, longest quest"),
    Variant("Bandit", "2arms", False),
    Variant("Bandit", "4arms", False),  # a sanity check: no harder twin to hold out
    Variant("Bandit", "4arms-seeded", False),  # the control: no policy beats chance
    Variant("BabyAI", "goto-0", False),
    Variant("BabyAI", "goto-3", False),
    Variant("BabyAI", "goto-5", False),
    Variant("BabyAI", "pickup-0", False),
    Variant("BabyAI", "pickup-3", False),
    Variant("BabyAI", "pickup-5", False),
    Variant("BabyAI", "goto-8", True, "eight distractors"),
    Variant("BabyAI", "goto-5-large", True, "room larger than the view"),
    Variant("BabyAI", "pickup-8", True, "eight distractors"),
    Variant("BabyAI", "pickup-5-large", True, "room larger than the view"),
    Variant("BabyAI", "empty-8x8", False),
    Variant("BabyAI", "empty-12x12", True, "bigger room"),
    Variant("BabyAI", "doorkey-5x5", False),
    Variant("BabyAI", "doorkey-8x8", True, "bigger rooms"),
    Variant("TextWorldExpress", "coin", False),
    Variant("TextWorldExpress", "cooking", False),
    Variant("TextWorldExpress", "twc", False),
    Variant("TextWorldExpress", "coin-hard", True, "more rooms, doors, distractors"),
    Variant("TextWorldExpress", "cooking-hard", True, "more rooms, doors, ingredients"),
    Variant("TextWorldExpress", "twc-hard", True, "two rooms, four items"),
)
