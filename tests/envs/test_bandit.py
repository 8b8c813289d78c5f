"""Bandit dynamics: one pull, the golden arm pays, junk is invalid, the seed picks the arm."""

from collections import Counter

import gymnasium
import pytest

from agentrl.envs import env_id  # importing agentrl.envs registers the games
from agentrl.envs.bandit import PRESETS, BanditEnv


def make(**kwargs) -> BanditEnv:
    return gymnasium.make(env_id("Bandit"), **kwargs).unwrapped


def other_arm(env: BanditEnv) -> str:
    return next(arm for arm in env.arms if arm != env.golden_arm)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_golden_arm_pays_one_and_wins(preset):
    env = make(preset=preset)
    obs, info = env.reset(seed=3)
    assert obs == f"Pick one arm: {', '.join(env.arms)}"
    assert env.oracle_plan() == [env.golden_arm] and env.valid_actions() == list(env.arms)
    obs, reward, terminated, truncated, info = env.step(env.golden_arm)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["action_is_valid"] and info["action_is_effective"]
    assert env.golden_arm in obs and env.oracle_plan() == []


def test_another_arm_pays_zero_and_ends_the_game():
    env = make(preset="4arms")
    env.reset(seed=3)
    _, reward, terminated, truncated, info = env.step(other_arm(env))
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["action_is_valid"] and not info["success"]
    assert env.oracle_plan() is None  # the one pull is spent
    # Pulling again after the end changes nothing.
    assert env.step(env.golden_arm)[1:3] == (0.0, True)
    assert not env.step(env.golden_arm)[4]["success"]


@pytest.mark.parametrize("junk", ["C", "A B", "AB", "arm A", "pick A", "<answer>A</answer>", ""])
def test_junk_is_invalid_and_does_not_end_the_game(junk):
    env = make()
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(junk)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert not info["action_is_valid"] and not info["action_is_effective"]
    assert env.oracle_plan() == [env.golden_arm]
    assert env.step(env.golden_arm)[1] == 1.0  # the pull is still there


def test_seed_picks_the_golden_arm_reproducibly_and_uniformly():
    env = make(preset="4arms-seeded")
    draws = []
    for seed in range(400):
        env.reset(seed=seed)
        draws.append(env.golden_arm)
        env.reset(seed=seed)
        assert env.golden_arm == draws[-1]
    counts = Counter(draws)
    assert set(counts) == set(env.arms)
    assert all(60 <= count <= 140 for count in counts.values()), counts  # 100 expected each


@pytest.mark.parametrize("preset", ["2arms", "4arms"])
def test_learnable_presets_pay_one_arm_on_every_seed(preset):
    """A sanity check must be learnable: the same arm pays whatever the seed."""
    env = make(preset=preset)
    golden = set()
    for seed in range(50):
        env.reset(seed=seed)
        golden.add(env.golden_arm)
    assert golden == {env.arms[-1]}


def test_a_fixed_golden_arm_ignores_the_seed():
    env = make(arms=["left", "right"], golden_arm="RIGHT")
    for seed in range(20):
        env.reset(seed=seed)
        assert env.golden_arm == "right" and env.oracle_plan() == ["right"]


def test_arms_with_odd_text_match_by_case_and_spacing():
    arms = ("the", " of", "New  York", ",", "é!", "a|b")
    env = make(arms=arms, golden_arm="new york")
    obs, _ = env.reset(seed=0)
    for arm in arms:
        assert arm in obs
    assert env.golden_arm == "New  York"
    assert env.step("  NEW york ")[1] == 1.0
    env.reset(seed=0)
    assert env.step("of")[4]["action_is_valid"]
    env.reset(seed=0)
    *_, info = env.step(",")
    assert info["action_is_valid"] and not info["success"]


@pytest.mark.parametrize("kwargs, words", [
    ({"arms": ["A"]}, ["len(arms)", "[2, 200]"]),
    ({"arms": "AB"}, ["arms must be", "distinct non-empty strings"]),
    ({"arms": ["A", "a"]}, ["['a']", "more than one arm"]),
    ({"arms": ["A", " "]}, ["bad arm ' '"]),
    ({"arms": ["A", 3]}, ["bad arm 3"]),
    ({"arms": ["A", "x" * 300]}, ["bad arm", "256 characters"]),
    ({"golden_arm": "C"}, ["golden_arm", "['A', 'B']", "'C'"]),
    ({"golden_arm": 1}, ["golden_arm", "['A', 'B']"]),
])
def test_bad_options_name_the_key_and_allowed_values(kwargs, words):
    with pytest.raises(ValueError) as error:
        make(**kwargs)
    assert all(word in str(error.value) for word in words), str(error.value)
