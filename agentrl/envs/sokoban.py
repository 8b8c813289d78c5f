"""Sokoban as a text game, on gym-sokoban's room generator with gym-sokoban's rewards."""

from __future__ import annotations


import importlib.util
import random
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, lru_cache
from types import ModuleType

import numpy as np

from agentrl.envs.base import (
    TextGameEnv, Transition, checked_int, resolve_preset, seeded_child,
)
from agentrl.envs.search import shortest_plan

PRESETS: dict[str, dict] = {
    # GRL's simpleSokobanAgent (the default).
    "6x6": {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 100, "num_gen_steps": None},
    # GRL's largeSokobanAgent.
    "8x8": {"dim_room": (8, 8), "num_boxes": 1, "search_depth": 30, "num_gen_steps": None},
    # Held-out harder variant (RAGEN's larger preset).
    "8x8-2boxes": {"dim_room": (8, 8), "num_boxes": 2, "search_depth": 30, "num_gen_steps": None},
}
"""Every preset pins room size, boxes and search depth: reset cost grows fast with each."""

DEFAULT_PRESET = "6x6"
DIM_RANGE = (4, 20)
"""Room side lengths allowed; 4 is the least that leaves the player and a box room to move."""
SEARCH_DEPTH_RANGE = (3, 500)
"""Reverse-play depth allowed: under 3 no box ever leaves its target (every room is rejected);
the search recurses once per level, so Python's stack bounds it from above."""
MAX_GENERATION_ATTEMPTS = 50
"""Rooms the generator may reject in a row before reset gives up with an error."""
P_CHANGE_DIRECTIONS = 0.35
"""gym-sokoban's default chance that the topology random walk turns."""

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
FINISHED_REWARD = 10.0

MOVES: dict[str, tuple[int, int]] = {
    "Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1),
}
"""Canonical action -> (row, column) change, in gym-sokoban's order."""
_DELTA_BY_TEXT = {name.lower(): delta for name, delta in MOVES.items()}

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET = "#", "_", "O", "X", "√"
PLAYER, PLAYER_ON_TARGET = "P", "S"
SYMBOLS = (WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET)

Cell = tuple[int, int]


@dataclass(frozen=True)
class Level:
    """The fixed parts of a room: its size, walls and box targets."""

    height: int
    width: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]

    def blocked(self, cell: Cell) -> bool:
        """Walls and everything outside the grid stop the player and boxes alike."""
        row, col = cell
        return not (0 <= row < self.height and 0 <= col < self.width) or cell in self.walls

    def dead(self, cell: Cell) -> bool:
        """A box in a corner off any target can never move again (prunes the oracle search)."""
        if cell in self.targets:
            return False
        row, col = cell
        vertical = self.blocked((row - 1, col)) or self.blocked((row + 1, col))
        horizontal = self.blocked((row, col - 1)) or self.blocked((row, col + 1))
        return vertical and horizontal


State = tuple[Cell, frozenset[Cell]]
"""(player, boxes): the moving parts, hashable for the oracle's search."""


def push(level: Level, state: State, delta: tuple[int, int]) -> State:
    """gym-sokoban's push-or-move: the state after one move (unchanged if blocked)."""
    player, boxes = state
    ahead = (player[0] + delta[0], player[1] + delta[1])
    if level.blocked(ahead):
        return state
    if ahead not in boxes:
        return ahead, boxes
    beyond = (ahead[0] + delta[0], ahead[1] + delta[1])
    if level.blocked(beyond) or beyond in boxes:
        return state
    return ahead, (boxes - {ahead}) | {beyond}


def solved(level: Level, boxes: frozenset[Cell]) -> bool:
    return boxes <= level.targets


