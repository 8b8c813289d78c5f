"""TextWorldExpress: folds mapped onto our splits, admissible commands, the oracle, Java errors."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the games)
from agentrl.agents import Agent, load_agent_presets
from agentrl.envs.splits import split_seeds
from agentrl.envs.textworld_express import PRESETS

PRESET_AGENTS = {config.env_kwargs["preset"]: name for name, config in
                 load_agent_presets(check_envs=False).items()
                 if config.game == "TextWorldExpress"}


def make(**kwargs):
    return gymnasium.make("agentrl/TextWorldExpress-v0", **kwargs)


@pytest.mark.parametrize("split, fold_start", [("train", 0), ("val", 10_000), ("test", 20_000)])
def test_each_split_plays_its_own_fold(split, fold_start):
    """The package's folds: train seeds 0-999, dev 10000-10999, test 20000-20999; a seed's
    offset picks its fold's game unless the game is redrawn into the seed's split."""
    env = make(preset="cooking")
    for offset, seed in enumerate(split_seeds(split, 6, offset=997)):
        env.reset(seed=seed)
        assert fold_start <= env.unwrapped.game_seed < fold_start + 1000
        if env.unwrapped.instance_draw == 0:
            assert env.unwrapped.game_seed == fold_start + (997 + offset) % 1000
    env.close()


def test_a_seed_outside_the_splits_plays_the_train_fold():
    env = make(preset="coin")
    env.reset(seed=913_350_807)
    assert env.unwrapped.game_seed == 807
    env.close()


def test_observation_admissible_commands_and_score():
    env = make(preset="twc")
    obs, _ = env.reset(seed=split_seeds("val", 1)[0])
    assert obs.startswith("Task: ") and "Admissible commands: " in obs
    actions = env.unwrapped.valid_actions()
    assert actions == sorted(actions) and "look around" in actions
    assert obs.endswith(", ".join(actions))
    _, reward, _, _, info = env.step("look around")
    assert reward == 0.0 and info["action_is_valid"] and not info["action_is_effective"]
    total = 0.0
    for action in env.unwrapped.oracle_plan():
        obs, reward, terminated, _, info = env.step(action)
        total += reward
    assert terminated and info["success"] and total == pytest.approx(1.0)
    assert env.unwrapped.score == pytest.approx(1.0) and env.unwrapped.valid_actions() == []


def test_leaving_the_gold_path_ends_the_oracle_and_coin_replans():
    env = make(preset="cooking")
    env.reset(seed=0)
    plan = env.unwrapped.oracle_plan()
    off_path = next(a for a in env.unwrapped.valid_actions() if a != plan[0])
    env.step(off_path)
    assert env.unwrapped.oracle_plan() is None
    coin = make(preset="coin-hard")
    coin.reset(seed=3)
    first = coin.unwrapped.oracle_plan()
    coin.step("inventory")  # a detour: the search starts again from here
    assert coin.unwrapped.oracle_plan() == first


def test_bad_params_are_named():
    with pytest.raises(ValueError, match="params must be key=integer pairs"):
        make(preset="coin", params="numLocations=banana")
    for params, message in (("numLocations=50", "less than or equal to 11"),
                            ("colour=1", "Unrecognized property name")):
        env = make(preset="coin", params=params)  # the package checks values at the first reset
        with pytest.raises(ValueError, match=f"params='{params}'.*{message}"):
            env.reset(seed=0)
    with pytest.raises(ValueError, match="game_name"):
        make(game_name="zork")


def test_a_missing_java_runtime_is_named():
    code = ("import gymnasium, agentrl; "
            "gymnasium.make('agentrl/TextWorldExpress-v0').reset(seed=0)")
    environ = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    environ["PATH"] = os.path.dirname(sys.executable)  # python, but no java
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environ)
    assert result.returncode != 0
    assert "needs a Java runtime" in result.stderr and "default-jre-headless" in result.stderr


def test_every_preset_has_an_agent_preset():
    assert set(PRESET_AGENTS) == set(PRESETS)


ORACLE_SEEDS = 50


@pytest.mark.slow
@pytest.mark.parametrize("preset", list(PRESETS))
def test_oracle_solves_held_out_games_within_the_agents_budget(preset):
    name = PRESET_AGENTS[preset]
    with Agent(load_agent_presets(check_envs=False)[name]) as agent:
        wins = 0
        for seed in split_seeds("val", ORACLE_SEEDS):
            agent.reset(seed=seed)
            while not agent.done:
                agent.step(agent.oracle_response())
            wins += agent.success
    assert wins >= 0.95 * ORACLE_SEEDS, f"{name}: {wins}/{ORACLE_SEEDS}"
