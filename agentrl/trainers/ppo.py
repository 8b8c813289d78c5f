"""PPO's math, from verl's ``core_algos``, on the batch layout of :func:`agentrl.rollout.to_batch`.

    rewards, kl = rewards_with_kl(token_rewards, mask, old_logprobs, ref_logprobs, kl_coef=0.001,
                                  kl_penalty="low_var_kl")
    advantages, returns = compute_advantages("gae", rewards, mask, values=values, gamma=1.0, lam=1.0,
                                             episode_index=batch["episode_index"], gamma_unit="turn")
    size = MiniBatchSize.of(mini_batch_mask)       # what each micro-batch loss is normalized by
    loss, metrics = policy_loss(new_logprobs, old_logprobs, advantages, mask, LossSettings(), size)

Nothing here re-implements an estimator or a loss: advantages come from
``core_algos.get_adv_estimator_fn(name)`` (GAE, or GRPO and the other critic-free estimators
through the same call), the policy loss from ``get_policy_loss_fn(name)`` (low/high clip,
dual-clip ``clip_ratio_c``), the value loss from ``compute_value_loss`` (clipped), KL from
``kl_penalty`` and every reduction from ``agg_loss``. This module only adapts arguments; :mod:`agentrl.trainers.episodes` runs them over whole
episodes (an episode may be several rows, one per context window) and per turn
(``gamma_unit="turn"``).

Gradient accumulation is exact in every ``loss_agg_mode``: each micro-batch's loss is
aggregated with the *mini-batch's* token count, sequence count and response width (verl's
``global_batch_info``: ``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``), so
the summed micro-batch losses are the mini-batch's loss, and their gradients its gradient,
whatever the micro-batch size (a micro-batch trimmed of shared padding has a narrower mask, which
``seq-mean-token-sum-norm`` would otherwise divide by).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from agentrl.trainers import episodes

__all__ = [
    "LossSettings", "MiniBatchSize", "aggregate", "compute_advantages", "entropy_bonus",
    "kl_loss", "policy_loss", "rewards_with_kl", "value_loss",
]


def _core():
    from verl.trainer.ppo import core_algos

    import agentrl.trainers.losses  # noqa: F401  (registers agentrl's policy losses)

    return core_algos


@dataclass(frozen=True)
class MiniBatchSize:
    """What a micro-batch's loss is normalised by: the tokens, sequences and response width of
    its mini-batch (``width``: the horizon ``seq-mean-token-sum-norm`` divides by, verl's
    ``loss_scale_factor``; by default the mask's width, which trimming a micro-batch changes)."""

    tokens: int
    sequences: int
    width: int

    @classmethod
    def of(cls, response_mask: torch.Tensor) -> MiniBatchSize:
        """The sizes of a mini-batch's ``(B, R)`` mask, as laid out in the step's batch."""
        seqs = int((response_mask.sum(-1) > 0).sum())
        return cls(tokens=max(1, int(response_mask.sum())), sequences=max(1, seqs),
                   width=max(1, int(response_mask.shape[-1])))

    def info(self) -> dict[str, int]:
        return {"dp_size": 1, "batch_num_tokens": self.tokens, "global_batch_size": self.sequences,
                "loss_scale_factor": self.width}


@dataclass(frozen=True)
class LossSettings:
    """The actor-loss knobs (a view of the actor config, in core_algos' terms)."""

    policy_loss: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, size: MiniBatchSize) -> torch.Tensor:
    return _core().agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode, **size.info())