# -- gym-sokoban's generator -------------------------------------------------------------------
@cache
def room_utils() -> ModuleType:
    """gym_sokoban/envs/room_utils.py alone: the package's __init__ needs old gym, pkg_resources."""
    spec = importlib.util.find_spec("gym_sokoban")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("SokobanEnv needs gym-sokoban: pip install gym-sokoban==0.0.6")
    path = f"{list(spec.submodule_search_locations)[0]}/envs/room_utils.py"
    module_spec = importlib.util.spec_from_file_location("_agentrl_gym_sokoban_room_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


_GENERATOR_LOCK = threading.Lock()
"""room_utils keeps its search in module globals and draws from the global RNGs: one at a time."""


@contextmanager
def seeded_global_rngs(seed: int):
    """Seed `random` and `np.random` (which room_utils draws from), then restore both."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def generate_room(seed: int, dim_room: tuple[int, int], num_boxes: int, search_depth: int,
                  num_gen_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """One try of gym-sokoban's ``generate_room`` with the reverse-play depth plumbed through.

    gym-sokoban 0.0.6 hard-codes the depth (ttl=300) inside ``reverse_playing``; this is the
    same sequence of library calls with ``ttl=search_depth``. Returns (structure, state) in the
    library's codes (0 wall, 1 floor, 2 target; 3/4 box, 5 player). Raises what the library
    raises, and RuntimeWarning on a score-0 room as ``generate_room`` does.
    """
    lib = room_utils()
    with _GENERATOR_LOCK, seeded_global_rngs(seed):
        room = lib.room_topology_generation(dim_room, P_CHANGE_DIRECTIONS, num_gen_steps)
        room = lib.place_boxes_and_player(room, num_boxes=num_boxes, second_player=False)
        structure = room.copy()
        structure[structure == 5] = 1
        state = room.copy()
        state[state == 2] = 4
        best_state, score = reverse_play(lib, state, structure, search_depth)
    if score <= 0:
        raise RuntimeWarning("Generated Model with score == 0")
    return structure, best_state


def reverse_play(lib: ModuleType, state: np.ndarray, structure: np.ndarray,
                 search_depth: int) -> tuple[np.ndarray, int]:
    """The body of ``room_utils.reverse_playing``, with the depth as given."""
    targets = np.argwhere(structure == 2)
    lib.explored_states = set()
    lib.num_boxes = len(targets)
    lib.best_room_score = -1
    lib.best_room = None
    lib.best_box_mapping = {(int(r), int(c)): (int(r), int(c)) for r, c in targets}
    try:
        lib.depth_first_search(state, structure, dict(lib.best_box_mapping), box_swaps=0,
                               last_pull=(-1, -1), ttl=search_depth)
        return lib.best_room, lib.best_room_score
    finally:
        lib.explored_states = set()  # up to 300k hashed rooms: do not keep them alive


@lru_cache(maxsize=1024)
def generated_room(seed: int, dim_room: tuple[int, int], num_boxes: int, search_depth: int,
                   num_gen_steps: int) -> tuple[Level, State]:
    """:func:`generate_room` as an immutable level, memoized: the members of an agent group
    reset on the same seed, so the room is generated once per group, not once per agent."""
    return level_from_arrays(*generate_room(seed, dim_room, num_boxes, search_depth, num_gen_steps))


def level_from_arrays(structure: np.ndarray, state: np.ndarray) -> tuple[Level, State]:
    height, width = structure.shape
    level = Level(height, width, cells(structure == 0), cells(structure == 2))
    (player,) = cells(state == 5)
    return level, (player, cells((state == 3) | (state == 4)))


def cells(mask: np.ndarray) -> frozenset[Cell]:
    return frozenset((int(r), int(c)) for r, c in np.argwhere(mask))


# -- text boards ---------------------------------------------------------------------------------
def render_board(level: Level, state: State) -> str:
    player, boxes = state
    rows = []
    for row in range(level.height):
        rows.append("".join(symbol(level, player, boxes, (row, col)) for col in range(level.width)))
    return "\n".join(rows)


def symbol(level: Level, player: Cell, boxes: frozenset[Cell], cell: Cell) -> str:
    on_target = cell in level.targets
    if cell in level.walls:
        return WALL
    if cell == player:
        return PLAYER_ON_TARGET if on_target else PLAYER
    if cell in boxes:
        return BOX_ON_TARGET if on_target else BOX
    return TARGET if on_target else FLOOR


def parse_board(text: str) -> tuple[Level, State]:
    """A board in the legend (as ``render`` writes it) -> level and state; ValueError if bad."""
    rows = [line.strip() for line in text.strip().splitlines()]
    if not rows or any(len(row) != len(rows[0]) for row in rows):
        raise ValueError("Sokoban board: rows must be non-empty and of equal length")
    grid = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    unknown = set(grid.values()) - set(SYMBOLS)
    if unknown:
        raise ValueError(f"Sokoban board: unknown symbol(s) {sorted(unknown)}; allowed: {SYMBOLS}")

    def of(*kinds: str) -> frozenset[Cell]:
        return frozenset(cell for cell, ch in grid.items() if ch in kinds)

    players = of(PLAYER, PLAYER_ON_TARGET)
    boxes = of(BOX, BOX_ON_TARGET)
    targets = of(TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)
    if len(players) != 1:
        raise ValueError(f"Sokoban board: needs exactly one player (P or S), found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise ValueError(f"Sokoban board: needs as many boxes as targets (>= 1), found "
                         f"{len(boxes)} boxes and {len(targets)} targets")
    level = Level(len(rows), len(rows[0]), of(WALL), targets)
    return level, (next(iter(players)), boxes)


# -- the environment -----------------------------------------------------------------------------
class SokobanEnv(TextGameEnv):
    """Push every box onto a target in a room generated by gym-sokoban.

    ## Actions
    ``Up``, ``Down``, ``Left``, ``Right`` (any case and spacing). The player steps one cell; a
    box ahead is pushed if the cell beyond it is free (floor or empty target). Walls and a box
    that cannot move stop the player: the action is valid but not effective. Any other text is
    gym-sokoban's "no operation": nothing moves and ``action_is_valid`` is False.

    ## Observation
    The room as rows of symbols: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
    ``√`` box on target, ``P`` player, ``S`` player on target.

    ## Starting state
    gym-sokoban's generator: a random-walk room topology, then the player and boxes placed on
    targets and pulled backwards by a depth-first reverse play of at most ``search_depth`` moves;
    the best-scoring pulled state (pulls x box displacement, every box off its target) is the
    start, so every room is solvable and none starts solved.
    A room the generator rejects (score 0, too little floor) is redrawn from a seed taken from
    ``np_random``, up to ``MAX_GENERATION_ATTEMPTS`` times, then reset raises RuntimeError.
    ``SokobanEnv.from_board(text)`` starts from a given board instead.

    ## Rewards
    gym-sokoban's: -0.1 per action (invalid ones too), +1 when a box goes onto a target, -1
    when one leaves a target, +10 when all boxes are on targets.

    ## Episode end
    Terminated (success) when all boxes are on targets; truncated after ``max_steps`` actions.

    ## Arguments
    ``preset`` (a key of ``PRESETS``, default ``"6x6"``); overrides: ``dim_room`` (rows,
    columns; each in ``DIM_RANGE``), ``num_boxes`` (>= 1), ``search_depth`` (in
    ``SEARCH_DEPTH_RANGE``), ``num_gen_steps`` (random-walk steps, None = gym-sokoban's
    ``int(1.7 * (rows + columns))``); ``max_steps`` (default 100); ``render_mode`` ("ansi").

    ## Version history
    - v0: gym-sokoban 0.0.6 generator with ``search_depth`` honoured; text legend as GRL's.
    """

    rules = (
        "Sokoban: push every box onto a target. Actions: Up, Down, Left, Right.\n"
        "You push a box by walking into it; you cannot pull boxes or push two at once.\n"
        "Symbols: # wall, _ floor, O target, X box, √ box on target, P you, S you on a target.\n"
        "Rewards: -0.1 per action, +1 box onto a target, -1 box off a target, +10 all boxes on."
    )

    def __init__(self, preset: str = DEFAULT_PRESET, dim_room: tuple[int, int] | None = None,
                 num_boxes: int | None = None, search_depth: int | None = None,
                 num_gen_steps: int | None = None, max_steps: int = 100,
                 render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("Sokoban", PRESETS, preset, dim_room=dim_room,
                                  num_boxes=num_boxes, search_depth=search_depth,
                                  num_gen_steps=num_gen_steps)
        self.preset = preset
        self.dim_room = _dims(settings["dim_room"])
        self.num_boxes = checked_int("Sokoban", "num_boxes", settings["num_boxes"], 1,
                                     _max_boxes(self.dim_room))
        self.search_depth = checked_int("Sokoban", "search_depth", settings["search_depth"],
                                        *SEARCH_DEPTH_RANGE)
        steps = settings["num_gen_steps"]
        default_steps = int(1.7 * sum(self.dim_room))
        self.num_gen_steps = (default_steps if steps is None
                              else checked_int("Sokoban", "num_gen_steps", steps, 1))
        # One box on its target ends the game, so only with two boxes or more can a push take a
        # box off a target (-1 on top of the step).
        self.worst_legal_reward = STEP_PENALTY + (BOX_OFF_TARGET_PENALTY if self.num_boxes > 1
                                                  else 0.0)
        self.fixed_board: str | None = None
        self.level: Level | None = None
        self.state: State | None = None

    @classmethod
    def from_board(cls, board: str, **kwargs) -> SokobanEnv:
        """An env that starts (and resets) at ``board``, written in the observation's legend."""
        level, state = parse_board(board)
        env = cls(**kwargs)
        env.fixed_board = board
        env.instance_partition = "none"  # one instance, whatever the seed: nothing to split
        env.dim_room, env.num_boxes = (level.height, level.width), len(state[1])
        env.reset()
        return env

    # -- game hooks ------------------------------------------------------------------------------
    def _new_game(self) -> None:
        if self.fixed_board is not None:
            self.level, self.state = parse_board(self.fixed_board)
        else:
            self.level, self.state = self._generate()

    def _generate(self) -> tuple[Level, State]:
        """A generated room; rejected rooms are redrawn from seeds derived from np_random."""
        errors = []
        for _ in range(MAX_GENERATION_ATTEMPTS):
            seed = seeded_child(self.np_random)
            try:
                return generated_room(seed, tuple(self.dim_room), self.num_boxes,
                                      self.search_depth, self.num_gen_steps)
            except Exception as error:  # noqa: BLE001 - any library failure means "redraw"
                errors.append(f"{type(error).__name__}: {error}")
        raise RuntimeError(
            f"Sokoban: gym-sokoban rejected {MAX_GENERATION_ATTEMPTS} rooms in a row for "
            f"dim_room={self.dim_room}, num_boxes={self.num_boxes}, search_depth="
            f"{self.search_depth}, num_gen_steps={self.num_gen_steps} (last: {errors[-1]}); "
            "use a larger room or fewer boxes"
        )

    def instance_key(self) -> str:
        """The room with its walls, targets, boxes and player: the whole starting state."""
        return render_board(self.level, self.state)

    def _step(self, action: str) -> Transition:
        delta = _DELTA_BY_TEXT.get(action)
        before = self.state
        if delta is not None:
            self.state = push(self.level, before, delta)
        on_before = len(before[1] & self.level.targets)
        on_after = len(self.state[1] & self.level.targets)
        reward = STEP_PENALTY
        if on_after > on_before:
            reward += BOX_ON_TARGET_REWARD
        elif on_after < on_before:
            reward += BOX_OFF_TARGET_PENALTY
        done = solved(self.level, self.state[1])
        if done:
            reward += FINISHED_REWARD
        return Transition(reward=reward, valid=delta is not None, effective=self.state != before,
                          terminated=done, success=done)

    def valid_actions(self) -> list[str]:
        return list(MOVES)

    def oracle_plan(self, max_states: int = 1_000_000) -> list[str] | None:
        """Fewest moves to solve from here (BFS); None if unsolvable or over ``max_states``."""
        level = self.level

        def successors(state: State):
            for name, delta in MOVES.items():
                child = push(level, state, delta)
                if child != state and not any(level.dead(box) for box in child[1] - state[1]):
                    yield name, child

        return shortest_plan(self.state, successors, lambda s: solved(level, s[1]), max_states)

    def render(self) -> str:
        return render_board(self.level, self.state)



def _dims(value) -> tuple[int, int]:
    if isinstance(value, str) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"Sokoban: dim_room must be (rows, columns), got {value!r}")
    return tuple(checked_int("Sokoban", "dim_room", side, *DIM_RANGE) for side in value)


def _max_boxes(dim_room: tuple[int, int]) -> int:
    """Inner cells less one for the player: more boxes than that can never be placed."""
    return (dim_room[0] - 2) * (dim_room[1] - 2) - 1
