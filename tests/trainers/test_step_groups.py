"""What one PPO step compares: ``rollout.drop_uniform_groups`` (a step whose groups all played
alike skips its update), GiGPO's step-level advantages and ``rollout.turn_branches`` (each
turn's sampled replies as a group of their own)."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer

BLOCKS = "tightBlocksworldTurnsAgent"


def one_step(run_dir, preset: str, *overrides: str) -> tuple[dict[str, float], bool]:
    """One PPO step of the tiny model on ``preset``: its metrics, and whether weights moved."""
    config = compose_config([
        "model=tiny", "train.total_steps=1", f"train.presets=[{preset}]",
        f"val.presets=[{preset}]", "val.test_freq=0", "val.before_train=false",
        "trainer.logger=[]", "trainer.plot=false", "trainer.save_freq=0", f"run_dir={run_dir}",
        *overrides])
    trainer = LocalTrainer(config)
    try:
        before = [p.detach().clone() for p in trainer.actor.parameters()]
        trainer.step = 1
        metrics = trainer.train_step(1)
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.actor.parameters()))
    finally:
        trainer.close()
    return metrics, moved


def run_step(tmp_path, drop: bool, outcome: str = "any") -> tuple[dict[str, float], bool]:
    """One PPO step on groups of one episode (each compares nothing)."""
    return one_step(tmp_path / f"{drop}-{outcome}", "banditAgent", "train.group_num=2",
                    "train.group_size=1", "rollout.max_new_tokens=4", "actor.lr=1e-2",
                    f"rollout.drop_uniform_groups={str(drop).lower()}",
                    f"rollout.drop_uniform_outcome={outcome}")


def test_a_step_of_uniform_groups_skips_the_update(tmp_path, one_torch_thread):
    metrics, moved = run_step(tmp_path, drop=True)
    assert metrics["train/kept_trajectories"] == 0
    assert metrics["train/uniform_groups"] == 1.0  # a group of one compares nothing
    # groups of one: the share that all won is the share of episodes won
    assert metrics["train/uniform_groups_won"] == metrics["train/banditAgent/success"]
    assert not moved and "actor/pg_loss" not in metrics


def test_dropping_only_the_won_groups_keeps_the_lost(tmp_path, one_torch_thread):
    metrics, _ = run_step(tmp_path, drop=True, outcome="won")
    lost = 2 * (1 - metrics["train/uniform_groups_won"])  # groups of one: each lost or won
    assert metrics["train/kept_trajectories"] == lost


def test_without_the_switch_the_same_step_updates(tmp_path, one_torch_thread):
    metrics, moved = run_step(tmp_path, drop=False)
    assert metrics["train/kept_trajectories"] == 2 and moved
    assert metrics["train/uniform_groups"] == 1.0  # reported whether or not they are dropped


def test_step_advantages_reach_the_update(tmp_path, one_torch_thread):
    """With ``algorithm.step_advantage_weight`` on, the bandit's four pulls from its one board
    are compared: a share of the model tokens carries a step-level advantage."""
    metrics, _ = one_step(tmp_path / "run", "banditAgent", "train.group_num=1",
                          "train.group_size=4", "rollout.max_new_tokens=16",
                          "rollout.temperature=2.0", "algorithm.step_advantage_weight=1.0")
    assert metrics["train/banditAgent/return"] is not None
    assert 0 < metrics["actor/step_advantages_nonzero"] <= 1


def test_a_step_trains_one_row_per_sampled_reply(tmp_path, one_torch_thread):
    """``rollout.turn_branches``: one episode, two more replies at each of its turns: 3 one-turn
    rows a turn reach the update, compared within their turn (GRPO over reward + the oracle's
    progress)."""
    metrics, _ = one_step(tmp_path / "run", BLOCKS, "train.group_num=1", "train.group_size=1",
                          "rollout.turn_branches=2", "rollout.temperature=2.0",
                          "algorithm.adv_estimator=grpo", "algorithm.distance_shaping=1.0")
    turns = metrics[f"train/{BLOCKS}/turns"]
    assert turns >= 1 and metrics["branch/turns"] == turns
    assert metrics["train/training_samples"] == 3 * turns
    assert 1 <= metrics["branch/distinct_replies"] <= 3 and 0 <= metrics["branch/spread"] <= 1


def test_turn_branches_are_refused_on_verl():
    with pytest.raises(ValueError, match="rollout.turn_branches=2 is not allowed with backend"):
        compose_config(["hardware=a100", "model=qwen_halfb", "rollout.turn_branches=2"])