def rewards_with_kl(token_rewards: torch.Tensor, response_mask: torch.Tensor,
                    old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, *, kl_coef: float,
                    kl_penalty: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``rewards - kl_coef * KL(old || ref)`` on model tokens (verl's ``apply_kl_penalty``);
    also returns the per-token KL."""
    kl = _core().kl_penalty(old_logprobs, ref_logprobs, kl_penalty) * response_mask
    return token_rewards - kl_coef * kl, kl


GAMMA_UNITS = ("token", "turn")


def compute_advantages(estimator: str, token_rewards: torch.Tensor, response_mask: torch.Tensor, *,
                       values: torch.Tensor | None = None, group_index: np.ndarray | None = None,
                       gamma: float = 1.0, lam: float = 1.0,
                       norm_adv_by_std_in_grpo: bool = True,
                       episode_index: torch.Tensor | None = None,
                       gamma_unit: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``(B, R)``, from the estimator registered as ``estimator``.

    GAE needs the critic's ``values``; the outcome estimators (GRPO, RLOO, ...) need
    ``group_index`` (one id per row; the rows of a group share it). ``episode_index`` (one id
    per row) joins the rows of one episode before estimating (see
    :mod:`agentrl.trainers.episodes`; default: every row its own episode). ``gamma_unit``:
    ``"token"`` discounts by ``gamma`` per generated token (verl's GAE as is), ``"turn"`` per
    turn (GAE only; outcome estimators do not discount).
    """
    if gamma_unit not in GAMMA_UNITS:
        raise ValueError(f"unknown gamma_unit {gamma_unit!r}; allowed: {GAMMA_UNITS}")
    if estimator == "gae" and values is None:
        raise ValueError("the gae estimator needs the critic's values")
    if estimator != "gae" and group_index is None:
        raise ValueError(f"the {estimator} estimator needs group_index")
    if episode_index is None:
        rows = [[row] for row in range(token_rewards.shape[0])]
    else:
        rows = episodes.rows_by_episode(episode_index)
    width = token_rewards.shape[1]
    tensors = [token_rewards, response_mask] + ([values] if values is not None else [])
    stitched = episodes.stitch(rows, *tensors)
    groups = None if group_index is None else np.asarray(group_index)[[r[0] for r in rows]]
    turns = episodes.episode_turn_spans(rows, response_mask) if gamma_unit == "turn" else None
    advantages, returns = _estimate(estimator, *stitched[:2],
                                    values=stitched[2] if values is not None else None,
                                    group_index=groups, gamma=gamma, lam=lam,
                                    norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                                    turns=turns)
    return episodes.unstitch(rows, advantages, width), episodes.unstitch(rows, returns, width)


def _estimate(estimator: str, token_rewards: torch.Tensor, response_mask: torch.Tensor, *,
              values: torch.Tensor | None, group_index: np.ndarray | None, gamma: float,
              lam: float, norm_adv_by_std_in_grpo: bool,
              turns: list[list[tuple[int, int]]] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One estimator call on stitched episodes; ``turns`` (per-turn GAE): each episode's turns."""
    fn = _core().get_adv_estimator_fn(estimator)
    if estimator == "gae":
        if turns is not None:
            return episodes.turn_gae(fn, token_rewards, values, response_mask, gamma=gamma,
                                     lam=lam, spans=turns)
        return fn(token_level_rewards=token_rewards, values=values, response_mask=response_mask,
                  gamma=gamma, lam=lam)
    kwargs: dict[str, Any] = {"token_level_rewards": token_rewards, "response_mask": response_mask,
                              "index": group_index}
    if estimator == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
    return fn(**kwargs)


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, settings: LossSettings,
                size: MiniBatchSize) -> tuple[torch.Tensor, dict[str, float]]:
    """The registered policy loss (``vanilla``: PPO clip with separate low/high clip)."""
    config = OmegaConf.create({
        "clip_ratio": settings.clip_ratio_low, "clip_ratio_low": settings.clip_ratio_low,
        "clip_ratio_high": settings.clip_ratio_high, "clip_ratio_c": settings.clip_ratio_c,
        "loss_agg_mode": settings.loss_agg_mode,
        "policy_loss": {"loss_mode": settings.policy_loss}, "global_batch_info": size.info(),
    })
    fn = _core().get_policy_loss_fn(settings.policy_loss)
    loss, metrics = fn(old_log_prob=old_logprobs, log_prob=logprobs, advantages=advantages,
                       response_mask=response_mask, loss_agg_mode=settings.loss_agg_mode,
                       config=config)
    return loss, {k: float(v) for k, v in metrics.items()}


def entropy_bonus(entropy: torch.Tensor, response_mask: torch.Tensor, mode: str,
                  size: MiniBatchSize) -> torch.Tensor:
    return aggregate(entropy, response_mask, mode, size)


def kl_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor,
            kl_type: str, mode: str, size: MiniBatchSize) -> torch.Tensor:
    """KL(actor || ref) as a loss term (verl's ``use_kl_loss``)."""
    return aggregate(_core().kl_penalty(logprobs, ref_logprobs, kl_type), response_mask, mode, size)


def value_loss(vpreds: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
               response_mask: torch.Tensor, *, cliprange_value: float, mode: str,
               size: MiniBatchSize) -> tuple[torch.Tensor, float]:
    """Clipped value loss (``0.5 * max((v - R)^2, (clip(v) - R)^2)``, aggregated)."""
    loss, clipfrac = _core().compute_value_loss(
        vpreds=vpreds, returns=returns, values=old_values, response_mask=response_mask,
        cliprange_value=cliprange_value, loss_agg_mode=mode, **size.info())
    return loss, float(clipfrac)
