"""``critic.pretrain_steps``: the first PPO steps after the warm start update the critic only,
so the actor's first update reads values fitted to its own returns (verl's count:
tests/verl/test_launch.py)."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer


def weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def bandit_config(run_dir, *overrides: str):
    return compose_config([
        "model=tiny", "train.total_steps=3", "train.presets=[banditAgent]",
        "val.presets=[banditAgent]", "val.test_freq=0", "val.before_train=false",
        "trainer.logger=[]", "trainer.plot=false", "trainer.save_freq=0", f"run_dir={run_dir}",
        "train.group_num=2", "train.group_size=2", "rollout.max_new_tokens=4", "actor.lr=1e-2",
        "critic.lr=1e-2", "threads=1", *overrides])


def test_the_actor_waits_while_the_critic_learns(tmp_path, one_torch_thread):
    trainer = LocalTrainer(bandit_config(tmp_path, "critic.pretrain_steps=2"))
    try:
        seen = []
        for step in (1, 2, 3):
            actor, critic = weights(trainer.actor), weights(trainer.critic)
            lr = trainer.actor_sched.get_last_lr()[0]
            trainer.step = step
            metrics = trainer.train_step(step)
            seen.append((moved(actor, trainer.actor), moved(critic, trainer.critic),
                         metrics["actor/updated"]))
            if step < 3:
                assert trainer.actor_sched.get_last_lr()[0] == lr  # the schedule waits too
    finally:
        trainer.close()
    assert seen == [(False, True, 0.0), (False, True, 0.0), (True, True, 1.0)]


def test_pretrain_steps_count_after_the_warm_start(tmp_path):
    config = bandit_config(tmp_path, "train.total_steps=5", "train.sft_steps=2",
                           "critic.pretrain_steps=2")
    assert config.train.sft_steps + config.critic.pretrain_steps < config.train.total_steps


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.adv_estimator=grpo", "critic.pretrain_steps=1"], "critic.pretrain_steps=1"),
    (["train.total_steps=3", "critic.pretrain_steps=3"], "critic.pretrain_steps=3"),
    (["train.total_steps=4", "train.sft_steps=2", "critic.pretrain_steps=2"],
     "critic.pretrain_steps=2"),
])
def test_pretraining_without_a_critic_or_an_actor_update_is_refused(tmp_path, overrides, key):
    with pytest.raises(ValueError, match=key):
        bandit_config(tmp_path, *overrides)
