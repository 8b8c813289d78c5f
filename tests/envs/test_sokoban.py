"""Sokoban: hand-checked dynamics, the generator (gym-sokoban's, depth plumbed), the BFS oracle."""

from __future__ import annotations

import random
import subprocess
import sys

import gymnasium
import numpy as np
import pytest

import agentrl  # noqa: F401  (registers the games)
from agentrl.envs import sokoban
from agentrl.envs.sokoban import PRESETS, SokobanEnv

ORACLE_SEEDS = range(50)


def board(*rows: str) -> str:
    return "\n".join(rows)


def play(env: SokobanEnv, action):
    obs, reward, terminated, truncated, info = env.step(action)
    return obs, reward, terminated, info


# -- golden dynamics -----------------------------------------------------------------------------
def test_push_then_push_onto_target_finishes_with_10_9():
    env = SokobanEnv.from_board(board("######", "#PX_O#", "######"))
    obs, reward, terminated, info = play(env, "Right")
    assert obs == board("######", "#_PXO#", "######")
    assert reward == pytest.approx(-0.1)
    assert not terminated and info["action_is_valid"] and info["action_is_effective"]
    obs, reward, terminated, info = play(env, "Right")
    assert obs == board("######", "#__P√#", "######")
    assert reward == pytest.approx(10.9)  # -0.1 step, +1 box on target, +10 all boxes on targets
    assert terminated and info["success"]


def test_push_onto_target_without_finishing_is_plus_one():
    env = SokobanEnv.from_board(board("#######", "#PX_O_#", "#X___O#", "#######"))
    play(env, "Right")
    obs, reward, terminated, info = play(env, "Right")
    assert obs == board("#######", "#__P√_#", "#X___O#", "#######")
    assert reward == pytest.approx(0.9)
    assert not terminated and not info["success"]


def test_push_off_target_then_box_against_box():
    env = SokobanEnv.from_board(board("#######", "#P√_XO#", "#######"))
    obs, reward, terminated, info = play(env, "Right")
    assert obs == board("#######", "#_SXXO#", "#######")  # player on the vacated target
    assert reward == pytest.approx(-1.1)
    assert info["action_is_effective"] and not terminated
    obs, reward, terminated, info = play(env, "Right")  # two boxes in a row do not move
    assert obs == board("#######", "#_SXXO#", "#######")
    assert reward == pytest.approx(-0.1)
    assert info["action_is_valid"] and not info["action_is_effective"]


def test_push_into_wall_and_walk_into_wall_are_valid_no_moves():
    start = board("#####", "#PX##", "#O__#", "#####")
    env = SokobanEnv.from_board(start)
    for action in ("Right", "Up", "Left"):
        obs, reward, terminated, info = play(env, action)
        assert obs == start
        assert reward == pytest.approx(-0.1)
        assert info["action_is_valid"] and not info["action_is_effective"] and not terminated


def test_player_walks_over_target():
    env = SokobanEnv.from_board(board("######", "#P_O_#", "#X___#", "#____#", "######"))
    play(env, "Right")
    obs, reward, _, _ = play(env, "Right")
    assert obs.splitlines()[1] == "#__S_#"
    assert reward == pytest.approx(-0.1)
    obs, _, _, _ = play(env, "Right")
    assert obs.splitlines()[1] == "#__OP#"


def test_push_down_and_up():
    env = SokobanEnv.from_board(board("#####", "#_P_#", "#_X_#", "#_O_#", "#####"))
    obs, reward, terminated, _ = play(env, "down")
    assert obs == board("#####", "#___#", "#_P_#", "#_√_#", "#####")
    assert reward == pytest.approx(10.9) and terminated


def test_reset_returns_to_the_board_and_counts_existing_boxes_on_targets():
    start = board("######", "#P√XO#", "######")
    env = SokobanEnv.from_board(start)
    play(env, "Down")
    obs, info = env.reset()
    assert obs == start and info["num_steps"] == 0
    # A box already on a target at the start earns nothing until it moves (no spurious +1).
    _, reward, _, _ = play(env, "Up")
    assert reward == pytest.approx(-0.1)


@pytest.mark.parametrize("text", [
    "", "#", board("####", "#PX#", "####"), board("#####", "#PXO#", "####"),
    board("######", "#PPXO#", "######"), board("#####", "#PXOZ", "#####"),
])
def test_malformed_boards_are_rejected(text):
    with pytest.raises(ValueError, match="Sokoban board"):
        SokobanEnv.from_board(text)


