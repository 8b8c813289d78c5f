"""Shared plumbing for text games: untrusted action text, step budget, the `info` contract.

A game subclasses :class:`TextGameEnv` and fills in six hooks. Everything a language model can
get wrong (non-string, empty, huge, unicode, odd case or spacing) is absorbed here or in the
game's ``_parse``: it becomes an invalid action handled by the game's own rule, never an
exception.
"""

from __future__ import annotations

import operator
import string
from dataclasses import dataclass
from typing import Any

import gymnasium
from gymnasium.spaces import Text

from agentrl.envs.splits import instance_split, split_of_or_none

MAX_ACTION_CHARS = 256
"""Longer action text is cut before parsing: no command of any game is this long."""

MAX_INSTANCE_DRAWS = 500
"""Redraws a reset may take to land in its seed's split (~5 expected for a held-out split)."""

MAX_OBSERVATION_CHARS = 1 << 16
TEXT_CHARSET = frozenset(string.printable) | frozenset("√")


@dataclass(frozen=True)
class Transition:
    """What one game move did; the base class turns it into Gymnasium's step tuple."""

    reward: float
    valid: bool
    effective: bool
    terminated: bool = False
    success: bool = False


def normalize_action(action: Any) -> str:
    """Any action object -> lower-case text with single spaces, at most MAX_ACTION_CHARS long."""
    if not isinstance(action, str):
        action = "" if action is None else str(action)
    return " ".join(action[:MAX_ACTION_CHARS].split()).lower()


