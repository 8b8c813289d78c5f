"""TextWorld as a text game: quests from textworld's generator, played through its engine.

Pre-generate a preset's games for a range of env seeds (parallel, with a progress bar)::

    python -m agentrl.envs.textworld --preset easy medium hard --seeds 0 1000 --workers 8
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path

import jericho
import textworld

from agentrl.envs.base import (
    TextGameEnv, Transition, checked_int, normalize_action, resolve_preset, seeded_child,
)
from agentrl.envs.textworld_pool import GameParams, GamePool, ensure_games

PRESETS: dict[str, dict] = {
    # 2 rooms, quest of 2 actions: a walkthrough of 1-2 commands (e.g. "go east", "take key").
    "easy": {"nb_rooms": 2, "nb_objects": 4, "quest_length": 2},
    "medium": {"nb_rooms": 4, "nb_objects": 8, "quest_length": 3},
    "hard": {"nb_rooms": 6, "nb_objects": 12, "quest_length": 5},
}
"""World size, objects and quest length; generation takes ~1-2 s a game for all three."""

DEFAULT_PRESET = "easy"
NB_ROOMS_RANGE = (1, 12)
NB_OBJECTS_RANGE = (0, 40)
QUEST_LENGTH_RANGE = (1, 10)
"""Bounds keep a game small enough to compile (a .z8 story has a size limit) in seconds."""

INVALID_FEEDBACK = "That is not something you can do here."

REQUEST_INFOS = textworld.EnvInfos(
    admissible_commands=True, objective=True, won=True, lost=True, score=True, max_score=True,
    policy_commands=True, description=True, feedback=True, facts=True,
)
"""What the engine reports each step; ``facts`` (the world state) decides effectiveness."""

_BANNER_CHARS = frozenset(" _|\\/$<>")
"""The characters of TextWorld's ASCII-art title, printed before the story starts."""
_PROMPT_LINE = re.compile(r"\n>[^\n]*\Z")
_END_QUESTION = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"
_BLANK_LINES = re.compile(r"\n{3,}")


# -- engine text ---------------------------------------------------------------------------------
def clean_feedback(text: str, objective: str = "") -> str:
    """Engine output as a person would want to read it.

    Drops the ASCII-art banner, the ``>`` prompt and status line the interpreter appends, the
    restart question after the end, and the objective (the observation shows it once, apart).
    """
    lines = text.split("\n")
    start = 0
    while start < len(lines) and set(lines[start]) <= _BANNER_CHARS:
        start += 1
    text = _PROMPT_LINE.sub("", "\n".join(lines[start:]))
    text = text.replace(_END_QUESTION, "")
    if objective:
        text = text.replace(objective, "")
    text = "\n".join(line.strip() for line in text.split("\n"))  # e.g. a centred "The End"
    return _BLANK_LINES.sub("\n\n", text).strip()


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) in " ".join(b.split())


def game_seed(env_seed: int) -> int:
    """The generator seed that ``reset(seed=env_seed)`` plays: the env seed itself.

    Using the seed directly keeps train and held-out games apart exactly as their seed ranges
    are (a seed drawn from a generator could collide across splits).
    """
    return env_seed


