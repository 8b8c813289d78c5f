"""BabyAI / MiniGrid as a text game: minigrid's worlds seen through the agent's eyes, in words."""

from __future__ import annotations

import contextlib
import copy
import io
from dataclasses import dataclass

from agentrl.envs.base import TextGameEnv, Transition, checked_int, resolve_preset

PRESETS: dict[str, dict] = {
    # BabyAI GoToLocal / PickupLoc-like rooms (8 = 6x6 floor) with 0, 3 or 5 other objects.
    "goto-0": {"level": "goto", "room_size": 8, "distractors": 0},
    "goto-3": {"level": "goto", "room_size": 8, "distractors": 3},
    "goto-5": {"level": "goto", "room_size": 8, "distractors": 5},
    "pickup-0": {"level": "pickup", "room_size": 8, "distractors": 0},
    "pickup-3": {"level": "pickup", "room_size": 8, "distractors": 3},
    "pickup-5": {"level": "pickup", "room_size": 8, "distractors": 5},
    # Held-out twins: more distractors, or a room bigger than the 7x7 view (search needed).
    "goto-8": {"level": "goto", "room_size": 8, "distractors": 8},
    "goto-5-large": {"level": "goto", "room_size": 11, "distractors": 5},
    "pickup-8": {"level": "pickup", "room_size": 8, "distractors": 8},
    "pickup-5-large": {"level": "pickup", "room_size": 11, "distractors": 5},
    # MiniGrid's own levels (random start for Empty, so seeds differ); held out: bigger ones.
    "empty-8x8": {"level": "empty", "room_size": 8, "distractors": 0},
    "empty-12x12": {"level": "empty", "room_size": 12, "distractors": 0},
    "doorkey-5x5": {"level": "doorkey", "room_size": 5, "distractors": 0},
    "doorkey-8x8": {"level": "doorkey", "room_size": 8, "distractors": 0},
}
"""Level kind, room side (walls included) and objects besides the target."""

DEFAULT_PRESET = "goto-3"
LEVELS = ("goto", "pickup", "empty", "doorkey")
ROOM_SIZE_RANGE = (5, 16)
DISTRACTORS_RANGE = (0, 10)
"""Bounds keep a room generatable: BabyAI's sampler rejects rooms too full to place objects."""

ACTIONS: tuple[str, ...] = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
"""Text name of minigrid's actions 0-5 (6, "done", is unused by these levels)."""
_ACTION_INDEX = {name: index for index, name in enumerate(ACTIONS)}

REWARD = 1.0
"""Reward of a completed mission; minigrid's time-discounted reward is not used (the agent's
action budget already bounds the episode)."""
INVALID_FEEDBACK = "That is not an action here."


# -- minigrid levels ---------------------------------------------------------------------------
def _local_level_class():
    """BabyAI's GoToLocal generator with the instruction (go to / pick up) as a parameter.

    Built on first use so that importing this module does not import minigrid.
    """
    from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
    from minigrid.envs.babyai.core.verifier import GoToInstr, ObjDesc, PickupInstr

    instructions = {"goto": GoToInstr, "pickup": PickupInstr}

    class LocalLevel(RoomGridLevel):
        """One room: the target and ``distractors`` other objects, any type and colour."""

        def __init__(self, instruction: str, room_size: int, distractors: int, **kwargs):
            self.instruction = instructions[instruction]
            self.distractors = distractors
            super().__init__(num_rows=1, num_cols=1, room_size=room_size, **kwargs)

        def gen_mission(self):
            self.place_agent()
            objects = self.add_distractors(num_distractors=self.distractors + 1, all_unique=False)
            self.check_objs_reachable()
            target = self._rand_elem(objects)
            self.instrs = self.instruction(ObjDesc(target.type, target.color))

    return LocalLevel


def make_level(level: str, room_size: int, distractors: int):
    """The minigrid env of a preset (not yet reset)."""
    if level in ("goto", "pickup"):
        return _local_level_class()(level, room_size, distractors)
    from minigrid.envs import DoorKeyEnv, EmptyEnv

    if level == "empty":
        return EmptyEnv(size=room_size, agent_start_pos=None)
    return DoorKeyEnv(size=room_size)


# -- the words -----------------------------------------------------------------------------------
def _steps(count: int, direction: str) -> str:
    return f"{count} step{'s' if count > 1 else ''} {direction}"


def relative_position(right: int, forward: int) -> str:
    """``(right, forward)`` steps from the agent in words: "1 step left and 2 steps forward"."""
    parts = []
    if right:
        parts.append(_steps(abs(right), "left" if right < 0 else "right"))
    if forward:
        parts.append(_steps(forward, "forward"))
    return " and ".join(parts)


def object_name(obj) -> str:
    """A minigrid object in words: "a grey box", "a locked yellow door", "the goal"."""
    if obj.type == "door":
        state = "open" if obj.is_open else "locked" if obj.is_locked else "closed"
        return f"an {state} {obj.color} door" if state == "open" else f"a {state} {obj.color} door"
    if obj.type == "goal":
        return "the goal"
    if obj.type == "lava":
        return "lava"
    return f"a {obj.color} {obj.type}"


