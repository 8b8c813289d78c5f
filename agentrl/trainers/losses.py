"""Policy losses agentrl adds to verl's ``POLICY_LOSS_REGISTRY``: ``actor.policy_loss`` names them
on either trainer (the local one looks them up as verl's own; verl's actor workers import this
module through ``external_lib``, :mod:`agentrl.verl.agent_loop`).

``self_imitation``: PPO's clipped loss (verl's ``vanilla``) on the positive part of the
advantages only (self-imitation learning, Oh et al. 2018: learn from ``(R - V)+``; with GRPO's
group-normalised returns, the episodes that beat their group). After a supervised warm start the
policy is confident and most of its sampled episodes replay one another; pushing down the tokens
of a lost episode moves probability onto arbitrary other tokens, and at the learning rate of the
warm start that undoes it. Imitating only what won keeps every update a step of the warm start's
kind (cross-entropy toward the model's own wins), so it can run at that learning rate.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

__all__ = ["SELF_IMITATION", "self_imitation_loss"]

SELF_IMITATION = "self_imitation"


@register_policy_loss(SELF_IMITATION)
def self_imitation_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                        advantages: torch.Tensor, response_mask: torch.Tensor,
                        loss_agg_mode: str = "token-mean", config: Any = None,
                        rollout_is_weights: torch.Tensor | None = None,
                        ) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's clipped PPO loss with every negative advantage set to 0 (same signature)."""
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages.clamp(min=0.0), response_mask,
        loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=rollout_is_weights)
    kept = (advantages > 0) & response_mask.bool()
    metrics["actor/positive_advantage_frac"] = float(kept.sum()) / max(1, int(response_mask.sum()))
    return loss, metrics