class TextWorldEnv(TextGameEnv):
    """Finish a quest in a house made by textworld's generator, one typed command at a time.

    ## Actions
    Any of the game's admissible commands (``valid_actions()``: e.g. ``go east``,
    ``take key from box``, ``unlock door with key``, ``look``, ``inventory``), any case and
    spacing. Matching is exact after lower-casing and collapsing spaces; the command is sent to
    the engine in its canonical form. Any other text is invalid and never reaches the
    interpreter: nothing happens, the feedback is "That is not something you can do here.",
    ``action_is_valid`` is False. An admissible command is *effective* when the world state
    (TextWorld's facts: locations, what is open, held, eaten...) or the score changed:
    ``look``, ``examine`` and ``inventory`` are valid but not effective. Rarely, two objects
    share a word and the game's parser answers an admissible command with "Which do you
    mean...?": nothing changes (valid, not effective).

    ## Observation
    Text: ``Goal:`` the quest objective; the engine's feedback to the last command (on reset,
    the opening text; the title banner and prompt are stripped); the current room description
    when the feedback does not already contain it; and, if ``show_admissible``, the list of
    admissible commands (on by default: a small model cannot guess TextWorld's command grammar,
    and ALFWorld-style agents are given the list too). Nothing is listed once the game is over.

    ## Starting state
    Game seed = the env seed (``game_seed(env_seed)``; drawn from ``np_random`` when reset has
    no seed); the game is
    textworld's ``make_game`` for the preset's ``nb_rooms``, ``nb_objects``, ``quest_length``
    and that seed, compiled once into an on-disk pool (``textworld_pool.GamePool``) and reused
    by later resets; a missing game is generated on demand (~1-2 s). A generated game whose
    walkthrough does not win (ambiguous object names, ~2% of games) is replaced by the next
    generator seed derived from the game seed, so every game is solvable by ``oracle_plan``.
    Held-out games are kept apart by their seeds alone (``instance_partition = "seed"``): the
    generator draws rooms, object names and quests from textworld's knowledge base, a space
    no split repeats (the contract test checks instance keys on a sample), and a redraw into
    the seed's split would compile several 1-2 s games per held-out reset.

    ## Rewards
    The increase of the game's score: TextWorld gives 1 point per completed quest, so with one
    quest the return is 1 on success, 0 otherwise. Invalid actions give 0.

    ## Episode end
    Terminated when the quest is won (success) or lost (TextWorld's fail events; the default
    generator makes none). Truncated after ``max_steps`` actions.

    ## Arguments
    ``preset`` (a key of ``PRESETS``, default ``"easy"``); overrides ``nb_rooms`` (in
    ``NB_ROOMS_RANGE``), ``nb_objects`` (``NB_OBJECTS_RANGE``), ``quest_length``
    (``QUEST_LENGTH_RANGE``); ``show_admissible`` (default True); ``pool_dir`` (the pool root,
    default ``$AGENTRL_CACHE/textworld`` or ``~/.cache/agentrl/textworld``); ``max_steps``
    (default 50); ``render_mode`` ("ansi").

    ## Version history
    - v0: textworld 1.7 generator (house theme), one quest, score-increase rewards.
    """

    rules = (
        "TextWorld: a text adventure. Read the goal, then type commands to complete it.\n"
        "Commands look like: go north, open box, take key from box, unlock door with key,\n"
        "put apple on table, insert coin into chest, eat apple, look, inventory, examine box.\n"
        "Only the admissible commands listed with each observation do anything.\n"
        "Reward: +1 when the quest is completed (the episode then ends)."
    )

    def __init__(self, preset: str = DEFAULT_PRESET, nb_rooms: int | None = None,
                 nb_objects: int | None = None, quest_length: int | None = None,
                 show_admissible: bool = True, pool_dir: str | Path | None = None,
                 max_steps: int = 50, render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("TextWorld", PRESETS, preset, nb_rooms=nb_rooms,
                                  nb_objects=nb_objects, quest_length=quest_length)
        if not isinstance(show_admissible, bool):
            raise ValueError(f"TextWorld: show_admissible must be True or False, "
                             f"got {show_admissible!r}")
        self.preset = preset
        self.params = GameParams(
            nb_rooms=checked_int("TextWorld", "nb_rooms", settings["nb_rooms"], *NB_ROOMS_RANGE),
            nb_objects=checked_int("TextWorld", "nb_objects", settings["nb_objects"], *NB_OBJECTS_RANGE),
            quest_length=checked_int("TextWorld", "quest_length", settings["quest_length"], *QUEST_LENGTH_RANGE),
        )
        self.show_admissible = show_admissible
        self.pool = GamePool(self.params, pool_dir)
        self.game_seed: int | None = None
        self.game_path: Path | None = None
        self._engine = None  # the running textworld env
        self._state = None  # its last GameState
        self._commands: dict[str, str] = {}  # normalized -> canonical admissible command
        self._feedback = ""

    def pregenerate(self, env_seeds, workers: int | None = None, progress: bool = True) -> None:
        """Make the games that ``reset(seed=s)`` will play for each ``s`` in ``env_seeds``."""
        ensure_games(self.pool_games(env_seeds), workers, progress)

    def pool_games(self, env_seeds) -> list[tuple[GamePool, int]]:
        """(pool, game seed) of each env seed: for ``ensure_games`` over several presets."""
        return [(self.pool, game_seed(seed)) for seed in env_seeds]

    # -- game hooks ------------------------------------------------------------------------------
    def _new_game(self) -> None:
        seed = self.episode_seed
        self.game_seed = game_seed(seed) if seed is not None else seeded_child(self.np_random)
        path = self.pool.get(self.game_seed)
        if self._engine is None or path != self.game_path:
            self._close_engine()
            with warnings.catch_warnings():
                # Jericho cannot find score and moves in TextWorld's stories; textworld reads
                # them itself, so the warning (which textworld also silences) says nothing.
                warnings.simplefilter("ignore", jericho.UnsupportedGameWarning)
                self._engine = textworld.start(str(path), request_infos=REQUEST_INFOS)
            self.game_path = path
        self._set_state(self._engine.reset())

    instance_partition = "seed"

    def instance_key(self) -> str:
        """Objective, opening text and walkthrough of the quest."""
        state = self._state
        return f"{state['objective']}|{state['feedback']}|{state.get('policy_commands')}"

    def _set_state(self, state) -> None:
        self._state = state
        self._feedback = clean_feedback(state["feedback"], state["objective"])
        commands = [] if self._over() else state["admissible_commands"]
        self._commands = {normalize_action(command): command for command in reversed(commands)}

    def _step(self, action: str) -> Transition:
        command = self._commands.get(action)
        if command is None:
            self._feedback = INVALID_FEEDBACK
            return Transition(reward=0.0, valid=False, effective=False)
        before = self._state
        after, _, _ = self._engine.step(command)
        self._set_state(after)
        reward = float(after["score"] - before["score"])
        effective = reward != 0 or set(after["facts"]) != set(before["facts"])
        return Transition(reward=reward, valid=True, effective=effective,
                          terminated=self._over(), success=bool(after["won"]))

    def _over(self) -> bool:
        return bool(self._state["won"] or self._state["lost"])

    def valid_actions(self) -> list[str]:
        """TextWorld's admissible commands (sorted), none once the game is over."""
        return sorted(self._commands.values())

    def oracle_plan(self) -> list[str] | None:
        """The walkthrough from here (TextWorld's ``policy_commands``); None if unwinnable."""
        if self._state["won"]:
            return []
        plan = list(self._state["policy_commands"] or [])
        return plan if plan and not self._state["lost"] else None

    @property
    def objective(self) -> str:
        return self._state["objective"]

    @property
    def score(self) -> tuple[int, int]:
        """(points so far, points possible)."""
        return int(self._state["score"]), int(self._state["max_score"])

    def render(self) -> str:
        parts = [f"Goal: {self.objective}", self._feedback]
        description = clean_feedback(self._state["description"] or "")
        if description and not _same_text(description, self._feedback):
            parts.append(description)
        actions = self.valid_actions()
        if self.show_admissible and actions:
            parts.append("Admissible commands: " + ", ".join(actions))
        return "\n\n".join(part for part in parts if part)

    def close(self) -> None:
        self._close_engine()
        super().close()

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self.game_path = None, None



def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Pre-generate TextWorld games into the pool.")
    parser.add_argument("--preset", nargs="+", default=[DEFAULT_PRESET], choices=sorted(PRESETS))
    parser.add_argument("--seeds", nargs=2, type=int, default=(0, 100), metavar=("START", "STOP"),
                        help="env seeds START ... STOP-1")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: CPUs)")
    parser.add_argument("--pool-dir", default=None)
    args = parser.parse_args(argv)
    envs = [TextWorldEnv(preset=preset, pool_dir=args.pool_dir) for preset in args.preset]
    ensure_games([game for env in envs for game in env.pool_games(range(*args.seeds))],
                 workers=args.workers)
    for env in envs:
        print(f"{env.preset}: {env.pool.directory}")


if __name__ == "__main__":
    main()
