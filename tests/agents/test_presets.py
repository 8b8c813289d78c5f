"""Every preset of configs/agents.yaml, data-driven (a preset added there is covered at once):

- breaking the format never pays better than legal play (issue 10, item 6);
- the action and turn budgets let the oracle win every validation seed (item 11).

Seeds: the first 200 of the held-out ``val`` range, the ones docs/ENVS.md's table and
validation use; TextWorld presets play the first 3 (each game takes ~1 s to generate).
"""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.agents import Agent, format_response, load_agent_presets, parse_response
from agentrl.envs.splits import split_seeds

PRESETS = load_agent_presets(check_envs=False)
SEEDS = 200
TEXTWORLD_SEEDS = 3
MALFORMED = ("I think I should move.", "<answer>", "")
"""Replies that break every answer format (checked per preset below)."""


def val_seeds(name: str) -> list[int]:
    return split_seeds("val", TEXTWORLD_SEEDS if PRESETS[name].game == "TextWorld" else SEEDS)


def play(agent: Agent, seed: int, reply) -> list[float]:
    """One episode from ``reset(seed)``; ``reply()`` gives each turn's text. Turn rewards."""
    agent.reset(seed=seed)
    rewards = []
    while not agent.done:
        rewards.append(agent.step(reply()).reward)
    return rewards


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_breaking_the_format_never_pays_better_than_random_legal_play(name):
    """Per preset, strictly: (turn) every malformed reply's reward < every turn reward of random
    legal play; (episode) the return of an all-malformed episode < the smallest return of a
    random-legal episode over the seeds. Malformed replies run no env step, so their return
    does not depend on the seed: a few seeds show it."""
    config = PRESETS[name]
    with Agent(config) as agent:
        for text in MALFORMED:
            parsed = parse_response(text, enable_think=config.enable_think,
                                    separator=config.action_separator,
                                    max_actions=config.max_actions_per_turn,
                                    answer_format=config.answer_format)
            assert not parsed.format_ok, (name, text)
        malformed = [play(agent, seed, lambda t=text: t)
                     for seed in val_seeds(name)[:3] for text in MALFORMED]
        legal = []
        for seed in val_seeds(name):
            rng = np.random.default_rng(seed)
            legal.append(play(agent, seed, lambda: agent.random_response(rng)))
    worst_legal_turn = min(r for episode in legal for r in episode)
    worst_legal_return = min(sum(episode) for episode in legal)
    assert max(r for episode in malformed for r in episode) < worst_legal_turn, name
    assert max(sum(episode) for episode in malformed) < worst_legal_return, (
        f"{name}: all-malformed episodes return {max(map(sum, malformed)):+.2f}, random legal "
        f"play at worst {worst_legal_return:+.2f}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_oracle_wins_every_validation_seed_within_the_budgets(name):
    """The oracle plays through the Agent, so turn and action budgets apply: a budget shorter
    than a seed's solution would make that seed unwinnable for any policy."""
    with Agent(PRESETS[name]) as agent:
        lost = []
        for seed in val_seeds(name):
            play(agent, seed, agent.oracle_response)
            if not agent.success:
                agent.reset(seed=seed)
                lost.append((seed, len(agent.env.unwrapped.oracle_plan() or [])))
    config = PRESETS[name]
    assert not lost, (f"{name}: the oracle loses (seed, plan length) {lost} with "
                      f"max_actions_all_turns={config.max_actions_all_turns}, max_turns="
                      f"{config.max_turns}, max_actions_per_turn={config.max_actions_per_turn}")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_malformed_reply_never_pays_better_than_a_well_formed_one(name):
    """``format_penalty: auto`` sits below a well-formed reply of the most actions a turn
    allows, each text the game cannot parse (BlocksWorld: -5 an action), so dropping the
    tags never pays better than writing them (issue 22, defect 5)."""
    config = PRESETS[name]
    reply = format_response(["xyzzy"] * config.max_actions_per_turn,
                            separator=config.action_separator,
                            think="" if config.enable_think else None,
                            answer_format=config.answer_format)
    with Agent(config) as agent:
        agent.reset(seed=val_seeds(name)[0])
        result = agent.step(reply)
        assert result.format_ok and result.num_valid_actions == 0, (name, reply)
        assert agent.format_penalty < result.reward, (name, agent.format_penalty, result.reward)
