"""algorithm.gamma_unit=turn on verl: reshaped turn rewards make verl's own token GAE (gamma =
lam = 1) give the local engine's per-turn discounted returns."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from agentrl.agents import load_agent_presets
from agentrl.config import compose_config
from agentrl.rollout import to_batch
from agentrl.rollout.batch import discounted_turn_rewards, token_rewards
from agentrl.rollout.records import Trajectory
from agentrl.trainers import ppo
from agentrl.verl.agent_loop import EpisodeTask
from agentrl.verl.data import _episode_settings
from agentrl.verl.overrides import _algorithm


def episode(rng: random.Random, turns: int) -> Trajectory:
    """Replies of 1-6 model tokens, each followed by a 2-token observation (but the last)."""
    ids, mask, ends = [], [], []
    for k in range(turns):
        reply = rng.randint(1, 6)
        ids += [20] * reply
        mask += [1] * reply
        ends.append(len(ids) - 1)
        if k < turns - 1:
            ids += [30, 31]
            mask += [0, 0]
    rewards = [round(rng.uniform(-1, 2), 2) for _ in range(turns)]
    return Trajectory(preset="p", seed=0, group_index=0, prompt_ids=[11, 12], response_ids=ids,
                      response_mask=mask, response_logprobs=[0.0] * len(ids),
                      turn_end_positions=ends, turn_rewards=rewards, success=False,
                      episode_return=sum(rewards), num_turns=turns)


def test_discounted_turn_rewards_sum_to_the_discounted_returns():
    rewards = [1.0, 0.0, -0.5, 2.0]
    reshaped = discounted_turn_rewards(rewards, 0.9)
    for k in range(len(rewards)):
        discounted = sum(0.9 ** (j - k) * rewards[j] for j in range(k, len(rewards)))
        assert sum(reshaped[k:]) == pytest.approx(discounted)
    assert discounted_turn_rewards(rewards, 1.0) == pytest.approx(rewards)


@pytest.mark.parametrize("placement", ["turn", "last"])
def test_verls_token_gae_on_reshaped_rewards_gives_the_per_turn_returns(placement):
    from verl.trainer.ppo import core_algos

    rng = random.Random(0)
    trajectories = [episode(rng, turns) for turns in (1, 2, 3, 5)]
    batch = to_batch(trajectories, pad_token_id=0, reward_placement=placement)
    mask = batch["response_mask"].float()
    values = torch.rand(mask.shape)
    _, local = ppo.compute_advantages("gae", batch["token_level_rewards"], mask, values=values,
                                      gamma=0.9, lam=1.0, gamma_unit="turn",
                                      episode_index=batch["episode_index"])
    reshaped = torch.zeros_like(mask)
    for row, trajectory in enumerate(trajectories):
        rewards = token_rewards(trajectory, placement, turn_gamma=0.9)
        reshaped[row, :len(rewards)] = torch.tensor(rewards)
    _, on_verl = core_algos.compute_gae_advantage_return(
        token_level_rewards=reshaped, values=values, response_mask=mask, gamma=1.0, lam=1.0)
    assert torch.allclose(on_verl[mask == 1], local[mask == 1], atol=1e-5)
    # per-token discounting is not that: gamma 0.9 per token discounts a reply's length too
    _, per_token = core_algos.compute_gae_advantage_return(
        token_level_rewards=batch["token_level_rewards"], values=values, response_mask=mask,
        gamma=0.9, lam=1.0)
    assert not torch.allclose(per_token[mask == 1], local[mask == 1], atol=1e-3)


def test_a_turn_discount_reaches_verl_through_the_task_rows_and_gamma_one():
    config = compose_config(["hardware=a100", "model=qwen_halfb", "algorithm.gamma_unit=turn",
                             "algorithm.gamma=0.9"])
    assert _episode_settings(config)["turn_gamma"] == 0.9
    assert _algorithm(config)["algorithm.gamma"] == 1.0
    token = compose_config(["hardware=a100", "model=qwen_halfb", "algorithm.gamma=0.9"])
    assert _episode_settings(token)["turn_gamma"] == 1.0
    assert _algorithm(token)["algorithm.gamma"] == 0.9


def test_validation_rows_are_undiscounted_so_verls_val_reward_is_the_return():
    """verl's val-core reward is the sum of a row's rewards: with the turn discount folded into
    them it would be the discounted G0, not the return the local engine reports."""
    from agentrl.verl.data import train_tasks, val_tasks

    config = compose_config(["hardware=a100", "model=qwen_halfb", "algorithm.gamma_unit=turn",
                             "algorithm.gamma=0.9", "train.total_steps=1", "actor.ppo_mini_batch_size=16",
                             "train.presets=[banditAgent]", "val.presets=[banditAgent]",
                             "val.group_num=1"])
    assert {row["extra_info"]["turn_gamma"] for row in train_tasks(config)} == {0.9}
    assert {row["extra_info"]["turn_gamma"] for row in val_tasks(config)} == {1.0}


@pytest.mark.parametrize("bad", [1.5, -0.1, "0.9", True])
def test_a_bad_turn_gamma_in_a_task_row_is_named(bad):
    assert EpisodeTask.from_extra_info(_row_info()).turn_gamma == 1.0  # optional: default 1
    assert EpisodeTask.from_extra_info({**_row_info(), "turn_gamma": 0.9}).turn_gamma == 0.9
    with pytest.raises(ValueError, match="extra_info.turn_gamma"):
        EpisodeTask.from_extra_info({**_row_info(), "turn_gamma": bad})


def _row_info() -> dict:
    config = load_agent_presets()["simpleSokobanAgent"]
    return {"preset": "simpleSokobanAgent", "seed": 3, "max_context_tokens": 4096,
            "reward_placement": "turn",
            "agent_config": json.dumps(dataclasses.asdict(config), sort_keys=True)}
