"""Tetris: hand-checked dynamics, piece generation that is always winnable, and the oracle."""

import itertools

import gymnasium
import numpy as np
import pytest

import agentrl.envs  # noqa: F401  (registers the games)
from agentrl.envs.tetris import (
    ACTIONS,
    PRESETS,
    TetrisEnv,
    draw_columns,
    draw_game,
    kit_clears_row,
    piece_width,
)

SEEDS = range(50)


def board(env: TetrisEnv) -> list[str]:
    return env.render().split("\n")


# -- golden dynamics ---------------------------------------------------------------------------
def test_completing_a_row_clears_it_pays_ten_and_wins():
    env = TetrisEnv.from_board(["___", "___", "#_#"], ["1x1", "1x1"])
    assert board(env) == ["_X_", "___", "#_#"]
    obs, reward, terminated, truncated, info = env.step("Down")
    assert obs == "___\n_X_\n#_#"
    assert reward == pytest.approx(-0.1) and not terminated and info["action_is_effective"]
    obs, reward, terminated, truncated, info = env.step("Down")
    assert obs == "___\n___\n___"  # the full bottom row is gone, no new piece after the win
    assert reward == pytest.approx(9.9)
    assert terminated and not truncated and info["success"]
    assert env.oracle_plan() == [] and env.valid_actions() == []


def test_rows_above_a_cleared_row_drop_and_two_rows_pay_twice():
    env = TetrisEnv.from_board(["___", "___", "#_#"], ["2x1"])
    assert board(env) == ["_X_", "_X_", "#_#"]
    _, reward, terminated, _, info = env.step("Down")
    assert board(env) == ["___", "___", "_#_"]  # upper half of the piece fell into the row
    assert reward == pytest.approx(9.9) and terminated and info["success"]

    env = TetrisEnv.from_board(["___", "#_#", "#_#"], ["2x1"])
    _, reward, terminated, _, _ = env.step("down")
    assert reward == pytest.approx(19.9) and terminated
    assert board(env) == ["___", "___", "___"]


def test_a_piece_locks_as_soon_as_it_lands_and_the_next_one_spawns():
    env = TetrisEnv.from_board(["___", "___", "___"], ["1x1", "1x1"])
    env.step("Down")
    _, reward, terminated, _, info = env.step("Down")  # reaches the floor: locks at once
    assert board(env) == ["_X_", "___", "_#_"]
    assert reward == pytest.approx(-0.1) and not terminated and info["action_is_effective"]

    env = TetrisEnv.from_board(["___", "___", "_#_"], ["1x1", "1x1"])
    env.step("Down")  # one row down it rests on a block: locks there
    assert board(env) == ["_X_", "_#_", "_#_"]


def test_down_on_a_resting_piece_locks_it_in_place():
    env = TetrisEnv.from_board(["___", "#__", "#__"], ["1x1", "1x1"], position=(0, 0))
    _, _, terminated, _, info = env.step("Down")
    assert board(env) == ["#X_", "#__", "#__"] and info["action_is_effective"]
    assert not terminated  # the next piece still has room at the top


def test_bumping_a_wall_or_a_block_is_valid_but_not_effective():
    env = TetrisEnv.from_board(["___", "___", "___"], ["1x1"])
    env.step("Left")
    assert board(env)[0] == "X__"
    obs, reward, terminated, _, info = env.step("Left")
    assert obs.split("\n")[0] == "X__" and reward == pytest.approx(-0.1) and not terminated
    assert info["action_is_valid"] and not info["action_is_effective"]

    env = TetrisEnv.from_board(["___", "__#", "___"], ["1x1"], position=(1, 1))
    _, _, _, _, info = env.step("Right")
    assert board(env) == ["___", "_X#", "___"]
    assert info["action_is_valid"] and not info["action_is_effective"]


