"""agentrl's registered policy losses: ``self_imitation`` learns from positive advantages only,
through the same lookup (``actor.policy_loss``) as verl's own losses."""

from __future__ import annotations

import torch

from agentrl.config import compose_config
from agentrl.trainers import ppo
from agentrl.trainers.losses import SELF_IMITATION


def gradient(loss_name: str, advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and d loss / d log-prob for a (2, 3) batch whose new log-probs moved off the old."""
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]])
    new = (old + torch.tensor([[0.1, -0.1, 0.05], [0.0, 0.2, -0.05]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, _ = ppo.policy_loss(new, old, advantages, mask,
                              ppo.LossSettings(policy_loss=loss_name), ppo.MiniBatchSize.of(mask))
    loss.backward()
    return loss.detach(), new.grad


def test_self_imitation_leaves_negative_advantage_tokens_untouched():
    advantages = torch.tensor([[1.0, -2.0, 0.5], [-1.0, 2.0, 3.0]])
    _, grad = gradient(SELF_IMITATION, advantages)
    assert torch.all(grad[advantages <= 0] == 0)
    assert torch.all(grad[(advantages > 0) & (torch.tensor([[1, 1, 1], [1, 1, 0]]) > 0)] != 0)


def test_self_imitation_is_clipped_ppo_on_the_positive_part():
    advantages = torch.tensor([[1.0, -2.0, 0.5], [-1.0, 2.0, 3.0]])
    loss, grad = gradient(SELF_IMITATION, advantages)
    vanilla_loss, vanilla_grad = gradient("vanilla", advantages.clamp(min=0))
    assert torch.allclose(loss, vanilla_loss) and torch.allclose(grad, vanilla_grad)
    all_loss, _ = gradient("vanilla", advantages)
    assert not torch.allclose(loss, all_loss)


def test_the_config_accepts_self_imitation():
    assert compose_config([f"actor.policy_loss={SELF_IMITATION}"]).actor.policy_loss == SELF_IMITATION