def describe(env) -> list[str]:
    """What the agent sees, one line per wall or object (BabyAI-Text's style).

    Walls: the nearest visible wall straight ahead, to the left and to the right of the agent
    (in its row). Objects: every visible non-wall object of the 7x7 view in front of the agent,
    nearest rows first, left to right. Positions count steps from the agent's cell.
    """
    grid, visible = env.gen_obs_grid()
    ax, ay = grid.width // 2, grid.height - 1  # the agent's cell in its own view, facing "up"
    lines = []
    rays = (("forward", [(ax, ay - k) for k in range(1, ay + 1)]),
            ("left", [(ax - k, ay) for k in range(1, ax + 1)]),
            ("right", [(ax + k, ay) for k in range(1, grid.width - ax)]))
    for direction, cells in rays:
        for distance, (i, j) in enumerate(cells, start=1):
            if not visible[i, j]:
                break
            cell = grid.get(i, j)
            if cell is not None and cell.type == "wall":
                lines.append(f"You see a wall {_steps(distance, direction)}")
                break
    for j in range(ay, -1, -1):
        for i in range(grid.width):
            cell = grid.get(i, j)
            if (i, j) == (ax, ay) or cell is None or cell.type == "wall" or not visible[i, j]:
                continue
            lines.append(f"You see {object_name(cell)} {relative_position(i - ax, ay - j)}")
    return lines


def carrying_line(env) -> str:
    return f"You carry {object_name(env.carrying)}" if env.carrying else "You carry nothing"


# -- the oracle ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _WholeGrid:
    """A room covering the whole grid, for MiniGrid levels the BabyAI bot asks rooms of."""

    def pos_inside(self, x: int, y: int) -> bool:
        return True


def bot_plan(env, limit: int) -> list[str] | None:
    """minigrid's BabyAI bot played on a copy of ``env`` until the mission is done.

    BabyAI levels: the bot follows the level's instruction. MiniGrid's Empty and DoorKey have
    no instruction: the bot is sent next to the goal square (fetching the key and unlocking the
    door on its way, as it does in BabyAI), then one ``go forward`` steps onto it. Returns the
    action names, or None when the bot gives up, fails, or needs more than ``limit`` actions.
    """
    from minigrid.utils.baby_ai_bot import BabyAIBot, DisappearedBoxError, GoNextToSubgoal

    env = copy.deepcopy(env)
    goal = None
    if not hasattr(env, "instrs"):
        from minigrid.envs.babyai.core.verifier import GoToInstr, ObjDesc

        goal = next((i, j) for i in range(env.grid.width) for j in range(env.grid.height)
                    if getattr(env.grid.get(i, j), "type", None) == "goal")
        env.room_from_pos = lambda x, y: _WholeGrid()
        env.instrs = GoToInstr(ObjDesc("ball"))  # parsed by the bot's constructor, then replaced
    plan: list[str] = []
    try:
        bot = BabyAIBot(env)
        if goal is not None:
            bot.stack = [GoNextToSubgoal(bot, goal)]
        while len(plan) < limit:
            if goal is not None and tuple(env.front_pos) == goal:
                return plan + ["go forward"]
            action = int(bot.replan())
            if action >= len(ACTIONS):  # "done": the bot believes the mission is over
                return None
            plan.append(ACTIONS[action])
            _, _, terminated, _, _ = env.step(action)
            if terminated:
                return plan
    except (AssertionError, DisappearedBoxError, RecursionError):
        return None  # the bot's own checks: e.g. a box it relied on was opened (it vanishes)
    return None


