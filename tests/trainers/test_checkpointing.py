"""model.gradient_checkpointing is real: the update's backward recomputes each decoder layer
instead of keeping its activations (counted as the bytes autograd saves for the backward pass
while a decoder layer runs: the tiny model's activations are otherwise dwarfed by its 49k-wide
logits), while log-probs and gradients stay the same (the model stays in eval mode)."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainers import ppo
from update_fixtures import tiny_trainer, two_turn_batch


def actor_pass(trainer, batch) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """Bytes the decoder layers save for backward in one actor micro-batch loss; the loss and
    the gradients."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    params = {p.data_ptr() for p in trainer.actor.parameters()}
    saved, inside = 0, 0

    def enter(*_):
        nonlocal inside
        inside += 1

    def leave(*_):
        nonlocal inside
        inside -= 1

    for layer in trainer.actor.modules():
        if isinstance(layer, GradientCheckpointingLayer):
            layer.register_forward_pre_hook(enter)
            layer.register_forward_hook(leave)

    def pack(tensor: torch.Tensor):
        nonlocal saved
        if inside and tensor.data_ptr() not in params:  # weights are kept anyway
            saved += tensor.numel() * tensor.element_size()
        return tensor

    trainer.actor.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss, _, _ = trainer.updater._actor_micro(batch, ppo.MiniBatchSize.of(batch["response_mask"].float()))
    loss.backward()
    grads = [p.grad.clone() for p in trainer.actor.parameters() if p.grad is not None]
    return saved, loss.detach(), grads


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_saves_fewer_activations_and_changes_nothing_else(tmp_path, lora, one_torch_thread):
    batch = two_turn_batch(4)
    mask = batch["response_mask"].float()
    generator = torch.Generator().manual_seed(0)
    batch.update(advantages=torch.randn(mask.shape, generator=generator) * mask)
    runs = {}
    for on in (False, True):
        trainer = tiny_trainer(tmp_path / str(on), f"model.gradient_checkpointing={str(on).lower()}",
                               "algorithm.adv_estimator=grpo", f"lora.rank={4 if lora else 0}")
        with torch.no_grad():
            from agentrl.trainers.policy import response_logprobs

            batch["old_logprobs"] = response_logprobs(trainer.actor, batch)[0]
        runs[on] = actor_pass(trainer, batch)
        assert not trainer.actor.training  # eval mode outside the update's forward
    (plain, plain_loss, plain_grads), (checked, checked_loss, checked_grads) = runs[False], runs[True]
    print(f"saved activation bytes: off {plain}, on {checked} ({checked / plain:.2f}x)")
    assert plain > 0 and checked < 0.1 * plain
    assert torch.equal(checked_loss, plain_loss)
    assert len(checked_grads) == len(plain_grads)
    for a, b in zip(checked_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
