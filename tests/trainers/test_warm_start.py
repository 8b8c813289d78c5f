"""train.sft_steps: the first steps of a PPO run are SFT updates on oracle play, then PPO goes on
from the warm-started weights, in one run with one metric history."""

from __future__ import annotations

import pytest
import torch

from agentrl.agents import Agent
from agentrl.config import build_config, compose_config
from agentrl.rollout.demonstrations import demonstration_seeds
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.tracking import read_metrics
from agentrl.trainers.imitation import update_rows
from test_sft import EPISODES, replay, sft_config

SFT_STEPS = 60


def warm_start_config(tmp_path, **train_keys):
    data = sft_config(tmp_path).to_dict()
    data["train"].update(group_num=1, group_size=2, total_steps=SFT_STEPS + 1,
                         sft_steps=SFT_STEPS, **train_keys)
    data["val"].update(test_freq=1000, before_train=False)
    data["trainer"].update(logger=[], plot=False, save_freq=0)
    data["sft"].update(mini_batch_size=EPISODES, micro_batch_size=2)
    return build_config(data)


@pytest.mark.slow
def test_the_warm_start_steps_teach_the_oracle_and_ppo_follows(tmp_path, one_torch_thread):
    trainer = LocalTrainer(warm_start_config(tmp_path))
    try:
        demos = trainer.warm_start.demonstrations()
        result = trainer.fit()
        seeds = demonstration_seeds(trainer.config.sft.episodes, trainer.config.seed)
        replayed = replay(trainer.actor, trainer.tokenizer, trainer.config, seeds)
        oracle = _oracle_replies(trainer.config, seeds)
    finally:
        trainer.close()
    records = {r["step"]: r for r in read_metrics(result.metrics)}
    sft_losses = [records[s]["sft/loss"] for s in range(1, SFT_STEPS + 1)]
    assert demos["responses"].shape[0] == EPISODES
    assert sft_losses[-1] < 0.05 * sft_losses[0], sft_losses
    assert "actor/pg_loss" in records[SFT_STEPS + 1] and "sft/loss" not in records[SFT_STEPS + 1]
    assert not any(k.startswith("actor/") for k in records[SFT_STEPS])
    validated = [s for s, r in records.items() if "val/replay/success" in r]
    assert validated == [SFT_STEPS, SFT_STEPS + 1]  # the warm start's end, and the last step
    assert trainer.warm_start.optim is None  # freed before PPO
    assert replayed == oracle


def _oracle_replies(config, seeds):
    agent_config = config.playing_presets(["replay"], config.rollout.max_new_tokens)[0][1]
    replies = []
    for seed in seeds:
        with Agent(agent_config) as agent:
            agent.reset(seed=seed)
            turns = []
            for _ in range(agent_config.max_turns):
                reply = agent.oracle_response()
                turns.append(reply)
                if agent.step(reply).done:
                    break
            replies.append(turns)
    return replies


def test_each_epoch_visits_every_demonstration_once_in_a_seeded_order():
    episode_index = torch.tensor([0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 6, 7, 8, 9])  # rows: windows
    epoch = torch.cat([update_rows(episode_index, 4, seed=3, update=u) for u in range(3)])
    assert sorted(epoch.tolist()) == list(range(len(episode_index)))
    again = torch.cat([update_rows(episode_index, 4, seed=3, update=u) for u in range(3)])
    assert torch.equal(epoch, again)  # a resumed run takes the same mini-batches
    second = torch.cat([update_rows(episode_index, 4, seed=3, update=u) for u in range(3, 6)])
    assert sorted(second.tolist()) == sorted(epoch.tolist()) and not torch.equal(second, epoch)


def test_more_warm_start_steps_than_steps_is_refused(tmp_path):
    data = sft_config(tmp_path).to_dict()
    data["train"].update(total_steps=4, sft_steps=5)
    with pytest.raises(ValueError, match=r"train.sft_steps=5 .* allowed: an integer in \[0, 4\]"):
        build_config(data)


def test_verl_refuses_the_warm_start_steps(tmp_path):
    with pytest.raises(ValueError, match="train.sft_steps=1 is not allowed with backend='verl'"):
        compose_config(["backend=verl", "hardware=a100", "model=qwen_halfb", "train.sft_steps=1"])