def test_horizontal_piece_spawns_centred_left_and_stops_at_the_wall():
    env = TetrisEnv.from_board(["___", "___", "___"], ["1x2"])
    assert board(env)[0] == "XX_"
    env.step("Right")
    assert board(env)[0] == "_XX"
    _, _, _, _, info = env.step("Right")
    assert board(env)[0] == "_XX" and not info["action_is_effective"]
    wide = TetrisEnv.from_board(["____"] * 4, ["1x2"])
    assert board(wide)[0] == "_XX_"
    single = TetrisEnv.from_board(["____"] * 4, ["1x1"])
    assert board(single)[0] == "_X__"


def test_game_over_when_the_next_piece_cannot_spawn():
    env = TetrisEnv.from_board(["___", "_#_", "##_"], ["1x1", "1x1"])
    obs, reward, terminated, truncated, info = env.step("Down")  # rests at once, locks on top
    assert obs == "_#_\n_#_\n##_"
    assert reward == pytest.approx(-0.1) and terminated and not truncated
    assert not info["success"]
    assert env.oracle_plan() is None and env.valid_actions() == []
    # Stepping past the end is a harmless no-op.
    assert env.step("Left")[1:3] == (0.0, True)


def test_a_vertical_piece_blocked_below_its_top_cell_ends_the_game():
    env = TetrisEnv.from_board(["___", "___", "_#_"], ["1x1", "2x1"])
    _, _, terminated, _, info = env.step("Down")  # locks at row 1: the 2x1 needs rows 0 and 1
    assert terminated and not info["success"]


def test_running_out_of_pieces_is_a_game_over():
    env = TetrisEnv.from_board(["___", "___", "___"], ["1x1"])
    env.step("Down")
    _, _, terminated, _, info = env.step("Down")
    assert terminated and not info["success"]


@pytest.mark.parametrize("action", ["", " ", "jump", "left left", "l", "x" * 10_000, "←", "下",
                                    None, 3, "Left!"])
def test_invalid_text_is_a_no_op_costing_a_step(action):
    env = TetrisEnv.from_board(["___", "___", "___"], ["1x1"])
    before = env.render()
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == before and reward == pytest.approx(-0.1)
    assert not terminated and not truncated
    assert not info["action_is_valid"] and not info["action_is_effective"]
    assert info["num_steps"] == 1


@pytest.mark.parametrize("action", ["LEFT", " left ", "lEfT"])
def test_actions_ignore_case_and_spacing(action):
    env = TetrisEnv.from_board(["___", "___", "___"], ["1x1"])
    _, _, _, _, info = env.step(action)
    assert board(env)[0] == "X__" and info["action_is_valid"] and info["action_is_effective"]


def test_truncation_is_not_termination():
    env = gymnasium.make("agentrl/Tetris-v0", max_steps=2).unwrapped
    env.reset(seed=0)
    env.step("Left")
    _, _, terminated, truncated, _ = env.step("Left")
    assert truncated and not terminated


# -- generation --------------------------------------------------------------------------------
def test_same_seed_same_pieces_and_type2_seeds_differ():
    first = gymnasium.make("agentrl/Tetris-v0", preset="4x4-type2").unwrapped
    second = gymnasium.make("agentrl/Tetris-v0", preset="4x4-type2").unwrapped
    first.reset(seed=7)
    second.reset(seed=7)
    assert first.game.pieces == second.game.pieces
    sequences = set()
    for seed in range(10):
        first.reset(seed=seed)
        sequences.add(first.game.pieces)
    assert len(sequences) == 10


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_sequence_is_long_enough_and_uses_only_the_preset_pieces(preset):
    env = gymnasium.make("agentrl/Tetris-v0", preset=preset, max_steps=40).unwrapped
    env.reset(seed=3)
    assert len(env.game.pieces) >= 41
    allowed = {"1x1"} if PRESETS[preset]["box_type"] == 1 else {"1x1", "1x2", "2x1"}
    assert set(env.game.pieces) <= allowed


def all_kits(width):
    """Every ordered run of pieces whose widths add up to one row."""
    for length in range(1, width + 1):
        for kit in itertools.product(("1x1", "1x2", "2x1"), repeat=length):
            if sum(piece_width(piece) for piece in kit) == width:
                yield kit


