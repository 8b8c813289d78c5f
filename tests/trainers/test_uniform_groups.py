"""``rollout.drop_uniform_groups``: a step whose groups all played alike skips its update."""

from __future__ import annotations

import torch

from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer


def run_step(tmp_path, drop: bool) -> tuple[dict[str, float], bool]:
    """One PPO step on groups of one episode (each compares nothing); whether weights moved."""
    config = compose_config([
        "model=tiny", "train.total_steps=1", "train.group_num=2", "train.group_size=1",
        "train.presets=[banditAgent]", "val.presets=[banditAgent]", "val.test_freq=0",
        "val.before_train=false", "rollout.max_new_tokens=4", "actor.lr=1e-2",
        f"rollout.drop_uniform_groups={str(drop).lower()}", "trainer.logger=[]",
        "trainer.plot=false", "trainer.save_freq=0", f"run_dir={tmp_path / str(drop)}"])
    trainer = LocalTrainer(config)
    try:
        before = [p.detach().clone() for p in trainer.actor.parameters()]
        trainer.step = 1
        metrics = trainer.train_step(1)
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.actor.parameters()))
    finally:
        trainer.close()
    return metrics, moved


def test_a_step_of_uniform_groups_skips_the_update(tmp_path, one_torch_thread):
    metrics, moved = run_step(tmp_path, drop=True)
    assert metrics["train/kept_trajectories"] == 0
    assert not moved and "actor/pg_loss" not in metrics


def test_without_the_switch_the_same_step_updates(tmp_path, one_torch_thread):
    metrics, moved = run_step(tmp_path, drop=False)
    assert metrics["train/kept_trajectories"] == 2 and moved


def test_step_advantages_reach_the_update(tmp_path, one_torch_thread):
    """With ``algorithm.step_advantage_weight`` on, the bandit's four pulls from its one board
    are compared: a share of the model tokens carries a step-level advantage."""
    config = compose_config([
        "model=tiny", "train.total_steps=1", "train.group_num=1", "train.group_size=4",
        "train.presets=[banditAgent]", "val.presets=[banditAgent]", "val.test_freq=0",
        "val.before_train=false", "rollout.max_new_tokens=16", "rollout.temperature=2.0",
        "algorithm.step_advantage_weight=1.0", "trainer.logger=[]", "trainer.plot=false",
        "trainer.save_freq=0", f"run_dir={tmp_path / 'run'}"])
    trainer = LocalTrainer(config)
    try:
        trainer.step = 1
        metrics = trainer.train_step(1)
    finally:
        trainer.close()
    assert metrics["train/banditAgent/return"] is not None
    assert 0 < metrics["actor/step_advantages_nonzero"] <= 1
