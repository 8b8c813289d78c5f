"""BlocksWorld (GRL's rules): restack numbered blocks into a goal arrangement."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from functools import cache

from agentrl.envs.base import TextGameEnv, Transition, resolve_preset
from agentrl.envs.search import shortest_plan

PRESETS: dict[str, dict] = {
    # GRL's three renderings of 2-4 blocks ("text" is the default).
    "text": {"min_blocks": 2, "max_blocks": 4, "render_style": "text"},
    "1d": {"min_blocks": 2, "max_blocks": 4, "render_style": "1d"},
    "2d": {"min_blocks": 2, "max_blocks": 4, "render_style": "2d"},
    # Held-out harder variants: five blocks (501 arrangements, plans up to 8 moves).
    "text-5": {"min_blocks": 5, "max_blocks": 5, "render_style": "text"},
    "1d-5": {"min_blocks": 5, "max_blocks": 5, "render_style": "1d"},
    "2d-5": {"min_blocks": 5, "max_blocks": 5, "render_style": "2d"},
}
DEFAULT_PRESET = "text"
BLOCKS_RANGE = (2, 5)
"""Blocks per game: 1 block has a single arrangement; 5 keeps every state list tiny (501)."""
RENDER_STYLES = ("text", "1d", "2d", "compact")

TABLE = 0
UNPARSEABLE_PENALTY = -5.0
ILLEGAL_PENALTY = -1.0
MOVE_PENALTY = -1.0
GOAL_REWARD = 10.0

_MOVE = re.compile(r"move (?:block )?([0-9]+) (?:to|onto|on) (?:block )?([0-9]+|(?:the )?table)")
"""``move X to Y`` after normalization; also ``block X``, ``onto``/``on``, ``table``/``the table``
for Y = 0, and a trailing period (stripped before matching)."""

State = tuple[int, ...]
"""``state[i]`` = what block ``i + 1`` sits on: 0 for the table, else a block number."""


def is_valid(state: State) -> bool:
    """Stacks only: no block on itself, at most one block on another, no cycles."""
    n = len(state)
    supports = [below for below in state if below != TABLE]
    if any(not 0 <= below <= n for below in state) or len(set(supports)) != len(supports):
        return False
    for block in range(1, n + 1):
        below, steps = state[block - 1], 0
        while below != TABLE:
            below, steps = state[below - 1], steps + 1
            if steps > n:
                return False
    return True


@cache
def all_states(n: int) -> tuple[State, ...]:
    """Every arrangement of ``n`` blocks, in a fixed order (1, 3, 13, 73, 501 for n = 1..5)."""
    return tuple(s for s in itertools.product(range(n + 1), repeat=n) if is_valid(s))


def is_clear(state: State, block: int) -> bool:
    return block not in state


def legal(state: State, block: int, target: int) -> bool:
    """A move is legal when both ends are clear and it changes the state.

    The table is always clear. Moving a block onto what it already sits on is illegal (it would
    change nothing), as are unknown blocks and a block onto itself.
    """
    n = len(state)
    return (
        1 <= block <= n
        and 0 <= target <= n
        and block != target
        and state[block - 1] != target
        and is_clear(state, block)
        and (target == TABLE or is_clear(state, target))
    )


def apply_move(state: State, block: int, target: int) -> State:
    return state[: block - 1] + (target,) + state[block:]


def legal_moves(state: State) -> Iterator[tuple[int, int]]:
    n = len(state)
    for block in range(1, n + 1):
        for target in range(n + 1):
            if legal(state, block, target):
                yield block, target


def parse_move(text: str) -> tuple[int, int] | None:
    """(block, target) from normalized text, or ``None`` when it is no ``move X to Y``."""
    match = _MOVE.fullmatch(text.rstrip("."))
    if match is None:
        return None
    target = match.group(2)
    return int(match.group(1)), TABLE if target.endswith("table") else int(target)


def action_text(block: int, target: int) -> str:
    return f"move {block} to {target}"


def stacks(state: State) -> list[list[int]]:
    """Stacks bottom block first, ordered by their bottom block's number."""
    above = {below: block for block, below in enumerate(state, start=1) if below != TABLE}
    result = []
    for bottom in (block for block, below in enumerate(state, start=1) if below == TABLE):
        stack = [bottom]
        while stack[-1] in above:
            stack.append(above[stack[-1]])
        result.append(stack)
    return result