@pytest.mark.parametrize("preset", ["3x3-type2",
                                    pytest.param("4x4-type2", marks=pytest.mark.slow)])
def test_every_possible_first_kit_of_the_presets_clears_a_row(preset):
    dims = PRESETS[preset]
    width = dims["dim_x"]
    kits = list(all_kits(width))
    assert len(kits) in (12, 29)
    for kit in kits:
        spawn_columns = [range(width - piece_width(piece) + 1) for piece in kit]
        for columns in itertools.product(*spawn_columns):
            assert kit_clears_row(width, dims["dim_y"], kit, columns), (kit, columns)


def test_a_hopeless_first_kit_is_rejected_and_redrawn():
    # On a 3-wide, 2-high board a 1x2 then a 2x1 cannot fill a row: the 2x1 has no room at the
    # top once the 1x2 sits in the bottom row.
    assert not kit_clears_row(3, 2, ("1x2", "2x1"))
    for seed in range(30):
        game = draw_game(np.random.default_rng(seed), 3, 2, 2, count=20)
        length = 0
        while sum(map(piece_width, game.pieces[:length])) < 3:
            length += 1
        assert kit_clears_row(3, 2, game.pieces[:length], game.columns[:length])


def test_spawn_columns_come_from_the_seed_so_single_block_games_differ():
    rng = np.random.default_rng(0)
    columns = draw_columns(rng, 4, ["1x1"] * 200 + ["1x2"] * 200)
    assert set(columns[:200]) == {0, 1, 2, 3} and set(columns[200:]) == {0, 1, 2}
    starts = {TetrisEnv(preset="4x4-type1").reset(seed=seed)[0] for seed in range(20)}
    assert len(starts) == 4  # the first block enters in any of the four columns


# -- oracle ------------------------------------------------------------------------------------
def play(env, plan) -> bool:
    """Step through ``plan``; True when it ends the game exactly on its last action."""
    terminated = False
    for action in plan:
        assert not terminated
        _, _, terminated, truncated, info = env.step(action)
        assert info["action_is_valid"] and not truncated
    return terminated


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_oracle_wins_every_preset_on_50_seeds(preset):
    env = gymnasium.make("agentrl/Tetris-v0", preset=preset).unwrapped
    for seed in SEEDS:
        env.reset(seed=seed)
        plan = env.oracle_plan()
        assert plan, (preset, seed)
        assert set(plan) <= set(ACTIONS)
        terminated = play(env, plan)
        assert terminated and env.success, (preset, seed)


def test_oracle_is_shortest_on_a_hand_checked_board():
    env = TetrisEnv.from_board(["___", "___", "#__"], ["1x1", "1x1"])
    # Fewest: two Downs bring each piece to the bottom row, plus one Right for either of them.
    plan = env.oracle_plan()
    assert len(plan) == 5 and plan.count("Right") == 1
    assert play(env, plan) and env.success


def test_oracle_plans_from_the_middle_of_a_game():
    env = gymnasium.make("agentrl/Tetris-v0", preset="4x4-type2").unwrapped
    env.reset(seed=11)
    env.step("Right")
    env.step("Down")
    plan = env.oracle_plan()
    if plan is None:  # those two moves may have ruined the game; then search proves it
        return
    terminated = play(env, plan)
    assert terminated and env.success


# -- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"dim_x": 1}, "dim_x"),
    ({"dim_y": 9}, "dim_y"),
    ({"dim_x": 3.0}, "dim_x"),
    ({"box_type": 3}, "box_type"),
    ({"preset": "5x5"}, "preset"),
    ({"box_type": "2"}, "box_type"),
])
def test_bad_settings_raise_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TetrisEnv(**kwargs)


def test_overrides_lay_over_the_preset():
    env = gymnasium.make("agentrl/Tetris-v0", preset="3x3-type2", dim_x=4).unwrapped
    obs, _ = env.reset(seed=0)
    assert (env.dim_x, env.dim_y, env.box_type) == (4, 3, 2)
    assert [len(row) for row in obs.split("\n")] == [4, 4, 4]
    assert "X" in env.rules and "#" in env.rules and "_" in env.rules
