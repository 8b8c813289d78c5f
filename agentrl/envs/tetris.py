"""Tetris on a tiny board (GRL's game): steer falling pieces until one row is full."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from agentrl.envs.base import TextGameEnv, Transition, resolve_preset, seeded_child
from agentrl.envs.search import shortest_plan

PRESETS: dict[str, dict] = {
    # GRL's Tetris with one piece type (the default).
    "3x3-type1": {"dim_x": 3, "dim_y": 3, "box_type": 1},
    # Held-out harder variants: a wider row to fill, and/or two-cell pieces.
    "4x4-type1": {"dim_x": 4, "dim_y": 4, "box_type": 1},
    "3x3-type2": {"dim_x": 3, "dim_y": 3, "box_type": 2},
    "4x4-type2": {"dim_x": 4, "dim_y": 4, "box_type": 2},
}
DEFAULT_PRESET = "3x3-type1"
DIM_RANGE = (2, 5)
"""Board sides allowed: 2 is the least a 1x2 piece fits in; above 5 the oracle's search blows up."""

SHAPES: dict[str, tuple[tuple[int, int], ...]] = {
    "1x1": ((0, 0),),
    "1x2": ((0, 0), (0, 1)),  # horizontal: one row, two columns
    "2x1": ((0, 0), (1, 0)),  # vertical: two rows, one column
}
"""Piece name (rows x columns) -> its cells as (row, column) offsets from its top-left cell."""
PIECES_BY_BOX_TYPE: dict[int, tuple[str, ...]] = {1: ("1x1",), 2: ("1x1", "1x2", "2x1")}
"""box_type n = the piece types up to n: 1 -> single blocks; 2 -> also both 1x2 pieces."""

STEP_PENALTY = -0.1
LINE_REWARD = 10.0

ACTIONS = ("Left", "Right", "Down")
_ACTION_BY_TEXT = {name.lower(): name for name in ACTIONS}
_SHIFT = {"Left": -1, "Right": 1}

EMPTY, BLOCK, FALLING = "_", "#", "X"

MAX_KIT_DRAWS = 20
"""Random first kits tried before falling back to single blocks (which always fill a row)."""
ORACLE_MAX_STATES = 200_000
"""Bounds the oracle's search from a hopeless board (under a second; a solvable 4x4 needs far
fewer states)."""


class State(NamedTuple):
    """The moving parts, hashable for the oracle's search."""

    board: int
    """Locked blocks: bit ``row * width + col`` set (row 0 is the top)."""
    index: int
    """Position of the falling piece in the piece sequence."""
    row: int | None
    """Top-left cell of the falling piece; ``None`` once the game has ended (no piece falls)."""
    col: int | None


@dataclass(frozen=True)
class Outcome:
    """What one action did to a :class:`State`."""

    state: State
    effective: bool
    lines: int = 0
    game_over: bool = False


