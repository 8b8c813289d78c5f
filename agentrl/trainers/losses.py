"""Policy losses agentrl adds to verl's ``POLICY_LOSS_REGISTRY``: ``actor.policy_loss`` names them
on either trainer (the local one looks them up as verl's own; verl's actor workers import this
module through ``external_lib``, :mod:`agentrl.verl.agent_loop`).

``self_imitation``: PPO's clipped loss (verl's ``vanilla``) on the positive part of the
advantages only (self-imitation learning, Oh et al. 2018: learn from ``(R - V)+``; with GRPO's
group-normalised returns, the episodes that beat their group). Pushing down a lost episode's
tokens moves probability onto arbitrary other tokens; this loss leaves them alone. Measured after
the supervised warm start (docs/results/learning.md, "Self-imitation"): at the warm start's
learning rate it undid the warm start as the whole loss did, at 1e-5 it kept it.
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