class TextGameEnv(gymnasium.Env):
    """A Gymnasium env whose observations and actions are text.

    Subclasses implement:

    - ``_new_game()``: build the initial state from ``self.np_random`` (the only randomness).
    - ``_step(action)``: apply a *normalized* action text and return a :class:`Transition`;
      unparseable or illegal text follows the game's rule and comes back with ``valid=False``.
    - ``valid_actions()``: the legal action strings in the current state.
    - ``oracle_plan()``: actions that solve the game from the current state (``None`` if none).
    - ``render()``: the current state as text.
    - ``instance_key()``: what makes this game this game (room, start and goal, pieces,
      world and mission) as text; equal keys mean the same instance, whatever the seed
      (default: the first observation).

    A reset with a seed of a split (``agentrl.envs.splits``) redraws ``_new_game`` until the
    instance belongs to that split (``instance_split(instance_key())``), so held-out games are
    never training instances. Draws after the first come from ``self.np_random``, which the
    seed fixed: the same seed still gives the same game. A game whose instances cannot be
    split says so with ``instance_partition`` (see there).

    Episodes are truncated after ``max_steps`` actions (``truncated=True``, never ``terminated``),
    so bootstrapping can tell a time limit from a solved or lost game.
    """

    metadata = {"render_modes": ["ansi"]}
    rules: str = ""
    """Goal, actions and symbols in a few lines: shown to people and to agents."""
    worst_legal_reward: float = 0.0
    """The lowest reward one legal action (one of ``valid_actions()``) can get. The agent layer
    prices a malformed reply below a whole turn of such actions, so breaking the format never
    pays better than acting; a game with negative rewards must lower it (the contract test
    checks it against random legal play)."""
    worst_text_reward: float | None = None
    """The lowest reward any action text can get, legal or not, where that is below
    ``worst_legal_reward`` (BlocksWorld: -5 for text that is no move); None: it is not. The
    agent layer prices a malformed reply below a well-formed turn of such texts too, so writing
    the format never pays worse than breaking it."""

    @property
    def worst_action_reward(self) -> float:
        """The lowest reward one action text of a well-formed reply can get."""
        if self.worst_text_reward is None:
            return self.worst_legal_reward
        return min(self.worst_legal_reward, self.worst_text_reward)

    instance_partition: str = "hash"
    """How held-out games stay apart from training instances: ``"hash"`` (the instance key's
    split must be the seed's split), ``"seed"`` (the generator's instance space is so large
    that disjoint seeds suffice; the game's docstring says why), ``"none"`` (too small to split:
    the game carries no held-out learning claim)."""

    def __init__(self, max_steps: int = 100, render_mode: str | None = "ansi"):
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be 'ansi' or None, got {render_mode!r}")
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.action_space = Text(MAX_ACTION_CHARS, min_length=0, charset=TEXT_CHARSET)
        self.observation_space = Text(MAX_OBSERVATION_CHARS, min_length=0, charset=TEXT_CHARSET)
        self.num_steps = 0
        self.done = False
        self.success = False
        self.episode_seed: int | None = None
        """The seed of the last reset (None when reset drew one from entropy)."""
        self.instance_draw = 0
        """How many instances this reset drew before the one it plays (0: the first)."""

    # -- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.episode_seed = seed
        self.num_steps = 0
        self.done = False
        self.success = False
        self._new_split_game(split_of_or_none(seed) if self.instance_partition == "hash" else None)
        return self._observation(), self._info(valid=True, effective=False)

    def _new_split_game(self, split: str | None) -> None:
        """A new game whose instance belongs to ``split`` (any instance for None)."""
        self.instance_draw = 0
        self._new_game()
        while split is not None and instance_split(self.instance_key()) != split:
            self.instance_draw += 1
            if self.instance_draw >= MAX_INSTANCE_DRAWS:
                raise RuntimeError(
                    f"{type(self).__name__}: no instance of split {split!r} in "
                    f"{MAX_INSTANCE_DRAWS} draws for seed {self.episode_seed}: the preset's "
                    "instance space is too small to split; use a larger preset")
            self._new_game()

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.done:
            # Past the end: a no-op, so a caller that keeps stepping gets no reward and no crash.
            return self._observation(), 0.0, True, False, self._info(valid=False, effective=False)
        move = self._step(normalize_action(action))
        self.num_steps += 1
        self.success = self.success or move.success
        truncated = not move.terminated and self.num_steps >= self.max_steps
        self.done = move.terminated or truncated
        info = self._info(valid=move.valid, effective=move.effective)
        return self._observation(), float(move.reward), move.terminated, truncated, info

    def render(self) -> str:
        raise NotImplementedError

    # -- game hooks ----------------------------------------------------------------------------
    def _new_game(self) -> None:
        raise NotImplementedError

    def _step(self, action: str) -> Transition:
        raise NotImplementedError

    def valid_actions(self) -> list[str]:
        raise NotImplementedError

    def oracle_plan(self) -> list[str] | None:
        raise NotImplementedError

    def instance_key(self) -> str:
        """The game instance as text (see the class docstring); read right after a reset.

        By default the first observation: right for a game that shows its whole instance, and
        never splitting one instance two ways; a game with hidden parts names them."""
        return self._observation()

    def _draw_seed(self) -> int:
        """A seed for a library generator seeded per game: the episode's seed on a reset's
        first draw, then children of ``np_random`` (redraws into the seed's split)."""
        if self.episode_seed is not None and self.instance_draw == 0:
            return self.episode_seed
        return seeded_child(self.np_random)

    def _observation(self) -> str:
        """The text an agent sees; the board by default."""
        return self.render()

    def _info(self, valid: bool, effective: bool) -> dict:
        return {
            "success": self.success,
            "action_is_valid": valid,
            "action_is_effective": effective,
            "num_steps": self.num_steps,
        }


def seeded_child(rng, high: int = 2**31 - 1) -> int:
    """A seed drawn from an env's generator, for libraries that want an int seed."""
    return int(rng.integers(0, high))


def checked_int(game: str, key: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high], or a ValueError naming the game, key and range."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        raise ValueError(f"{game}: {key} must be {allowed}, got {value!r}")
    return number


def resolve_preset(game: str, presets: dict[str, dict], name: str, **overrides: Any) -> dict:
    """A preset's settings with explicit (non-None) keyword arguments laid over them."""
    if name not in presets:
        raise ValueError(f"{game}: unknown preset={name!r}; allowed: {sorted(presets)}")
    settings = dict(presets[name])
    unknown = set(overrides) - set(settings)
    if unknown:
        raise ValueError(f"{game}: unknown option(s) {sorted(unknown)}; allowed: {sorted(settings)}")
    settings.update({key: value for key, value in overrides.items() if value is not None})
    return settings
