"""Bandit: one pull of one named arm; the golden arm pays 1, every other arm 0.

    >>> import gymnasium, agentrl
    >>> env = gymnasium.make("agentrl/Bandit-v0", arms=("left", "right"), golden_arm="right")
    >>> obs, info = env.reset(seed=0)      # "Pick one arm: left, right"
    >>> env.step("Right")[1:3]             # (reward, terminated)
    (1.0, True)

Why a game this small exists: it is a sanity check for the whole pipeline (RAGEN ships a
bandit for the same reason), and it is the task of the learning test, which sets the chance
level itself: with ``golden_arm`` fixed (every preset but ``4arms-seeded``), a policy that
learns pays 1 every episode while a random one pays ``1 / len(arms)``; with ``golden_arm``
drawn from the seed (``4arms-seeded``, a control) no policy can beat chance, since the
observation says nothing about which arm pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.envs.base import (
    MAX_ACTION_CHARS, TextGameEnv, Transition, checked_int, normalize_action, resolve_preset,
)

PRESETS: dict[str, dict] = {
    "2arms": {"arms": ("A", "B"), "golden_arm": "B"},
    "4arms": {"arms": ("A", "B", "C", "D"), "golden_arm": "D"},
    # The control: the seed picks the paying arm and the observation does not say which, so no
    # policy beats 1 / len(arms).
    "4arms-seeded": {"arms": ("A", "B", "C", "D"), "golden_arm": None},
}
"""The learnable presets pay the last arm: a model's first guess is more often the first one,
so a learning run starts below chance with greedy decoding and has room to rise."""
DEFAULT_PRESET = "2arms"
MAX_ARMS = 200
"""Arms per game: 200 names of at most MAX_ACTION_CHARS still fit in one observation."""

GOLDEN_REWARD = 1.0
OTHER_REWARD = 0.0
INVALID_REWARD = 0.0


def arm_key(arm: str) -> str:
    """How an arm is matched: the same normalization every action gets (case, spacing)."""
    return normalize_action(arm)


def checked_arms(arms: Any) -> tuple[str, ...]:
    """``arms`` as a tuple of names, or a ValueError saying what is wrong with it."""
    allowed = (f"a list of 2-{MAX_ARMS} distinct non-empty strings of at most "
               f"{MAX_ACTION_CHARS} characters (compared ignoring case and spacing)")
    if isinstance(arms, (str, bytes)) or not isinstance(arms, Sequence):
        raise ValueError(f"Bandit: arms must be {allowed}, got {arms!r}")
    arms = tuple(arms)
    checked_int("Bandit", "len(arms)", len(arms), 2, MAX_ARMS)
    for arm in arms:
        if not isinstance(arm, str) or not arm_key(arm) or len(arm) > MAX_ACTION_CHARS:
            raise ValueError(f"Bandit: arms must be {allowed}; bad arm {arm!r}")
    keys = [arm_key(arm) for arm in arms]
    clashes = sorted({key for key in keys if keys.count(key) > 1})
    if clashes:
        raise ValueError(f"Bandit: arms must be {allowed}; {clashes} name(s) more than one arm")
    return arms


class BanditEnv(TextGameEnv):
    """Bandit: a one-turn game, pull one of the listed arms.

    ## Actions
    The name of an arm, matched ignoring case and extra spaces (``"  a "`` pulls ``A``). Any
    other text is invalid (``action_is_valid=False``, reward 0) and pulls nothing.

    ## Observation
    ``Pick one arm: A, B``: the arm names as given, in order, joined by ``", "``. After the
    pull a second line says which arm was pulled and what it paid.

    ## Starting state
    The golden arm is ``golden_arm`` when given; otherwise every arm gets a hidden value drawn
    uniformly from [0, 1) from the seed and the golden arm is the one with the highest value
    (so uniform over the arms, and different seeds reward different arms).

    ## Rewards
    1 for pulling the golden arm, 0 for any other arm, 0 for invalid text.

    ## Episode end
    Terminated after the first valid action (one pull), with success when it pulled the golden
    arm. Invalid text does not end it; it is truncated after ``max_steps`` actions.

    ## Arguments
    - ``preset``: ``"2arms"`` (default: arms A and B, B pays), ``"4arms"`` (A, B, C, D; D
      pays) or ``"4arms-seeded"`` (A-D, the golden arm drawn from the seed: unlearnable).
    - ``arms``: the arm names, 2-200 distinct non-empty strings (any text: spaces and
      punctuation are fine, e.g. a token's text; at most 256 characters each). Distinct means
      distinct after lower-casing and collapsing whitespace.
    - ``golden_arm``: the arm that pays, one of ``arms`` (matched like an action); ``None``
      draws it from the seed.
    - ``max_steps``: actions before truncation (default 100); ``render_mode``: ``"ansi"``.

    ## Version history
    - v0: first version.
    """

    rules = (
        "Bandit: pull one arm, once. One of the arms pays a reward of 1, the others pay 0.\n"
        "Action: the name of one of the listed arms."
    )

    def __init__(self, preset: str = DEFAULT_PRESET, arms: Sequence[str] | None = None,
                 golden_arm: str | None = None, max_steps: int = 100,
                 render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("Bandit", PRESETS, preset, arms=arms, golden_arm=golden_arm)
        self.preset = preset
        self.arms = checked_arms(settings["arms"])
        self._by_key = {arm_key(arm): arm for arm in self.arms}
        self.fixed_golden_arm = self._checked_golden(settings["golden_arm"])
        self.golden_arm = self.fixed_golden_arm or self.arms[0]  # until reset draws one
        self.pulled: str | None = None

    def _checked_golden(self, golden: Any) -> str | None:
        if golden is None:
            return None
        arm = self._by_key.get(arm_key(golden)) if isinstance(golden, str) else None
        if arm is None:
            raise ValueError(f"Bandit: golden_arm must be one of {list(self.arms)} or None, "
                             f"got {golden!r}")
        return arm

    def _new_game(self) -> None:
        self.pulled = None
        self.golden_arm = self.fixed_golden_arm
        if self.golden_arm is None:
            values = self.np_random.random(len(self.arms))
            self.golden_arm = self.arms[int(np.argmax(values))]

    instance_partition = "none"
    """Too small to split (one instance, or one per arm): the Bandit checks the pipeline and
    carries no held-out learning claim."""

    def instance_key(self) -> str:
        return f"{self.arms}->{self.golden_arm}"

    def _step(self, action: str) -> Transition:
        arm = self._by_key.get(action)
        if arm is None:
            return Transition(INVALID_REWARD, valid=False, effective=False)
        self.pulled = arm
        won = arm == self.golden_arm
        return Transition(GOLDEN_REWARD if won else OTHER_REWARD, valid=True, effective=True,
                          terminated=True, success=won)

    def valid_actions(self) -> list[str]:
        return list(self.arms)

    def oracle_plan(self) -> list[str] | None:
        if self.pulled is None:
            return [self.golden_arm]
        return [] if self.success else None  # the one pull is spent

    def render(self) -> str:
        text = f"Pick one arm: {', '.join(self.arms)}"
        if self.pulled is not None:
            paid = GOLDEN_REWARD if self.success else OTHER_REWARD
            text += f"\nYou pulled {self.pulled}: reward {paid:g}."
        return text
