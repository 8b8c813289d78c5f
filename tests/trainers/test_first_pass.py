"""One PPO epoch over one mini-batch: the old log-probs are the update's own first-pass
log-probs (detached), not a separate no-grad pass. The update is the same either way (weights
after the step within 1e-6), and the actor runs one forward pass fewer per micro-batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.trainers.local import LocalTrainer, StageTimer
from update_fixtures import GradientRecorder, relative_difference, tiny_trainer, two_turn_batch


def one_step(tmp_path, *overrides: str) -> tuple[list[torch.Tensor], list[torch.Tensor], int, dict]:
    """(actor weights after one step, the gradients applied, actor forward passes, metrics)."""
    trainer = tiny_trainer(tmp_path, "actor.lr=1e-4", "actor.micro_batch_size=2", *overrides)
    passes = 0

    def count(*_):
        nonlocal passes
        passes += 1

    trainer.actor.register_forward_pre_hook(count)
    recorder = GradientRecorder(trainer.actor_optim)
    trainer.step = 1
    metrics = trainer._update(two_turn_batch(4), StageTimer())
    weights = [p.detach().clone() for p in trainer.actor.parameters()]
    return weights, recorder.steps[0], passes, metrics


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["algorithm.adv_estimator=grpo", "critic.share_backbone=false"])
def test_first_pass_old_logprobs_give_the_same_update(tmp_path, monkeypatch, critic, one_torch_thread):
    fast, fast_grads, fast_passes, fast_metrics = one_step(tmp_path / "fast", critic)
    with monkeypatch.context() as patch:
        patch.setattr(LocalTrainer, "_first_pass_is_old", lambda self, n: False)
        slow, slow_grads, slow_passes, _ = one_step(tmp_path / "slow", critic)
    print(f"actor forward passes: {fast_passes} with the first pass as old, {slow_passes} without")
    assert fast_passes == slow_passes - 2  # 4 trajectories in micro-batches of 2
    assert fast_metrics["actor/ppo_kl"] == 0.0  # the ratio is exactly 1 in that pass
    assert relative_difference(fast_grads, slow_grads) < 1e-5
    assert max(float((a - b).abs().max()) for a, b in zip(fast, slow)) < 1e-6


def test_no_shortcut_where_the_old_logprobs_are_needed_first(tmp_path, one_torch_thread):
    """Several mini-batches or epochs update between passes; KL in the reward reads the old
    log-probs before the advantages; a critic on the actor's backbone needs that pass for its
    values."""
    trainer = tiny_trainer(tmp_path / "separate", "critic.share_backbone=false")
    assert trainer._first_pass_is_old(4)
    config = trainer.config
    for section, key, value in (("actor", "ppo_mini_batch_size", 2), ("actor", "ppo_epochs", 2),
                                ("algorithm", "use_kl_in_reward", True)):
        changed = dataclasses.replace(getattr(config, section), **{key: value})
        trainer.config = dataclasses.replace(config, **{section: changed})
        assert not trainer._first_pass_is_old(4), key
    assert not tiny_trainer(tmp_path / "shared", "critic.share_backbone=true")._first_pass_is_old(4)