# -- untrusted action text -----------------------------------------------------------------------
@pytest.mark.parametrize("action", [
    "", "   ", "x" * 10_000, "上", "√", "up up", "upp", "push up", "1", None, 3, ["Up"], "\x00",
])
def test_invalid_action_is_a_no_op_costing_a_step(action):
    start = board("#####", "#_P_#", "#_X_#", "#_O_#", "#####")
    env = SokobanEnv.from_board(start)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == start
    assert reward == pytest.approx(-0.1)
    assert not terminated and not truncated
    assert not info["action_is_valid"] and not info["action_is_effective"]
    assert info["num_steps"] == 1


@pytest.mark.parametrize("action", ["UP", " up ", "Up", "uP\n"])
def test_action_matching_ignores_case_and_spacing(action):
    env = SokobanEnv.from_board(board("#####", "#_O_#", "#_X_#", "#_P_#", "#####"))
    _, reward, terminated, _, info = env.step(action)
    assert info["action_is_valid"] and terminated and reward == pytest.approx(10.9)


def test_truncation_after_max_steps_is_not_termination():
    env = SokobanEnv.from_board(board("######", "#PX_O#", "######"), max_steps=2)
    assert env.step("Left")[2:4] == (False, False)
    _, _, terminated, truncated, info = env.step("Left")
    assert truncated and not terminated and not info["success"]


# -- the oracle ----------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_oracle_solves_every_preset(preset):
    env = SokobanEnv(preset=preset)
    for seed in ORACLE_SEEDS:
        env.reset(seed=seed)
        plan = env.oracle_plan()
        assert plan, f"{preset} seed {seed}: no plan (or a room that starts solved)"
        for action in plan:
            _, _, terminated, truncated, info = env.step(action)
        assert terminated and info["success"] and not truncated, f"{preset} seed {seed}"


def test_oracle_is_shortest_and_replans_from_the_current_state():
    env = SokobanEnv.from_board(board("#######", "#P_X_O#", "#_____#", "#######"))
    assert env.oracle_plan() == ["Right", "Right", "Right"]
    env.step("Down")
    plan = env.oracle_plan()
    assert len(plan) == 4 and plan[-2:] == ["Right", "Right"]
    for action in plan:
        _, _, terminated, _, _ = env.step(action)
    assert terminated


def test_oracle_needs_to_walk_around_a_box():
    env = SokobanEnv.from_board(board("######", "#O__P#", "#_X__#", "#____#", "######"))
    plan = env.oracle_plan()
    assert plan == ["Down", "Left", "Left", "Down", "Left", "Up"]
    for action in plan:
        _, _, terminated, _, _ = env.step(action)
    assert terminated


def test_oracle_on_solved_and_unsolvable_rooms():
    assert SokobanEnv.from_board(board("#####", "#P√_#", "#####")).oracle_plan() == []
    stuck = SokobanEnv.from_board(board("#####", "#X_P#", "#__O#", "#####"))
    assert stuck.oracle_plan() is None


# -- generation ----------------------------------------------------------------------------------
def test_generated_rooms_follow_the_preset():
    env = SokobanEnv(preset="8x8-2boxes")
    boards = set()
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        rows = obs.splitlines()
        assert len(rows) == 8 and all(len(row) == 8 for row in rows)
        assert rows[0] == rows[-1] == "#" * 8  # gym-sokoban walls the border
        assert obs.count("X") == 2 and obs.count("O") == 2 and obs.count("P") == 1
        assert not info["success"] and set(obs) <= set("#_OXP\n")
        boards.add(obs)
    assert len(boards) >= 18


def test_same_seed_same_room_and_globals_untouched():
    random.seed(123)
    np.random.seed(123)
    expected = (random.random(), np.random.random())
    random.seed(123)
    np.random.seed(123)
    first = SokobanEnv().reset(seed=7)[0]
    assert (random.random(), np.random.random()) == expected
    assert SokobanEnv().reset(seed=7)[0] == first
    env = SokobanEnv()
    env.reset(seed=8)
    assert env.reset(seed=7)[0] == first