def render_text(state: State) -> str:
    return " ".join(
        f"Block {block} is on {'the table' if below == TABLE else f'block {below}'}."
        for block, below in enumerate(state, start=1)
    )


def render_1d(state: State) -> str:
    return str(list(state))


def render_2d(state: State) -> str:
    """Each stack a column, bottom block in the bottom row (which stands on the table)."""
    columns = stacks(state)
    height = max(len(column) for column in columns)
    rows = []
    for level in reversed(range(height)):
        rows.append(" ".join(str(col[level]) if level < len(col) else "." for col in columns))
    return "\n".join(rows)


def render_compact(state: State) -> str:
    """Each block that sits on another, as 'X on Y' in block order; the rest are on the table:
    ``3 on 1, 4 on 3``, or ``all on the table``."""
    pairs = [f"{block} on {below}" for block, below in enumerate(state, start=1)
             if below != TABLE]
    return ", ".join(pairs) if pairs else "all on the table"


RENDERERS = {"text": render_text, "1d": render_1d, "2d": render_2d, "compact": render_compact}


class BlocksWorldEnv(TextGameEnv):
    """BlocksWorld: move numbered blocks, one clear block at a time, into the goal stacks.

    GRL's game and rewards; instances are generated from the seed instead of GRL's fixed files,
    so train and held-out seed ranges never share an instance.

    ## Actions
    ``move X to Y``: put clear block X on clear block Y, or on the table for Y = 0. A block is
    clear when nothing sits on it; the table is always clear. Parsing ignores case and extra
    spaces and also takes ``move block X to block Y``, ``onto``/``on`` for ``to``, ``table`` or
    ``the table`` for 0, and a trailing period. A move is illegal (``action_is_valid=False``,
    nothing changes) when X or Y is not a block of this game, X = Y, X is not clear, Y is not
    clear, or X already sits on Y.

    ## Observation
    The current state and the goal, in the preset's ``render_style``::

        Current state:
        <state>
        Goal state:
        <state>

    ``text``: one sentence per block, ``Block 2 is on block 1. Block 1 is on the table.``
    (in block order). ``1d``: what each block sits on, block 1 first: ``[0, 1, 0]``.
    ``2d``: one column per stack (ordered by bottom block), top row first, ``.`` empty; the
    bottom row stands on the table, e.g. ``2 .`` over ``1 3``. ``compact`` (short prompts):
    ``X on Y`` for each block on another, the rest on the table (``2 on 1``; ``all on the
    table``), on the heading's line: ``Current state: 2 on 1``.

    ## Starting state
    The number of blocks is drawn uniformly from ``min_blocks..max_blocks``; the start is drawn
    uniformly from every arrangement of that many blocks and the goal uniformly from the others
    (start != goal), all from the seed.

    ## Rewards
    -5 for text that is no ``move X to Y``; -1 for an illegal move; -1 per legal move and +10
    when it reaches the goal (the finishing move pays -1 + 10 = 9).

    ## Episode end
    Terminated with success when the blocks match the goal. Truncated after ``max_steps``
    actions.

    ## Arguments
    - ``preset``: ``"text"`` (default), ``"1d"``, ``"2d"`` (2-4 blocks); ``"text-5"``,
      ``"1d-5"``, ``"2d-5"`` (5 blocks, held-out harder).
    - ``min_blocks``, ``max_blocks``: blocks per game, 2-5.
    - ``render_style``: ``"text"``, ``"1d"``, ``"2d"`` or ``"compact"``.
    - ``max_steps``: actions before truncation (default 100); ``render_mode``: ``"ansi"``.

    ## Version history
    - v0: first version.
    """

    worst_legal_reward = MOVE_PENALTY  # illegal (-1) and unparseable (-5) text is not legal
    worst_text_reward = UNPARSEABLE_PENALTY
    rules = (
        "BlocksWorld: rearrange the numbered blocks until they match the goal state.\n"
        "Action: 'move X to Y' puts block X on block Y, or on the table when Y is 0. Only a "
        "clear block (nothing on top of it) can move, and only onto a clear block or the table.\n"
        "States list what each block sits on (0 = the table); in 2d drawings each column is a "
        "stack, bottom row on the table, '.' empty.\n"
        "Rewards: -1 per move, +10 on reaching the goal, -1 for an illegal move, -5 for text "
        "that is not a move."
    )

    @property
    def brief_rules(self) -> str:
        """The rules of agent presets with ``rules: brief``: the goal, what a move is, and how
        ``compact`` states read."""
        unlisted = " (unlisted blocks: on the table)" if self.render_style == "compact" else ""
        return (f"Reach the goal state{unlisted}. 'move X to Y' puts clear block X (nothing on "
                "it) on clear block Y (0: the table).")

    def __init__(self, preset: str = DEFAULT_PRESET, min_blocks: int | None = None,
                 max_blocks: int | None = None, render_style: str | None = None,
                 max_steps: int = 100, render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("BlocksWorld", PRESETS, preset, min_blocks=min_blocks,
                                  max_blocks=max_blocks, render_style=render_style)
        low, high = BLOCKS_RANGE
        for key in ("min_blocks", "max_blocks"):
            value = settings[key]
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"BlocksWorld: {key} must be an integer in {low}..{high}, "
                                 f"got {value!r}")
        if settings["min_blocks"] > settings["max_blocks"]:
            raise ValueError(f"BlocksWorld: min_blocks={settings['min_blocks']} exceeds "
                             f"max_blocks={settings['max_blocks']}")
        if settings["render_style"] not in RENDER_STYLES:
            raise ValueError(f"BlocksWorld: render_style must be one of {list(RENDER_STYLES)}, "
                             f"got {settings['render_style']!r}")
        self.preset = preset
        self.min_blocks, self.max_blocks = settings["min_blocks"], settings["max_blocks"]
        self.render_style = settings["render_style"]
        self.state: State = ()
        self.goal: State = ()

    @classmethod
    def from_state(cls, state: Sequence[int], goal: Sequence[int], render_style: str = "text",
                   max_steps: int = 100) -> BlocksWorldEnv:
        """A game from hand-written arrangements (tests, demos); raises on an invalid one."""
        state, goal = tuple(state), tuple(goal)
        if len(state) != len(goal) or not is_valid(state) or not is_valid(goal):
            raise ValueError(f"not a pair of valid arrangements: {state}, {goal}")
        env = cls(min_blocks=len(state), max_blocks=len(state), render_style=render_style,
                  max_steps=max_steps)
        env.reset(seed=0)
        env.state, env.goal = state, goal
        return env

    def _new_game(self) -> None:
        n = int(self.np_random.integers(self.min_blocks, self.max_blocks + 1))
        states = all_states(n)
        start = int(self.np_random.integers(len(states)))
        goal = int(self.np_random.integers(len(states) - 1))
        self.state = states[start]
        self.goal = states[goal + (goal >= start)]  # skip the start: uniform over the others

    def instance_key(self) -> str:
        """Start and goal arrangements: the same pair is the same game in every rendering."""
        return f"{self.state}->{self.goal}"

    def _step(self, action: str) -> Transition:
        move = parse_move(action)
        if move is None:
            return Transition(UNPARSEABLE_PENALTY, valid=False, effective=False)
        if not legal(self.state, *move):
            return Transition(ILLEGAL_PENALTY, valid=False, effective=False)
        self.state = apply_move(self.state, *move)
        solved = self.state == self.goal
        return Transition(MOVE_PENALTY + GOAL_REWARD * solved, valid=True, effective=True,
                          terminated=solved, success=solved)

    def valid_actions(self) -> list[str]:
        return [action_text(block, target) for block, target in legal_moves(self.state)]

    def oracle_plan(self) -> list[str] | None:
        def successors(state: State) -> Iterator[tuple[str, State]]:
            for block, target in legal_moves(state):
                yield action_text(block, target), apply_move(state, block, target)

        return shortest_plan(self.state, successors, lambda state: state == self.goal)

    def render(self) -> str:
        draw = RENDERERS[self.render_style]
        gap = " " if self.render_style == "compact" else "\n"
        return f"Current state:{gap}{draw(self.state)}\nGoal state:{gap}{draw(self.goal)}"
