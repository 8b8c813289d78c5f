"""After an in-run warm start (train.sft_steps) PPO starts from the warm-started policy: the KL
reference is that policy, a critic with its own backbone starts from its weights, and a run
resumed after the warm start restores the same reference from its checkpoint."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import build_config
from agentrl.trainers.checkpoint import latest_checkpoint
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.policy import backbone_of, response_logprobs
from test_sft import sft_config
from update_fixtures import two_turn_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kl_config(tmp_path, *, lora: int = 0, total_steps: int = 2):
    """One warm-start step (a large SFT learning rate: the weights move), then PPO with a KL
    loss and a critic on its own backbone."""
    data = sft_config(tmp_path, lr=5e-2).to_dict()
    data["train"].update(group_num=1, group_size=2, total_steps=total_steps, sft_steps=1)
    data["val"].update(test_freq=0, before_train=False)
    data["trainer"].update(logger=[], plot=False, save_freq=0)
    data["actor"].update(use_kl_loss=True)
    data["critic"].update(share_backbone=False)
    data["lora"].update(rank=lora)
    return build_config(data)


@torch.no_grad()
def logprobs(trainer, batch, *, reference: bool) -> torch.Tensor:
    if not reference:
        return response_logprobs(trainer.actor, batch)[0]
    with trainer.updater._reference() as ref:
        return response_logprobs(ref, batch)[0]


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_the_reference_and_the_critic_start_from_the_warm_started_policy(tmp_path, lora):
    batch = two_turn_batch(2)
    trainer = LocalTrainer(kl_config(tmp_path, lora=lora))
    try:
        untrained = logprobs(trainer, batch, reference=False)
        assert torch.equal(logprobs(trainer, batch, reference=True), untrained)
        trainer.train_step(1)  # the warm start's only step
        warm = logprobs(trainer, batch, reference=False)
        assert (warm - untrained).abs().max() > 1e-3  # the warm start moved the policy
        assert torch.allclose(logprobs(trainer, batch, reference=True), warm, atol=1e-6)
        # scoring with the reference left the actor as it was
        assert torch.equal(logprobs(trainer, batch, reference=False), warm)
        actor_backbone = backbone_of(trainer.actor).state_dict()
        for name, weight in trainer.critic.backbone.state_dict().items():
            assert torch.equal(weight, actor_backbone[name]), name
    finally:
        trainer.close()


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_a_run_resumed_after_the_warm_start_keeps_its_reference(tmp_path, lora):
    batch = two_turn_batch(2)
    first = LocalTrainer(kl_config(tmp_path, lora=lora))
    try:
        first.fit()  # the warm start, one PPO step, a checkpoint of step 2
        reference = logprobs(first, batch, reference=True)
    finally:
        first.close()
    resumed = LocalTrainer(kl_config(tmp_path, lora=lora, total_steps=3))
    try:
        loaded = logprobs(resumed, batch, reference=True)
        assert (loaded - reference).abs().max() > 1e-3  # not the loaded model's
        resumed._restore(latest_checkpoint(tmp_path / "run"))
        assert resumed.step == 2
        assert torch.allclose(logprobs(resumed, batch, reference=True), reference, atol=1e-6)
    finally:
        resumed.close()