class BabyAIEnv(TextGameEnv):
    """Do a BabyAI / MiniGrid mission in a grid world described in words.

    ## Actions
    ``turn left``, ``turn right``, ``go forward``, ``pick up``, ``drop``, ``toggle`` (opens and
    closes doors, unlocks a locked door when carrying the key of its colour), any case and
    spacing. All six are always valid; one that changes nothing (walking into a wall, picking up
    from an empty cell) is valid but not effective. Any other text is invalid: nothing happens,
    the step counts, the feedback says so.

    ## Observation
    Text in BabyAI-Text's style, from the agent's egocentric 7x7 view (walls and closed doors
    hide what is behind them)::

        Mission: go to the red ball
        You see a wall 3 steps forward
        You see a wall 2 steps left
        You see a grey box 1 step left and 2 steps forward
        You carry nothing

    Walls: the nearest visible one straight ahead, left and right of the agent. Objects: every
    visible one (doors with their state: open, closed or locked; ``the goal`` square), nearest
    rows first. ``render()`` is the same text.

    ## Starting state
    minigrid's generator for the preset's level, seeded with the env seed itself (drawn from
    ``np_random`` when reset has no seed). Small levels repeat worlds across seeds (an empty
    room has only its start squares and headings), so a world whose instance key belongs to
    another split than the seed's is redrawn from ``np_random`` (``TextGameEnv.reset``):
    held-out worlds are never training worlds.
    ``goto``/``pickup``: BabyAI's GoToLocal room with the target and ``distractors`` other
    objects, mission "go to ..." / "pick up ...". ``empty``: MiniGrid's Empty room with a random
    start. ``doorkey``: MiniGrid's DoorKey (a key, a locked door, the goal behind it).

    ## Rewards
    1 when the mission is done, else 0 (minigrid's time-discounted reward is not used).

    ## Episode end
    Terminated when the mission is done (or failed: none of these levels can fail). Truncated
    after ``max_steps`` actions, invalid ones included.

    ## Arguments
    ``preset`` (a key of ``PRESETS``, default ``"goto-3"``); overrides ``level`` (one of
    ``LEVELS``), ``room_size`` (``ROOM_SIZE_RANGE``, walls included), ``distractors``
    (``DISTRACTORS_RANGE``, goto/pickup only); ``max_steps`` (default 100); ``render_mode``
    ("ansi"). ``oracle_plan()`` is minigrid's BabyAI bot, played on a copy of the world.

    ## Version history
    - v0: minigrid 3.2 levels, BabyAI-Text-style wording, reward 1 on success.
    """

    rules = (
        "BabyAI: a grid world. You see a 7x7 square ahead of you; walls and doors hide what is\n"
        "behind them. Positions are in steps from you: left/right and forward.\n"
        "Actions: turn left, turn right, go forward, pick up (the object just in front of you),\n"
        "drop, toggle (open a door in front of you; a locked door needs the key of its colour).\n"
        "'Go to' an object means standing next to it and facing it.\n"
        "Reward: +1 when the mission is done (the episode then ends)."
    )

    def __init__(self, preset: str = DEFAULT_PRESET, level: str | None = None,
                 room_size: int | None = None, distractors: int | None = None,
                 max_steps: int = 100, render_mode: str | None = "ansi"):
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        settings = resolve_preset("BabyAI", PRESETS, preset, level=level, room_size=room_size,
                                  distractors=distractors)
        if settings["level"] not in LEVELS:
            raise ValueError(f"BabyAI: level must be one of {list(LEVELS)}, "
                             f"got {settings['level']!r}")
        self.preset = preset
        self.level = settings["level"]
        self.room_size = checked_int("BabyAI", "room_size", settings["room_size"],
                                     *ROOM_SIZE_RANGE)
        self.distractors = checked_int("BabyAI", "distractors", settings["distractors"],
                                       *DISTRACTORS_RANGE)
        self.world = make_level(self.level, self.room_size, self.distractors)
        self.game_seed: int | None = None
        self._feedback = ""
        self._taken: list[str] = []  # the actions run this episode (valid ones)
        self._plan: tuple[int, list[str]] | None = None  # (len(_taken) then, the bot's plan)

    # -- game hooks ------------------------------------------------------------------------------
    def _new_game(self) -> None:
        self.game_seed = self._draw_seed()
        with contextlib.redirect_stdout(io.StringIO()):  # BabyAI prints each rejected room
            self.world.reset(seed=self.game_seed)
        self._feedback = ""
        self._taken, self._plan = [], None

    def instance_key(self) -> str:
        """Mission, whole grid (walls, doors, objects) and the agent's start and heading."""
        world = self.world
        return (f"{world.mission}|{tuple(world.agent_pos)}|{world.agent_dir}|"
                f"{world.grid.encode().tobytes().hex()}")

    def _step(self, action: str) -> Transition:
        index = _ACTION_INDEX.get(action)
        if index is None:
            self._feedback = INVALID_FEEDBACK
            return Transition(reward=0.0, valid=False, effective=False)
        self._feedback = ""
        self._taken.append(action)
        before = self._signature()
        _, reward, terminated, _, _ = self.world.step(index)  # minigrid's own time limit unused
        success = bool(terminated and reward > 0)
        return Transition(reward=REWARD if success else 0.0, valid=True,
                          effective=self._signature() != before, terminated=bool(terminated),
                          success=success)

    def _signature(self) -> tuple:
        """Everything an action can change: position, direction, what is carried, the grid."""
        world = self.world
        carried = world.carrying.encode() if world.carrying else None
        return (tuple(world.agent_pos), world.agent_dir, carried, world.grid.encode().tobytes())

    def valid_actions(self) -> list[str]:
        """The six actions (always all legal), none once the game is over."""
        return [] if self.done else list(ACTIONS)

    def oracle_plan(self) -> list[str] | None:
        """The BabyAI bot's actions from here to the mission's end (None if it cannot).

        The plan is kept while the episode follows it: a bot started afresh in the middle of
        an exploration may turn back and forth where the first one would have gone on.
        """
        if self.success:
            return []
        if self._plan is not None:
            start, plan = self._plan
            done = self._taken[start:]
            if done == plan[: len(done)] and len(done) < len(plan):
                return plan[len(done):]
        plan = bot_plan(self.world, limit=max(1, self.max_steps - self.num_steps))
        self._plan = None if plan is None else (len(self._taken), plan)
        return plan

    @property
    def mission(self) -> str:
        return self.world.mission

    def render(self) -> str:
        lines = [f"Mission: {self.mission}", *describe(self.world), carrying_line(self.world)]
        if self._feedback:
            lines.insert(0, self._feedback)
        return "\n".join(lines)
