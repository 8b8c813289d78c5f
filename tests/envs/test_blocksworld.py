"""BlocksWorld: hand-checked moves, rewards and renders; generation; the oracle."""

from collections import Counter

import gymnasium
import pytest

import agentrl.envs  # noqa: F401  (registers the games)
from agentrl.envs.blocksworld import PRESETS, BlocksWorldEnv, all_states, is_valid

SEEDS = range(50)
TWO_ON_ONE = (0, 1, 0)  # block 2 on block 1; blocks 1 and 3 on the table


# -- renders -----------------------------------------------------------------------------------
@pytest.mark.parametrize("style, expected", [
    ("text", "Block 1 is on the table. Block 2 is on block 1. Block 3 is on the table."),
    ("1d", "[0, 1, 0]"),
    ("2d", "2 .\n1 3"),
])
def test_each_render_style_draws_the_state_exactly(style, expected):
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (0, 0, 0), render_style=style)
    goal = {"text": "Block 1 is on the table. Block 2 is on the table. Block 3 is on the table.",
            "1d": "[0, 0, 0]", "2d": "1 2 3"}[style]
    assert env.render() == f"Current state:\n{expected}\nGoal state:\n{goal}"


def test_2d_orders_stacks_by_bottom_block_and_pads_short_ones():
    env = BlocksWorldEnv.from_state((3, 0, 0, 1), (0, 0, 0, 0), render_style="2d")
    # Stacks: 3-1-4 (bottom 3) and 2; drawn bottom block first, top row first.
    assert env.render().split("\nGoal")[0] == "Current state:\n. 4\n. 1\n2 3"


# -- moves and rewards -------------------------------------------------------------------------
def test_a_legal_move_costs_one_and_changes_the_state():
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1), render_style="1d")
    obs, reward, terminated, truncated, info = env.step("move 2 to 0")
    assert env.state == (0, 0, 0) and obs.startswith("Current state:\n[0, 0, 0]\n")
    assert reward == -1 and not terminated and not truncated
    assert info["action_is_valid"] and info["action_is_effective"] and not info["success"]


def test_the_finishing_move_pays_nine_and_wins():
    env = BlocksWorldEnv.from_state((0, 0, 0), TWO_ON_ONE)
    _, reward, terminated, truncated, info = env.step("move 2 to 1")
    assert reward == 9 and terminated and not truncated and info["success"]
    assert env.oracle_plan() == []


@pytest.mark.parametrize("action, why", [
    ("move 1 to 3", "block 1 is not clear"),
    ("move 3 to 1", "target 1 is not clear"),
    ("move 3 to 3", "onto itself"),
    ("move 2 to 1", "already there"),
    ("move 1 to 0", "already on the table (and not clear)"),
    ("move 3 to table", "already on the table"),
    ("move 4 to 0", "no block 4"),
    ("move 0 to 3", "the table is no block"),
    ("move 2 to 9", "no block 9"),
    ("move 123456789012345678901234567890 to 1", "no such block"),
])
def test_illegal_moves_cost_one_and_change_nothing(action, why):
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    before = env.render()
    obs, reward, terminated, _, info = env.step(action)
    assert reward == -1 and obs == before and not terminated, why
    assert not info["action_is_valid"] and not info["action_is_effective"]


@pytest.mark.parametrize("action", ["", "   ", "move", "move 2", "move two to one", "2 to 0",
                                    "move 2 to 0 please", "move -1 to 0", "move ٣ to 0", "🙂",
                                    "x" * 10_000, None, 42, "stack 2 on 1"])
def test_unparseable_text_costs_five_and_changes_nothing(action):
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward == -5 and env.state == TWO_ON_ONE and not terminated and not truncated
    assert not info["action_is_valid"] and not info["action_is_effective"]


@pytest.mark.parametrize("action", ["Move 2 to 0", "  MOVE   2   TO   0 ", "move 2 to table",
                                    "move 2 to the table.", "move block 2 onto the table",
                                    "move block 2 on table"])
def test_parsing_tolerates_case_spaces_and_table_words(action):
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    _, reward, _, _, info = env.step(action)
    assert env.state == (0, 0, 0) and reward == -1 and info["action_is_valid"]


