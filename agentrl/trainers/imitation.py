"""The supervised loss on demonstrations, shared by ``agentrl sft`` and the warm start in a run.

    batch = to_batch(oracle_demonstrations(config, tokenizer, loop), pad_token_id)
    rows = update_rows(batch["episode_index"], config.sft.mini_batch_size, config.seed, update)
    loss, grad_norm = sft_update(model, params, optim, batch, rows, config)

Units: a mini-batch is ``sft.mini_batch_size`` demonstrations (episodes) with all their rows;
a batch has one row per context window of an episode (:func:`agentrl.rollout.to_batch`), so
an episode whose older turns left the context is several rows, and an epoch trains every row
once. A micro-batch is ``sft.micro_batch_size`` rows: memory goes with rows, not episodes.
The loss of a mini-batch is the mean negative log-likelihood over every reply token in it
(:func:`loss_mask`: ``response_mask``, 1 on the model's own tokens); micro-batches add their
parts of it exactly (:func:`accumulate_gradients`). Neither trainer is imported here:
:mod:`agentrl.trainers.sft` and :mod:`agentrl.trainers.warm_start` both build on this module.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from agentrl.rollout.demonstrations import demonstration_seeds, play_demonstrations
from agentrl.trainers.microbatch import micro_order, micro_rows
from agentrl.trainers.policy import response_logprobs
from agentrl.trainers.shared_prefix import SharedPrefix, plan_prefix_runs

__all__ = ["accumulate_gradients", "loss_mask", "masked_logprobs", "oracle_demonstrations",
           "sft_update", "update_rows", "updates_per_epoch"]

log = logging.getLogger("agentrl.sft")


def updates_per_epoch(episodes: int, mini_batch_size: int) -> int:
    """Updates in one pass over ``episodes`` demonstrations (the last mini-batch may be short)."""
    return math.ceil(episodes / mini_batch_size)


def update_rows(episode_index: torch.Tensor, mini_batch_size: int, seed: int, update: int
                ) -> torch.Tensor:
    """The batch rows of SFT update ``update`` (from 0): every context window of the update's
    ``mini_batch_size`` demonstrations. ``episode_index`` ``(B,)`` is each row's episode
    (:func:`agentrl.rollout.to_batch`). An epoch cuts one shuffle of the episodes, seeded by
    ``seed + epoch``, into consecutive mini-batches, so it trains every row once, and a
    resumed run takes the same mini-batches."""
    episodes = episode_index.unique()
    epoch, index = divmod(update, updates_per_epoch(len(episodes), mini_batch_size))
    order = episodes[torch.randperm(len(episodes),
                                    generator=torch.Generator().manual_seed(seed + epoch))]
    chosen = order[index * mini_batch_size:(index + 1) * mini_batch_size]
    return torch.isin(episode_index, chosen).nonzero().flatten()


def oracle_demonstrations(config: Any, tokenizer: Any, loop: Any,
                          on_episode_done: Any = None) -> list:
    """The oracle's ``sft.episodes`` episodes of the SFT presets, in the RL token layout
    (:func:`agentrl.rollout.demonstrations.play_demonstrations`)."""
    sft = config.sft
    kept = loop.run_until_complete(play_demonstrations(
        config.playing_presets(config.sft_presets, config.rollout.max_new_tokens), tokenizer,
        demonstration_seeds(sft.episodes, config.seed),
        max_context_tokens=config.rollout.max_context_tokens,
        max_new_tokens=config.rollout.max_new_tokens,
        random_action_share=sft.random_action_share,
        flawed_first_move=sft.flawed_first_move, seed=config.seed,
        on_episode_done=on_episode_done))
    if not kept:
        raise ValueError(f"no demonstration was kept of sft.episodes={sft.episodes}: every "
                         "episode had a random turn and ended unsolved; lower "
                         "sft.random_action_share")
    return kept


def sft_update(model: Any, params: list, optim: Any, batch: dict[str, torch.Tensor],
               rows: torch.Tensor, config: Any) -> tuple[float, float]:
    """One SFT update on ``batch[rows]``: exact accumulation, grad-norm clip, AdamW; a
    non-finite loss or gradient skips the step. Returns the loss and the gradient norm."""
    optim.zero_grad(set_to_none=True)
    loss = accumulate_gradients(model, batch, rows, config.sft.micro_batch_size,
                                config.actor.shared_prefix_tokens)
    norm = float(torch.nn.utils.clip_grad_norm_(params, config.sft.grad_clip))
    if math.isfinite(loss) and math.isfinite(norm):
        optim.step()
    else:
        log.warning("non-finite SFT loss or gradient: update skipped")
    return loss, norm


def loss_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Which response tokens the cross-entropy reads: the model's own (``response_mask``)."""
    return batch["response_mask"]


def accumulate_gradients(model: Any, batch: dict[str, torch.Tensor], rows: torch.Tensor,
                         micro_batch_size: int, shared_prefix_tokens: int = 0) -> float:
    """Backward the token-mean NLL of ``batch[rows]`` micro-batch by micro-batch; returns it.

    Each micro-batch contributes ``sum(-logprob * mask) / tokens`` with ``tokens`` counted over
    all of ``rows``, so the summed gradients are those of the whole mini-batch at once. The
    leading tokens a run of micro-batches' rows share (the system prompt and instructions of a
    preset, an episode's first prompt) run once when there are at least ``shared_prefix_tokens``
    of them (:mod:`agentrl.trainers.shared_prefix`; 0 = off).
    """
    tokens = float(loss_mask(batch)[rows].sum())
    if tokens == 0:
        return 0.0
    total = 0.0
    rows = micro_order(batch, rows, shared_prefix_tokens)  # the sum is the same in any order
    for run in plan_prefix_runs(batch, rows, micro_batch_size, shared_prefix_tokens):
        for part in run.micro_batches:
            micro = micro_rows(batch, part)
            loss = -masked_logprobs(model, micro, loss_mask(micro),
                                    shared_prefix_tokens=shared_prefix_tokens,
                                    prefix=run.prefix("model")).sum() / tokens
            loss.backward()
            total += float(loss.detach())
        run.backward()
    return total


def masked_logprobs(model: Any, batch: dict[str, torch.Tensor], mask: torch.Tensor, *,
                    shared_prefix_tokens: int = 0, prefix: SharedPrefix | None = None
                    ) -> torch.Tensor:
    """Log-probs of the response tokens where ``mask`` is 1, flat ``(mask.sum(),)``: PPO's
    :func:`agentrl.trainers.policy.response_logprobs` with the LM head at those positions only
    (observations are most of a multi-turn response, and their logits would be thrown away)."""
    logprobs = response_logprobs(model, batch, shared_prefix_tokens=shared_prefix_tokens,
                                 prefix=prefix, head_mask=mask)[0]
    return logprobs[mask.to(logprobs.device).bool()]
