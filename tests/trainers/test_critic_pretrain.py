"""``critic.pretrain_steps``: the first PPO steps after the warm start update the critic only,
so the actor's first update reads values fitted to its own returns (verl's count:
tests/verl/test_launch.py)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.ppo_update import explained_variance
from agentrl.trainers.timing import StageTimer
from update_fixtures import GRADIENT_CRITIC, tiny_trainer, two_turn_batch


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
        "critic.lr=1e-2", "threads=1",
        "rollout.drop_uniform_groups=false",  # every step updates, whatever the games' outcomes
        *GRADIENT_CRITIC, *overrides])


@pytest.mark.parametrize("epochs", [1, 2])  # 2: old log-probs from a pass of their own
def test_the_actor_waits_while_the_critic_learns(tmp_path, one_torch_thread, epochs):
    trainer = LocalTrainer(bandit_config(tmp_path, "critic.pretrain_steps=2",
                                         f"actor.ppo_epochs={epochs}"))
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
    """5 steps, 2 of them the warm start's: at most 2 critic-only steps leave an actor update."""
    config = bandit_config(tmp_path, "train.total_steps=5", "train.sft_steps=2",
                           "critic.pretrain_steps=2")
    assert config.critic.pretrain_steps == 2
    with pytest.raises(ValueError, match=r"allowed: an integer in \[0, 2\]"):
        bandit_config(tmp_path, "train.total_steps=5", "train.sft_steps=2",
                      "critic.pretrain_steps=3")


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.adv_estimator=grpo", "critic.pretrain_steps=1"], "critic.pretrain_steps=1"),
    (["train.total_steps=3", "critic.pretrain_steps=3"], "critic.pretrain_steps=3"),
    (["train.total_steps=4", "train.sft_steps=2", "critic.pretrain_steps=2"],
     "critic.pretrain_steps=2"),
])
def test_pretraining_without_a_critic_or_an_actor_update_is_refused(tmp_path, overrides, key):
    with pytest.raises(ValueError, match=key):
        bandit_config(tmp_path, *overrides)


def test_explained_variance_tells_a_fitted_critic_from_a_blind_one():
    returns = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    assert explained_variance(returns, returns.clone(), mask) == pytest.approx(1.0, abs=1e-5)
    assert explained_variance(returns, torch.zeros_like(returns) + 0.3, mask) == \
        pytest.approx(0.0, abs=1e-5)  # a constant: no better than the mean
    assert explained_variance(returns, -returns, mask) < 0  # worse than the mean
    masked_out = returns.clone()
    masked_out[0, 2] = 100.0  # padding never counts
    assert explained_variance(masked_out, returns, mask) == pytest.approx(1.0, abs=1e-5)
    assert math.isnan(explained_variance(torch.ones(2, 3), torch.zeros(2, 3), mask[:2]))


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_an_update_with_a_critic_logs_how_much_of_the_returns_it_explains(tmp_path,
                                                                         one_torch_thread,
                                                                         estimator):
    trainer = tiny_trainer(tmp_path, f"algorithm.adv_estimator={estimator}")
    try:
        metrics = trainer.updater.update(two_turn_batch(4), StageTimer())
    finally:
        trainer.close()
    if estimator == "grpo":  # no critic, nothing to explain
        assert "critic/vf_explained_var" not in metrics
    else:  # the new head predicts 0 everywhere: no better than the returns' mean
        assert metrics["critic/vf_explained_var"] == pytest.approx(0.0, abs=0.05)