def test_move_onto_a_block_with_block_words():
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    env.step("move block 3 onto block 2")
    assert env.state == (0, 1, 2)


def test_valid_actions_are_exactly_the_legal_moves():
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    assert env.valid_actions() == ["move 2 to 0", "move 2 to 3", "move 3 to 2"]
    for action in env.valid_actions():
        probe = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
        assert probe.step(action)[4]["action_is_valid"]


def test_truncation_is_not_termination():
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1), max_steps=2)
    env.step("move 2 to 0")
    _, _, terminated, truncated, _ = env.step("move 2 to 1")
    assert truncated and not terminated


# -- generation --------------------------------------------------------------------------------
def test_arrangement_counts():
    assert [len(all_states(n)) for n in range(1, 6)] == [1, 3, 13, 73, 501]
    assert all(is_valid(state) for state in all_states(4))
    assert not is_valid((2, 1))  # a cycle
    assert not is_valid((0, 1, 1))  # two blocks on block 1
    assert not is_valid((1, 0))  # a block on itself


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_generated_games_are_valid_distinct_and_in_range(preset):
    env = gymnasium.make("agentrl/BlocksWorld-v0", preset=preset).unwrapped
    sizes = set()
    for seed in range(60):
        env.reset(seed=seed)
        assert env.state != env.goal and is_valid(env.state) and is_valid(env.goal)
        assert len(env.state) == len(env.goal)
        sizes.add(len(env.state))
    settings = PRESETS[preset]
    assert sizes == set(range(settings["min_blocks"], settings["max_blocks"] + 1))


def test_starts_cover_every_arrangement_roughly_evenly():
    env = gymnasium.make("agentrl/BlocksWorld-v0", min_blocks=3, max_blocks=3).unwrapped
    counts = Counter()
    for seed in range(3_000_000, 3_001_300):  # outside the splits: the generator alone
        env.reset(seed=seed)
        counts[env.state] += 1
    assert set(counts) == set(all_states(3))
    assert min(counts.values()) > 50  # 100 expected for each of the 13


def test_same_seed_same_game():
    first = gymnasium.make("agentrl/BlocksWorld-v0", preset="2d-5").unwrapped
    second = gymnasium.make("agentrl/BlocksWorld-v0", preset="2d-5").unwrapped
    assert first.reset(seed=5)[0] == second.reset(seed=5)[0]
    assert first.reset(seed=5)[0] != first.reset(seed=6)[0]


# -- oracle ------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_oracle_solves_every_preset_on_50_seeds(preset):
    env = gymnasium.make("agentrl/BlocksWorld-v0", preset=preset).unwrapped
    for seed in SEEDS:
        env.reset(seed=seed)
        plan = env.oracle_plan()
        assert plan, (preset, seed)
        for number, action in enumerate(plan, start=1):
            _, reward, terminated, _, info = env.step(action)
            assert info["action_is_valid"]
            assert terminated == (number == len(plan))
        assert reward == 9 and env.success


def test_oracle_plan_is_optimal_on_a_hand_checked_game():
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    # Goal: 3 on 1 on 2. Block 2 must come off 1 first; 1 onto 2, then 3 onto 1.
    assert env.oracle_plan() == ["move 2 to 0", "move 1 to 2", "move 3 to 1"]


def test_oracle_from_the_middle_of_a_game():
    env = BlocksWorldEnv.from_state(TWO_ON_ONE, (2, 0, 1))
    env.step("move 3 to 2")  # a detour
    plan = env.oracle_plan()
    assert len(plan) == 4
    for action in plan:
        env.step(action)
    assert env.success


# -- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"min_blocks": 1}, "min_blocks"),
    ({"max_blocks": 6}, "max_blocks"),
    ({"min_blocks": 4, "max_blocks": 3}, "min_blocks"),
    ({"render_style": "3d"}, "render_style"),
    ({"preset": "text-9"}, "preset"),
    ({"min_blocks": 2.5}, "min_blocks"),
])
def test_bad_settings_raise_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlocksWorldEnv(**kwargs)


def test_from_state_rejects_invalid_arrangements():
    with pytest.raises(ValueError):
        BlocksWorldEnv.from_state((2, 1), (0, 0))