def test_same_seed_same_room_in_a_new_process():
    code = ("from agentrl.envs.sokoban import SokobanEnv; "
            "print(SokobanEnv(preset='8x8-2boxes').reset(seed=11)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.rstrip("\n") == SokobanEnv(preset="8x8-2boxes").reset(seed=11)[0]


def test_composed_generator_matches_gym_sokoban_at_its_own_depth():
    """With the library's hard-coded depth (300) our composition is its generate_room exactly."""
    lib = sokoban.room_utils()
    for seed in range(15):
        with sokoban.seeded_global_rngs(seed):
            try:
                expected = lib.generate_room(dim=(6, 6), num_steps=20, num_boxes=1, tries=1)
            except RuntimeWarning:
                expected = None
        try:
            structure, state = sokoban.generate_room(seed, (6, 6), 1, 300, 20)
        except RuntimeWarning:
            assert expected is None
            continue
        state[state == 3] = 4  # generate_room's final relabelling of boxes
        assert np.array_equal(structure, expected[0]) and np.array_equal(state, expected[1])


@pytest.fixture
def fresh_rooms():
    """Generator tests patch the library calls: start and end with an empty room memo."""
    sokoban.generated_room.cache_clear()
    yield
    sokoban.generated_room.cache_clear()


def test_a_group_generates_its_room_once(monkeypatch, fresh_rooms):
    calls = []
    real = sokoban.generate_room
    monkeypatch.setattr(sokoban, "generate_room", lambda *args: calls.append(args) or real(*args))
    members = [SokobanEnv(preset="8x8").reset(seed=11)[0]]
    first = len(calls)  # one room per draw (a reset may redraw into its seed's split)
    members += [SokobanEnv(preset="8x8").reset(seed=11)[0] for _ in range(3)]
    assert len(set(members)) == 1 and len(calls) == first
    SokobanEnv(preset="8x8").reset(seed=12)
    assert len(calls) > first


def test_search_depth_reaches_the_generator(monkeypatch, fresh_rooms):
    depths = []
    real = sokoban.reverse_play
    monkeypatch.setattr(sokoban, "reverse_play",
                        lambda lib, state, structure, depth: depths.append(depth)
                        or real(lib, state, structure, depth))
    SokobanEnv(preset="8x8").reset(seed=0)
    SokobanEnv(search_depth=42).reset(seed=0)
    assert depths[0] == 30 and depths[-1] == 42


def test_rejected_rooms_are_redrawn_deterministically(monkeypatch, fresh_rooms):
    real = sokoban.generate_room

    def reset_with_two_rejections(seed: int) -> tuple[str, list[int]]:
        calls = []

        def flaky(child_seed, *args):
            calls.append(child_seed)
            if len(calls) == 1:
                raise ValueError("anything the library raises")
            if len(calls) == 2:
                raise RuntimeWarning("Generated Model with score == 0")
            return real(child_seed, *args)

        monkeypatch.setattr(sokoban, "generate_room", flaky)
        sokoban.generated_room.cache_clear()
        return SokobanEnv().reset(seed=seed)[0], calls

    first, first_calls = reset_with_two_rejections(5)
    second, second_calls = reset_with_two_rejections(5)
    assert first == second and first_calls == second_calls
    assert len(first_calls) >= 3 and len(set(first_calls)) == len(first_calls)


def test_generator_that_always_fails_gives_a_clear_error(monkeypatch, fresh_rooms):
    def broken(*args):
        raise RuntimeWarning("Generated Model with score == 0")

    monkeypatch.setattr(sokoban, "generate_room", broken)
    with pytest.raises(RuntimeError, match="rejected 50 rooms.*score == 0"):
        SokobanEnv().reset(seed=0)


# -- settings ------------------------------------------------------------------------------------
def test_gymnasium_make_and_overrides():
    env = gymnasium.make("agentrl/Sokoban-v0", preset="8x8", num_boxes=2, max_steps=7)
    obs, _ = env.reset(seed=0)
    assert env.unwrapped.dim_room == (8, 8) and env.unwrapped.num_boxes == 2
    assert env.unwrapped.max_steps == 7 and obs.count("X") == 2
    assert SokobanEnv().num_gen_steps == int(1.7 * 12)  # gym-sokoban's default walk length
    assert SokobanEnv(dim_room=[7, 9]).reset(seed=1)[0].count("\n") == 6


@pytest.mark.parametrize("kwargs, key", [
    ({"preset": "10x10"}, "preset"), ({"dim_room": (3, 6)}, "dim_room"),
    ({"dim_room": 6}, "dim_room"), ({"dim_room": "66"}, "dim_room"),
    ({"dim_room": (6, 6, 6)}, "dim_room"), ({"dim_room": (6.5, 6)}, "dim_room"),
    ({"num_boxes": 0}, "num_boxes"), ({"num_boxes": 16}, "num_boxes"),
    ({"num_boxes": True}, "num_boxes"), ({"search_depth": 2}, "search_depth"),
    ({"search_depth": 10_000}, "search_depth"), ({"num_gen_steps": 0}, "num_gen_steps"),
    ({"max_steps": 0}, "max_steps"), ({"render_mode": "human"}, "render_mode"),
])
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        SokobanEnv(**kwargs)


def test_unknown_option_is_rejected():
    with pytest.raises(TypeError, match="boxes"):
        gymnasium.make("agentrl/Sokoban-v0", boxes=2)


def test_rules_and_actions():
    env = SokobanEnv()
    assert env.valid_actions() == ["Up", "Down", "Left", "Right"]
    for word in ("Up", "Down", "Left", "Right", "#", "_", "O", "X", "√", "P", "S"):
        assert word in env.rules
