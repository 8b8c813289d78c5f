"""Gradient accumulation is exact in every loss_agg_mode, and the loss metrics report the
mini-batch's aggregated loss: one micro-batch of the whole mini-batch and micro-batches of one
trajectory (each trimmed of its own padding) give the same gradients and the same metrics."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from agentrl.trainers import ppo
from agentrl.trainers.policy import response_logprobs
from update_fixtures import GradientRecorder, relative_difference, tiny_trainer, two_turn_batch

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, one_torch_thread):
    """Separate critic, entropy bonus and KL loss: every loss term."""
    return tiny_trainer(tmp_path_factory.mktemp("accumulation"), "actor.entropy_coeff=0.01",
                        "actor.use_kl_loss=true", "critic.share_backbone=false")


def configure(trainer, mode: str, micro_batch_size: int) -> None:
    actor = dataclasses.replace(trainer.config.actor, loss_agg_mode=mode,
                                micro_batch_size=micro_batch_size)
    trainer.config = dataclasses.replace(trainer.config, actor=actor)
    trainer.updater.loss_settings = dataclasses.replace(trainer.updater.loss_settings, loss_agg_mode=mode)


def update_batch(trainer) -> dict[str, torch.Tensor]:
    """The fixed batch with everything the actor and critic losses read."""
    batch = two_turn_batch(4)
    generator = torch.Generator().manual_seed(1)
    mask = batch["response_mask"].float()
    noise = lambda: torch.randn(mask.shape, generator=generator) * mask  # noqa: E731
    with torch.no_grad():
        logprobs = response_logprobs(trainer.actor, batch)[0]
    batch.update(old_logprobs=logprobs + 0.1 * noise(), ref_logprobs=logprobs + 0.2 * noise(),
                 advantages=noise(), returns=3 * noise(), values=noise())
    return batch


def run_epoch(trainer, batch, mode: str, micro_batch_size: int, role: str):
    """One epoch of ``role``'s update in ``mode`` at this micro-batch size: (gradients, metrics)."""
    configure(trainer, mode, micro_batch_size)
    if role == "actor":
        optim, params, micro = trainer.actor_optim, list(trainer.actor.parameters()), trainer.updater._actor_micro
    else:
        optim, params = trainer.critic_optim, trainer.critic.trainable_parameters()
        micro = functools.partial(trainer.updater._critic_micro, cliprange_value=0.5)
    recorder = GradientRecorder(optim)
    saved = [p.detach().clone() for p in params]
    metrics, skipped = trainer.updater._epochs(batch, micro, optim, params, grad_clip=1e9, epochs=1, role=role)
    with torch.no_grad():  # back to the same weights for the next run
        for p, s in zip(params, saved):
            p.copy_(s)
    assert skipped == 0 and len(recorder.steps) == 1
    return recorder.steps[0], metrics


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_give_the_mini_batch_gradient(trainer, mode, role):
    batch = update_batch(trainer)
    whole, whole_metrics = run_epoch(trainer, batch, mode, 4, role)
    single, single_metrics = run_epoch(trainer, batch, mode, 1, role)
    assert relative_difference(single, whole) < 1e-5, mode
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "critic/vf_loss"):
        if key in whole_metrics:
            assert single_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-5), key


def test_loss_metrics_are_the_mini_batch_loss_of_a_seq_mean_mode(trainer):
    """``actor/pg_loss`` and ``actor/entropy`` are the aggregated terms the mode optimizes,
    computed here on the untrimmed mini-batch in one piece, not token-share rescalings."""
    mode = "seq-mean-token-mean"
    batch = update_batch(trainer)
    _, metrics = run_epoch(trainer, batch, mode, 1, "actor")
    mask = batch["response_mask"].float()
    size = ppo.MiniBatchSize.of(mask)
    with torch.no_grad():
        logprobs, entropy, _ = response_logprobs(trainer.actor, batch, with_entropy=True)
    pg_loss, _ = ppo.policy_loss(logprobs, batch["old_logprobs"], batch["advantages"], mask,
                                 trainer.updater.loss_settings, size)
    entropy_term = ppo.entropy_bonus(entropy, mask, mode, size)
    assert metrics["actor/pg_loss"] == pytest.approx(float(pg_loss), rel=1e-5)
    assert metrics["actor/entropy"] == pytest.approx(float(entropy_term), rel=1e-5)
