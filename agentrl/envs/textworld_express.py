"""TextWorldExpress as a text game: CoinCollector, CookingWorld and TextWorld Commonsense.

TextWorldExpress re-implements these TextWorld games in Scala for speed; the package runs them
in a Java process it talks to through py4j. One Java process per Python process serves every
env (each env gets its own game object in it), started on the first reset.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import threading
from collections import deque
from functools import cache

from agentrl.envs.base import (
    TextGameEnv, Transition, normalize_action, resolve_preset, seeded_child,
)
from agentrl.envs.splits import SEED_RANGES, split_of_or_none

PRESETS: dict[str, dict] = {
    # The package's own game parameters (its README lists each game's options).
    "coin": {"game_name": "coin",
             "params": "numLocations=5,numDistractorItems=0,includeDoors=0"},
    "cooking": {"game_name": "cookingworld",
                "params": "numLocations=1,numIngredients=2,numDistractorItems=0,includeDoors=0,"
                          "limitInventorySize=0"},
    "twc": {"game_name": "twc",
            "params": "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0"},
    # Held-out twins: more rooms, doors, ingredients, distractors, items to put away.
    "coin-hard": {"game_name": "coin",
                  "params": "numLocations=8,numDistractorItems=4,includeDoors=1"},
    "cooking-hard": {"game_name": "cookingworld",
                     "params": "numLocations=3,numIngredients=3,numDistractorItems=3,"
                               "includeDoors=1,limitInventorySize=0"},
    "twc-hard": {"game_name": "twc",
                 "params": "numLocations=2,numItemsToPutAway=4,includeDoors=0,"
                           "limitInventorySize=0"},
}
"""TextWorldExpress game name and its parameter string (``key=value`` pairs)."""

DEFAULT_PRESET = "coin"
GAME_NAMES = ("coin", "cookingworld", "twc")
FOLDS = {"train": "train", "val": "dev", "test": "test"}
"""Our seed split -> the package's game fold: held-out seeds play games training never sees."""

INVALID_FEEDBACK = "That is not something you can do here."
PARAMS_FORMAT = re.compile(r"(?:[A-Za-z]+=[0-9]+(?:,[A-Za-z]+=[0-9]+)*)?")
"""``key=integer`` pairs joined by commas (the package ignores values it cannot read)."""
DIRECTIONS = ("north", "east", "south", "west")
COIN_ACTION = "take coin"
MAX_ROOMS = 32
"""The coin oracle's search stops after this many rooms (the package makes at most 11)."""
JAVA_MISSING = (
    "TextWorldExpress needs a Java runtime (Java 8 or newer), and `java` is not on PATH. "
    "Install one (Debian/Ubuntu: apt-get install -y default-jre-headless; or run env_setup.sh), "
    "or set JAVA_HOME."
)


# -- the Java process ------------------------------------------------------------------------------
_START_LOCK = threading.Lock()


def java_command() -> str | None:
    """The ``java`` py4j will start: ``$JAVA_HOME/bin/java`` or the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


@cache
def _gateway(pid: int):
    """The package's env, kept only for its Java process and gateway (one per process id, so a
    forked child starts its own)."""
    if java_command() is None:
        raise RuntimeError(JAVA_MISSING)
    try:
        from textworld_express import TextWorldExpressEnv as PackageEnv
    except ImportError as error:
        raise ImportError("TextWorldExpressEnv needs textworld-express: "
                          "pip install textworld-express==1.1.0") from error

    class JavaProcess(PackageEnv):
        def __del__(self):
            pass  # closed by atexit instead: at interpreter teardown py4j's logging is gone

    holder = JavaProcess()
    atexit.register(holder.close)
    return holder


def new_game_server():
    """A fresh game object in this process's Java server (py4j proxy)."""
    with _START_LOCK:
        holder = _gateway(os.getpid())
    return holder._gateway.jvm.textworldexpress.runtime.PythonInterface()


def split_and_offset(env_seed: int) -> tuple[str, int]:
    """The env seed's split and its place in it; a seed outside every split range (any
    Gymnasium seed is allowed) counts as a training seed at offset ``env_seed``."""
    split = split_of_or_none(env_seed)
    if split is None:
        return "train", env_seed
    return split, env_seed - SEED_RANGES[split].start


def game_seed(offset: int, fold_seeds: list[int]) -> int:
    """The package seed at ``offset`` into a split, wrapped onto its fold's games (1,000)."""
    return fold_seeds[offset % len(fold_seeds)]


