"""BabyAI as text: the wording on hand-checked grids, actions, seeds, and the BabyAI bot as oracle."""

from __future__ import annotations

import gymnasium
import pytest
from minigrid.core.world_object import Ball, Box, Door, Key, Wall
from minigrid.envs import EmptyEnv

import agentrl  # noqa: F401  (registers the games)
from agentrl.agents import Agent, load_agent_presets
from agentrl.envs.babyai import PRESETS, carrying_line, describe, relative_position
from agentrl.envs.splits import split_seeds

PRESET_AGENTS = {config.env_kwargs["preset"]: name for name, config in
                 load_agent_presets(check_envs=False).items() if config.game == "BabyAI"}
SLOW_PRESETS = {"empty-12x12", "doorkey-8x8", "goto-5-large", "pickup-5-large"}


def world(agent_pos, agent_dir, size=7):
    """An empty walled room (goal at the bottom-right corner) with the agent placed by hand;
    walls and closed doors block the view, as in BabyAI's and DoorKey's levels."""
    env = EmptyEnv(size=size, agent_start_pos=agent_pos, agent_start_dir=agent_dir)
    env.see_through_walls = False
    env.reset(seed=0)
    return env


def test_golden_open_room_facing_up():
    #   x: 0123456      agent ^ at (3, 5); box at (2, 3), ball at (3, 4), goal at (5, 5)
    # y=0  #######
    #   1  #.....#
    #   2  #.....#
    #   3  #.B...#
    #   4  #..o..#
    #   5  #..^.G#
    #   6  #######
    env = world((3, 5), 3)
    env.grid.set(2, 3, Box("grey"))
    env.grid.set(3, 4, Ball("red"))
    assert describe(env) == [
        "You see a wall 5 steps forward",
        "You see a wall 3 steps left",
        "You see a wall 3 steps right",
        "You see the goal 2 steps right",
        "You see a red ball 1 step forward",
        "You see a grey box 1 step left and 2 steps forward",
    ]
    assert carrying_line(env) == "You carry nothing"


def test_golden_locked_door_hides_what_is_behind_it():
    #   x: 0123456      agent > at (2, 3) carrying a yellow key; wall column x=4 with a locked
    # y=0  #######      yellow door at (4, 3); a blue ball behind it at (5, 3), a purple key
    #   1  #.k.#.#      in view at (2, 1) (2 steps left), a green box out of view at (1, 3)
    #   2  #...#.#      (behind the agent).
    #   3  #b.>D.#
    #   4  #...#.#
    #   5  #...#G#
    #   6  #######
    env = world((2, 3), 0)
    for y in range(1, 6):
        env.grid.set(4, y, Wall())
    env.grid.set(4, 3, Door("yellow", is_locked=True))
    env.grid.set(5, 3, Ball("blue"))
    env.grid.set(2, 1, Key("purple"))
    env.grid.set(1, 3, Box("green"))
    env.carrying = Key("yellow")
    assert describe(env) == [
        "You see a wall 3 steps left",
        "You see a wall 3 steps right",
        "You see a purple key 2 steps left",
        "You see a locked yellow door 2 steps forward",
    ]
    assert carrying_line(env) == "You carry a yellow key"
    env.grid.get(4, 3).is_locked, env.grid.get(4, 3).is_open = False, True
    assert describe(env) == [  # the open door lets the view through: the far wall, ball, goal
        "You see a wall 4 steps forward",
        "You see a wall 3 steps left",
        "You see a wall 3 steps right",
        "You see a purple key 2 steps left",
        "You see an open yellow door 2 steps forward",
        "You see a blue ball 3 steps forward",
        "You see the goal 2 steps right and 3 steps forward",
    ]


def test_relative_position_words():
    assert relative_position(-1, 2) == "1 step left and 2 steps forward"
    assert relative_position(3, 0) == "3 steps right"
    assert relative_position(0, 1) == "1 step forward"


def test_observation_is_mission_then_lines_then_carrying():
    env = gymnasium.make("agentrl/BabyAI-v0", preset="goto-3")
    obs, _ = env.reset(seed=0)
    lines = obs.splitlines()
    assert lines[0] == f"Mission: {env.unwrapped.mission}" and lines[0].startswith("Mission: go to")
    assert all(line.startswith("You see ") for line in lines[1:-1]) and len(lines) > 2
    assert lines[-1] == "You carry nothing"


def test_actions_any_case_and_effectiveness():
    env = gymnasium.make("agentrl/BabyAI-v0", preset="empty-8x8")
    env.reset(seed=3)
    *_, info = env.step("TURN Left")
    assert info["action_is_valid"] and info["action_is_effective"]
    *_, info = env.step("drop")  # nothing carried: valid, changes nothing
    assert info["action_is_valid"] and not info["action_is_effective"]
    obs, reward, terminated, _, info = env.step("jump")
    assert not info["action_is_valid"] and obs.startswith("That is not an action here.")
    assert env.unwrapped.valid_actions() == ["turn left", "turn right", "go forward", "pick up",
                                             "drop", "toggle"]


def test_mission_text_and_grid_follow_the_seed_and_presets_differ():
    def first(preset, seed):
        env = gymnasium.make("agentrl/BabyAI-v0", preset=preset)
        return env.reset(seed=seed)[0]

    assert first("goto-3", 5) == first("goto-3", 5)
    assert first("goto-3", 5) != first("goto-3", 6)
    assert first("pickup-3", 5).startswith("Mission: pick up")
    assert "use the key to open the door" in first("doorkey-5x5", 0)


def test_options_are_checked():
    with pytest.raises(ValueError, match="level"):
        gymnasium.make("agentrl/BabyAI-v0", level="maze")
    with pytest.raises(ValueError, match="room_size"):
        gymnasium.make("agentrl/BabyAI-v0", room_size=40)
    with pytest.raises(ValueError, match="distractors"):
        gymnasium.make("agentrl/BabyAI-v0", distractors=-1)


def test_every_preset_has_an_agent_preset():
    assert set(PRESET_AGENTS) == set(PRESETS)


ORACLE_SEEDS = 50


@pytest.mark.parametrize("preset", [
    pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PRESETS else p for p in PRESETS])
def test_bot_solves_held_out_seeds_within_the_agents_budget(preset):
    """The BabyAI bot, replanning each turn through the Agent, wins >= 95% of 50 val seeds
    within the agent preset's turn and action limits."""
    name = PRESET_AGENTS[preset]
    with Agent(load_agent_presets(check_envs=False)[name]) as agent:
        wins = 0
        for seed in split_seeds("val", ORACLE_SEEDS):
            agent.reset(seed=seed)
            while not agent.done:
                agent.step(agent.oracle_response())
            wins += agent.success
    assert wins >= 0.95 * ORACLE_SEEDS, f"{name}: {wins}/{ORACLE_SEEDS}"