@dataclass(frozen=True)
class Game:
    """The fixed parts of an episode: board size and the whole piece sequence."""

    width: int
    height: int
    pieces: tuple[str, ...]
    columns: tuple[int, ...] = ()
    """Spawn column of each piece's left cell; centred for pieces past its end."""

    def cells(self, piece: str, row: int, col: int) -> int | None:
        """Bit mask of ``piece`` with its top-left cell at (row, col); ``None`` if off the board."""
        mask = 0
        for d_row, d_col in SHAPES[piece]:
            r, c = row + d_row, col + d_col
            if not (0 <= r < self.height and 0 <= c < self.width):
                return None
            mask |= 1 << (r * self.width + c)
        return mask

    def fits(self, board: int, piece: str, row: int, col: int) -> bool:
        mask = self.cells(piece, row, col)
        return mask is not None and not board & mask

    def spawn(self, board: int, index: int) -> State:
        """Piece ``index`` at the top, in its drawn column (centred when none was drawn).

        Game over (``row=None``) when a spawn cell holds a locked block or the sequence ran out.
        """
        if index < len(self.pieces):
            piece = self.pieces[index]
            centred = (self.width - piece_width(piece)) // 2
            col = self.columns[index] if index < len(self.columns) else centred
            if self.fits(board, piece, 0, col):
                return State(board, index, 0, col)
        return State(board, index, None, None)

    def start(self) -> State:
        return self.spawn(0, 0)

    def move(self, state: State, action: str) -> Outcome:
        """Apply a canonical action to a state whose piece is still falling."""
        piece = self.pieces[state.index]
        if action in _SHIFT:
            col = state.col + _SHIFT[action]
            if not self.fits(state.board, piece, state.row, col):
                return Outcome(state, effective=False)  # wall or block: a valid bump
            return Outcome(state._replace(col=col), effective=True)
        row = state.row
        if self.fits(state.board, piece, row + 1, state.col):
            row += 1
        if self.fits(state.board, piece, row + 1, state.col):
            return Outcome(state._replace(row=row), effective=True)
        return self.lock(state._replace(row=row))

    def lock(self, state: State) -> Outcome:
        """Freeze the resting piece, clear full rows, bring in the next piece."""
        board = state.board | self.cells(self.pieces[state.index], state.row, state.col)
        board, lines = self.clear(board)
        if lines:
            return Outcome(State(board, state.index + 1, None, None), effective=True, lines=lines)
        following = self.spawn(board, state.index + 1)
        return Outcome(following, effective=True, game_over=following.row is None)

    def clear(self, board: int) -> tuple[int, int]:
        """Remove full rows; the rows above drop by the number removed below them."""
        full = (1 << self.width) - 1
        rows = [(board >> (r * self.width)) & full for r in range(self.height)]
        kept = [bits for bits in rows if bits != full]
        shift = self.height - len(kept)
        return sum(bits << ((r + shift) * self.width) for r, bits in enumerate(kept)), shift

    def render(self, state: State) -> str:
        falling = 0
        if state.row is not None:
            falling = self.cells(self.pieces[state.index], state.row, state.col)
        lines = []
        for r in range(self.height):
            bits = [1 << (r * self.width + c) for c in range(self.width)]
            lines.append("".join(
                FALLING if falling & bit else BLOCK if state.board & bit else EMPTY for bit in bits
            ))
        return "\n".join(lines)


def piece_width(piece: str) -> int:
    return 1 + max(d_col for _, d_col in SHAPES[piece])


CLEARED = "cleared"
"""The oracle's single goal node: any state right after a row clears."""


def plan(game: Game, state: State, max_states: int = ORACLE_MAX_STATES) -> list[str] | None:
    """Fewest actions from ``state`` to the first cleared row (``None``: cannot be done)."""

    def successors(node: State) -> Iterator[tuple[str, State | str]]:
        for action in ACTIONS:
            outcome = game.move(node, action)
            if outcome.lines:
                yield action, CLEARED
            elif outcome.effective and not outcome.game_over:
                yield action, outcome.state

    return shortest_plan(state, successors, lambda node: node == CLEARED, max_states)


