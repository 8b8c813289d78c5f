"""One contract over every registered game: API types, determinism, untrusted actions, limits."""

import json
import subprocess
import sys

import gymnasium
import numpy as np
import pytest

import agentrl  # noqa: F401  (registers the games)
from agentrl.envs import GAMES, env_id

SEEDS = (0, 7)
NONSENSE = ["", "   ", "x" * 100_000, "🤖 ünïcødé ⛄", "<answer>", "move move move", "\x00\n\t", None, 42]


def make(game: str, **kwargs):
    return gymnasium.make(env_id(game), **kwargs)


SEEDED_KWARGS = {"Bandit": {"preset": "4arms-seeded"}}
"""Options under which a game's episode depends on the seed: the Bandit's default (learnable)
preset pays one fixed arm, the same game on every seed."""


def play_script(game: str, seed: int, steps: int = 12) -> list:
    """A fixed, seed-determined episode: first valid action each step, as a JSON-able record."""
    env = make(game, **SEEDED_KWARGS.get(game, {}))
    obs, info = env.reset(seed=seed)
    record = [obs, env.unwrapped.valid_actions(), env.unwrapped.oracle_plan()]
    for _ in range(steps):
        actions = env.unwrapped.valid_actions()
        obs, reward, terminated, truncated, info = env.step(actions[0] if actions else "noop")
        record.append([obs, round(reward, 6), terminated, truncated, info["action_is_valid"]])
        if terminated or truncated:
            break
    env.close()
    return record


@pytest.mark.parametrize("game", GAMES)
def test_registered_and_api_types(game):
    assert env_id(game) in gymnasium.registry
    env = make(game)
    obs, info = env.reset(seed=SEEDS[0])
    assert isinstance(obs, str) and obs
    assert {"success", "action_is_valid", "action_is_effective"} <= info.keys()
    assert isinstance(env.render(), str) and env.render()
    actions = env.unwrapped.valid_actions()
    assert actions and all(isinstance(a, str) for a in actions)
    obs, reward, terminated, truncated, info = env.step(actions[0])
    assert isinstance(obs, str)
    assert isinstance(reward, float)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert info["action_is_valid"] is True
    assert isinstance(env.unwrapped.rules, str) and env.unwrapped.rules


@pytest.mark.parametrize("game", GAMES)
def test_same_seed_same_episode_in_a_new_process(game):
    here = [play_script(game, seed) for seed in SEEDS]
    code = (
        "import json, sys; sys.path.insert(0, 'tests/envs'); "
        f"from test_contract import play_script; "
        f"print(json.dumps([play_script({game!r}, s) for s in {SEEDS!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    there = json.loads(out.stdout.strip().splitlines()[-1])
    assert json.loads(json.dumps(here)) == there
    assert here[0][0] != here[1][0] or here[0][2] != here[1][2], "different seeds, same game"


@pytest.mark.parametrize("game", GAMES)
def test_nonsense_actions_are_invalid_and_never_raise(game):
    env = make(game, max_steps=1000)
    env.reset(seed=SEEDS[0])
    for action in NONSENSE:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str)
        assert info["action_is_valid"] is False, action
        assert info["action_is_effective"] is False, action
        assert not terminated


@pytest.mark.parametrize("game", GAMES)
def test_action_case_and_spacing_do_not_matter(game):
    env = make(game)
    env.reset(seed=SEEDS[0])
    action = env.unwrapped.valid_actions()[0]
    *_, info = env.step(f"  {action.upper()}  ")
    assert info["action_is_valid"] is True


@pytest.mark.parametrize("game", GAMES)
def test_truncated_after_max_steps_not_terminated(game):
    env = make(game, max_steps=3)
    env.reset(seed=SEEDS[0])
    flags = [env.step("not an action")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    # Stepping past the end is a harmless no-op.
    obs, reward, terminated, truncated, info = env.step("anything")
    assert reward == 0.0 and isinstance(obs, str)


@pytest.mark.parametrize("game", GAMES)
def test_oracle_solves_from_start(game):
    env = make(game)
    env.reset(seed=SEEDS[1])
    plan = env.unwrapped.oracle_plan()
    assert plan, "a fresh game is solvable and not already solved"
    for action in plan:
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and info["success"]


@pytest.mark.parametrize("game", GAMES)
def test_bad_options_fail_with_a_message_naming_them(game):
    with pytest.raises(ValueError, match="preset"):
        make(game, preset="no-such-preset")
    with pytest.raises(ValueError, match="max_steps"):
        make(game, max_steps=0)


def game_presets() -> list[tuple[str, str]]:
    """(game, preset) for every preset of every registered game's ``PRESETS`` table."""
    pairs = []
    for game in GAMES:
        module = sys.modules[type(make(game).unwrapped).__module__]
        pairs += [(game, preset) for preset in getattr(module, "PRESETS", {None: None})]
    return pairs


@pytest.mark.parametrize("game, preset", game_presets())
def test_no_legal_action_pays_less_than_worst_legal_reward(game, preset):
    """``worst_legal_reward`` bounds every legal step: the agent layer's format penalty is
    derived from it, so a game paying less would let a malformed reply beat acting."""
    env = make(game) if preset is None else make(game, preset=preset)
    floor = env.unwrapped.worst_legal_reward
    rng = np.random.default_rng(0)
    seeds = SEEDS if game == "TextWorld" else range(40)  # TextWorld games take ~1 s to make
    lowest = 0.0
    for seed in seeds:
        env.reset(seed=seed)
        for _ in range(60):
            legal = env.unwrapped.valid_actions()
            if not legal:
                break
            _, reward, terminated, truncated, _ = env.step(legal[rng.integers(len(legal))])
            lowest = min(lowest, reward)
            if terminated or truncated:
                break
    assert floor <= lowest, f"{game} {preset}: a legal action paid {lowest} < {floor}"
    assert floor <= 0.0