class TextWorldExpressEnv(TextGameEnv):
    """Play a TextWorldExpress game (CoinCollector, CookingWorld, TextWorld Commonsense).

    ## Actions
    Any of the game's admissible commands (``valid_actions()``: e.g. ``move north``,
    ``take coin``, ``open fridge``, ``slice red apple``, ``put clean shirt in wardrobe``,
    ``look around``, ``inventory``), any case and spacing. Other text is invalid and never
    reaches the game: nothing happens, the feedback is "That is not something you can do
    here.". An admissible command is *effective* when it changed the room's description, the
    inventory or the score (``look around`` and ``examine`` are valid, not effective).

    ## Observation
    Text: ``Task:`` the game's task description, the game's answer to the last command (on
    reset, the room description) and, if ``show_admissible``, the sorted admissible commands
    (on by default, as for TextWorld). Nothing is listed once the game is over.

    ## Starting state
    The env seed's split (``agentrl.envs.splits``) picks the package's game fold: train ->
    train, val -> dev, test -> test; the seed's offset in its split, modulo the fold's size,
    picks one of the fold's game seeds (``game_seed``). Held-out seeds thus play games of folds
    training never sees (CookingWorld and TextWorld Commonsense also keep objects apart by
    fold). Folds do not keep small worlds apart (a third of CoinCollector's dev games are
    train games), so a game whose instance key (task and opening text) belongs to another
    split than the seed's is redrawn from another seed of the same fold
    (``TextGameEnv.reset``). A reset without a seed draws one from ``np_random`` within the
    train split; a seed outside every split range plays the train fold too.

    ## Rewards
    The increase of the game's score: 1 in all for CoinCollector, a fraction per step of the
    recipe (CookingWorld) or per item put away (TextWorld Commonsense), which sum to 1.

    ## Episode end
    Terminated when the task succeeds or fails (CookingWorld: e.g. eating the wrong thing).
    Truncated after ``max_steps`` actions.

    ## Arguments
    ``preset`` (a key of ``PRESETS``, default ``"coin"``); overrides ``game_name`` (one
    of ``GAME_NAMES``) and ``params`` (the package's parameter string; a bad one fails at the first
    reset with the package's message); ``show_admissible`` (default True); ``max_steps``
    (default 50); ``render_mode`` ("ansi"). ``oracle_plan()`` is the package's gold action
    sequence while the episode has followed it, None once it has left it; for CoinCollector a
    breadth-first search over rooms (``_coin_plan``).

    ## Version history
    - v0: textworld-express 1.1.0, score-increase rewards.
    """

    rules = (
        "A text game. Read the task, then type commands to complete it.\n"
        "Commands look like: move north, open door to north, take coin, open fridge, take red\n"
        "apple, slice red apple, cook red apple in stove, put shirt in wardrobe, look around.\n"
        "Only the admissible commands listed with each observation do anything.\n"
        "Reward: the score gained; 1 in all when the task is complete (the episode then ends)."
    )

    def __init__(self, preset: str = DEFAULT_PRESET, game_name: str | None = None,
                 params: str | None = None, show_admissible: bool = True, max_steps: int = 50,
                 render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("TextWorldExpress", PRESETS, preset, game_name=game_name,
                                  params=params)
        if settings["game_name"] not in GAME_NAMES:
            raise ValueError(f"TextWorldExpress: game_name must be one of {list(GAME_NAMES)}, "
                             f"got {settings['game_name']!r}")
        if not (isinstance(settings["params"], str) and PARAMS_FORMAT.fullmatch(settings["params"])):
            raise ValueError(f"TextWorldExpress: params must be key=integer pairs joined by "
                             f"commas, like 'numLocations=5,includeDoors=0'; got "
                             f"{settings['params']!r}")
        if not isinstance(show_admissible, bool):
            raise ValueError(f"TextWorldExpress: show_admissible must be True or False, "
                             f"got {show_admissible!r}")
        self.preset = preset
        self.game_name = settings["game_name"]
        self.params = settings["params"]
        self.show_admissible = show_admissible
        if self.game_name == "twc":  # taking a put-away item back out loses its share of the score
            items = dict(pair.split("=") for pair in self.params.split(",") if pair)
            self.worst_legal_reward = -1.0 / max(1, int(items.get("numItemsToPutAway", 1)))
        self.game_seed: int | None = None
        self._server = None  # started on the first reset: building an env stays cheap
        self._fold_seeds: dict[str, list[int]] = {}
        self._state: dict = {}
        self._commands: dict[str, str] = {}
        self._feedback = ""
        self._task = ""
        self._gold: list[str] = []
        self._history: list[str] = []  # the valid commands run this episode
        self._gold_next: int | None = 0  # the gold path's next command; None once left
        self._scratch = None  # a second game object the coin oracle replays in
        self._fold = "train"

    # -- game hooks ------------------------------------------------------------------------------
    def _new_game(self) -> None:
        import orjson

        if self._server is None:
            self._start()
        seed = self.episode_seed
        if seed is None:
            seed = int(self.np_random.integers(len(SEED_RANGES["train"])))
        split, offset = split_and_offset(seed)
        if self.instance_draw:  # a redraw into the seed's split: another game of its fold
            offset = seeded_child(self.np_random)
        self._fold = fold = FOLDS[split]
        self.game_seed = game_seed(offset, self._fold_seeds[fold])
        state = orjson.loads(self._server.generateNewGameJSON(self.game_seed, fold, True))
        self._task = str(self._server.getTaskDescription())
        self._gold = [str(action) for action in self._server.getGoldActionSequence()]
        self._history, self._gold_next = [], 0
        self._set_state(state)

    def instance_key(self) -> str:
        """Task and opening text (the package's gold path is not a function of the game: it
        changes between calls, so it is left out)."""
        return f"{self._task}|{self._feedback}"

    def _start(self) -> None:
        server = new_game_server()
        message = server.load(self.game_name, self.params)
        if message:
            raise ValueError(f"TextWorldExpress: params={self.params!r} rejected for game "
                             f"{self.game_name!r}: {message}")
        self._fold_seeds = {"train": list(server.getSeedsTrain()),
                            "dev": list(server.getSeedsDev()),
                            "test": list(server.getSeedsTest())}
        self._server = server

    def _set_state(self, state: dict) -> None:
        self._state = state
        self._feedback = str(state["observation"]).strip()
        commands = [] if self._over() else [str(c) for c in state["validActions"]]
        self._commands = {normalize_action(command): command for command in sorted(commands)}

    def _step(self, action: str) -> Transition:
        import orjson

        command = self._commands.get(action)
        self._follow_gold(action, valid=command is not None)
        if command is None:
            self._feedback = INVALID_FEEDBACK
            return Transition(reward=0.0, valid=False, effective=False)
        before = self._state
        after = orjson.loads(self._server.stepJSON(command))
        self._history.append(command)
        self._set_state(after)
        reward = float(after["score"]) - float(before["score"])
        effective = reward != 0 or any(after[key] != before[key] for key in ("look", "inventory"))
        return Transition(reward=reward, valid=True, effective=effective,
                          terminated=self._over(), success=bool(after["tasksuccess"]))

    def _follow_gold(self, action: str, valid: bool) -> None:
        """Advance along the gold path. Its next command counts as done even when it is not
        admissible: the path has a few no-ops (opening what is open) the game would answer
        with a message only. Another valid command leaves the path; other invalid text, which
        changes nothing, does not."""
        if self._gold_next is None:
            return
        if (self._gold_next < len(self._gold)
                and action == normalize_action(self._gold[self._gold_next])):
            self._gold_next += 1
        elif valid:
            self._gold_next = None

    def _over(self) -> bool:
        return bool(self._state["tasksuccess"] or self._state["taskfailure"])

    def valid_actions(self) -> list[str]:
        """The game's admissible commands (sorted), none once the game is over."""
        return sorted(self._commands.values())

    def oracle_plan(self) -> list[str] | None:
        """CookingWorld, Commonsense: the rest of the gold action sequence while the episode
        follows it (``_follow_gold``). CoinCollector: the fewest rooms to the coin from here (the package's
        gold path there is a random walk that changes from call to call)."""
        if self._state["tasksuccess"]:
            return []
        if self._state["taskfailure"]:
            return None
        if self.game_name == "coin":
            return self._coin_plan()
        if self._gold_next is None:
            return None
        return self._gold[self._gold_next:] or None

    def _coin_plan(self) -> list[str] | None:
        """Breadth-first over rooms, each reached by replaying commands in a scratch game
        (opening a closed door on the way); sorted directions keep the plan deterministic."""
        if self._scratch is None:
            self._scratch = new_game_server()
            self._scratch.load(self.game_name, self.params)
        queue, seen = deque([list(self._history)]), set()
        while queue and len(seen) < MAX_ROOMS:
            path = queue.popleft()
            state = self._replay(path)
            room = str(state["look"]).split(".")[0]
            if room in seen:
                continue
            seen.add(room)
            actions = set(state["validActions"])
            if COIN_ACTION in actions:
                return path[len(self._history):] + [COIN_ACTION]
            look = str(state["look"]).lower()
            for direction in DIRECTIONS:
                if f"move {direction}" not in actions:
                    continue
                closed = f"to the {direction} you see a closed" in look
                queue.append(path + [f"open door to {direction}"] * closed + [f"move {direction}"])
        return None

    def _replay(self, commands: list[str]) -> dict:
        import orjson

        state = orjson.loads(self._scratch.generateNewGameJSON(self.game_seed, self._fold, False))
        for command in commands:
            state = orjson.loads(self._scratch.stepJSON(command))
        return state

    @property
    def score(self) -> float:
        return float(self._state["score"])

    def render(self) -> str:
        parts = [f"Task: {self._task}", self._feedback]
        actions = self.valid_actions()
        if self.show_admissible and actions:
            parts.append("Admissible commands: " + ", ".join(actions))
        return "\n\n".join(part for part in parts if part)

    def close(self) -> None:
        self._server = self._scratch = None  # the shared Java process lives on for other envs
        super().close()