def draw_kit(rng: np.random.Generator, width: int, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Random pieces whose widths add up to exactly one row (so together they can fill it)."""
    kit: list[str] = []
    room = width
    while room:
        fitting = [kind for kind in kinds if piece_width(kind) <= room]
        kit.append(fitting[int(rng.integers(len(fitting)))])
        room -= piece_width(kit[-1])
    return tuple(kit)


def draw_columns(rng: np.random.Generator, width: int, pieces: Sequence[str]) -> tuple[int, ...]:
    """A spawn column per piece, uniform over the columns where it fits: the seed's variety."""
    return tuple(int(rng.integers(width - piece_width(piece) + 1)) for piece in pieces)


def draw_game(rng: np.random.Generator, width: int, height: int, box_type: int,
              count: int) -> Game:
    """``count`` pieces as consecutive kits; the first kit alone provably clears a row.

    A random sequence can be hopeless (only 1x2 pieces never fill an odd row), so the first kit
    is checked with the oracle's own search, restricted to the kit's pieces (single blocks need
    no check), and redrawn if it fails; after MAX_KIT_DRAWS failures it becomes single blocks,
    which always fill a row.
    """
    kinds = PIECES_BY_BOX_TYPE[box_type]
    first = Game(width, height, ("1x1",) * width, draw_columns(rng, width, ("1x1",) * width))
    for _ in range(MAX_KIT_DRAWS):
        kit = draw_kit(rng, width, kinds)
        columns = draw_columns(rng, width, kit)
        if set(kit) == {"1x1"} or kit_clears_row(width, height, kit, columns):
            first = Game(width, height, kit, columns)
            break
    pieces, columns = list(first.pieces), list(first.columns)
    while len(pieces) < count:
        kit = draw_kit(rng, width, kinds)
        pieces.extend(kit)
        columns.extend(draw_columns(rng, width, kit))
    return Game(width, height, tuple(pieces), tuple(columns))


def kit_clears_row(width: int, height: int, kit: tuple[str, ...],
                   columns: tuple[int, ...] = ()) -> bool:
    game = Game(width, height, kit, columns)
    return plan(game, game.start()) is not None


class TetrisEnv(TextGameEnv):
    """Tetris on a tiny board: steer the falling pieces until one row is complete.

    GRL's game. Pieces fall one at a time; each stops where it lands. Filling one whole row
    wins.

    ## Actions
    ``Left`` / ``Right`` shift the falling piece one column; into a wall or a block it does not
    move (a valid action that is not effective). ``Down`` drops it one row; a piece that then
    rests on the floor or a block locks at once (``Down`` on a piece that already rests locks
    it in place). After a lock, full rows clear and the next piece appears at the top. Any
    other text is invalid: nothing moves (``action_is_valid=False``). Case and spacing are
    ignored.

    ## Observation
    The board, top row first: ``_`` empty, ``#`` locked block, ``X`` the falling piece.

    ## Starting state
    An empty board and the first piece at the top. The piece sequence and each piece's spawn
    column (uniform over where it fits) are drawn from the seed at reset (``max_steps + 1``
    pieces, enough for any episode) as *kits*: runs of pieces whose widths add up to one row.
    The first kit is checked by search to clear a row on its own, so every game can be won.
    Spawn columns make seeds differ even when every piece is a 1x1 block (``box_type=1``).

    ## Rewards
    -0.1 per action (invalid ones too), +10 per cleared row.

    ## Episode end
    Terminated with success when a row clears (the first cleared row ends the game).
    Terminated without success (game over) when the next piece cannot enter: a cell of its
    spawn position holds a locked block. Truncated after ``max_steps`` actions.

    ## Arguments
    - ``preset``: ``"3x3-type1"`` (default), ``"4x4-type1"``, ``"3x3-type2"``, ``"4x4-type2"``.
    - ``dim_x``, ``dim_y``: board width and height, 2-5.
    - ``box_type``: piece types up to: 1 = single 1x1 blocks; 2 = 1x1, horizontal 1x2 and
      vertical 2x1 pieces, drawn with equal chance.
    - ``max_steps``: actions before truncation (default 100); ``render_mode``: ``"ansi"``.

    ## Version history
    - v0: first version.
    """

    worst_legal_reward = STEP_PENALTY
    rules = (
        "Tetris: steer each falling piece so that the pieces fill one whole row; a full row "
        "clears and wins.\n"
        "Actions: Left or Right shift the piece one column; Down drops it one row, and a piece "
        "that lands locks at once. Then the next piece appears at the top.\n"
        "Symbols: X falling piece, # locked block, _ empty.\n"
        "Rewards: -0.1 per action, +10 per cleared row. You lose when a new piece has no room "
        "at the top."
    )

    def __init__(self, preset: str = DEFAULT_PRESET, dim_x: int | None = None,
                 dim_y: int | None = None, box_type: int | None = None, max_steps: int = 100,
                 render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("Tetris", PRESETS, preset, dim_x=dim_x, dim_y=dim_y,
                                  box_type=box_type)
        for key in ("dim_x", "dim_y"):
            value = settings[key]
            if not isinstance(value, int) or not DIM_RANGE[0] <= value <= DIM_RANGE[1]:
                raise ValueError(f"Tetris: {key} must be an integer in {DIM_RANGE[0]}..."
                                 f"{DIM_RANGE[1]}, got {value!r}")
        if settings["box_type"] not in PIECES_BY_BOX_TYPE:
            raise ValueError(f"Tetris: box_type must be one of {sorted(PIECES_BY_BOX_TYPE)}, "
                             f"got {settings['box_type']!r}")
        self.preset = preset
        self.dim_x, self.dim_y = settings["dim_x"], settings["dim_y"]
        self.box_type = settings["box_type"]
        self.game = Game(self.dim_x, self.dim_y, ())
        self.state = State(0, 0, None, None)

    @classmethod
    def from_board(cls, rows: Sequence[str], pieces: Sequence[str],
                   position: tuple[int, int] | None = None, max_steps: int = 100) -> TetrisEnv:
        """A game on a hand-built board, for tests and demos.

        ``rows``: the board top row first, ``#`` locked and ``_`` empty. ``pieces``: the piece
        sequence (names of SHAPES); the first one falls at ``position`` (top-left cell) or at
        its spawn position. When the sequence runs out, the next spawn is a game over.
        """
        box_type = 1 if set(pieces) <= {"1x1"} else 2
        env = cls(dim_x=len(rows[0]), dim_y=len(rows), box_type=box_type, max_steps=max_steps)
        env.reset(seed=0)
        board = sum(1 << (r * env.dim_x + c) for r, line in enumerate(rows)
                    for c, char in enumerate(line) if char == BLOCK)
        env.game = Game(env.dim_x, env.dim_y, tuple(pieces))
        env.state = env.game.spawn(board, 0)
        if position is not None:
            if not env.game.fits(board, pieces[0], *position):
                raise ValueError(f"piece {pieces[0]} does not fit at {position}")
            env.state = State(board, 0, *position)
        return env

    def _new_game(self) -> None:
        # A child generator per game: a redraw into the seed's split then takes one number of
        # np_random whatever max_steps (the sequence's length) is.
        rng = np.random.default_rng(seeded_child(self.np_random))
        self.game = draw_game(rng, self.dim_x, self.dim_y, self.box_type, self.max_steps + 1)
        self.state = self.game.start()

    def instance_key(self) -> str:
        """The pieces an episode can reach and their spawn columns: every locked piece fills
        a cell and a cleared row ends the game, so no episode plays past ``width * height``."""
        reach = self.dim_x * self.dim_y
        game = self.game
        return f"{game.width}x{game.height}:{game.pieces[:reach]}@{game.columns[:reach]}"

    def _step(self, action: str) -> Transition:
        move = _ACTION_BY_TEXT.get(action)
        if move is None:
            return Transition(STEP_PENALTY, valid=False, effective=False)
        outcome = self.game.move(self.state, move)
        self.state = outcome.state
        return Transition(
            STEP_PENALTY + LINE_REWARD * outcome.lines,
            valid=True,
            effective=outcome.effective,
            terminated=outcome.lines > 0 or outcome.game_over,
            success=outcome.lines > 0,
        )

    def valid_actions(self) -> list[str]:
        """All three moves while a piece falls (a bump into a wall is valid, just not effective)."""
        return list(ACTIONS) if self.state.row is not None else []

    def oracle_plan(self) -> list[str] | None:
        if self.state.row is None:
            return [] if self.success else None
        return plan(self.game, self.state)

    def render(self) -> str:
        return self.game.render(self.state)
