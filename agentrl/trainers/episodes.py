"""Advantages over whole episodes: rows of one episode stitched together, and per-turn discounting.

    rows = rows_by_episode(batch["episode_index"])           # [[0, 1], [2], ...]
    rewards_e, mask_e = stitch(rows, rewards, mask)          # one row per episode
    advantages_e, returns_e = estimator(rewards_e, mask_e)   # verl's function, unchanged
    advantages = unstitch(rows, advantages_e, width)         # back to the batch's rows

**Why stitch.** An episode whose context shrank is several batch rows, one per context window
(:func:`agentrl.rollout.batch.context_samples`), so that every reply is trained on the context
it was sampled from. Rewards and credit still belong to the episode: GAE must carry the later
windows' rewards back into the earlier ones, and GRPO must score the episode, not a window.
Concatenating an episode's rows (model tokens in order, padding and observations masked out,
which verl's GAE bridges) and running verl's estimator on that gives exactly the advantages of
the unsplit episode, except that each token's value comes from the critic reading the context
its reply was sampled from. The last turn of a window therefore bootstraps from the value of
the next window's first reply token, read on the next window's (shorter) context.

**Per-turn discounting** (:func:`turn_gae`): ``gamma`` between turns, 1 within a reply (RAGEN's
and GiGPO's convention; per-token ``gamma`` discounts a turn's reward by ``gamma ** tokens``).
Each turn becomes one step. Turns are found in the batch's own rows (:func:`episode_turn_spans`):
within a row an observation always separates two replies, and a row boundary always ends one.
In the stitched mask a window that ends on a model token at full width touches the next
window's first reply, so gaps in the stitched mask would merge two turns. A turn's step
reward is the sum of its token rewards, its value the critic's value before its first token.
verl's GAE runs over those steps; every token of a turn gets its turn's return, and the
advantage ``return - value`` whitened over model tokens as verl's GAE whitens it.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["episode_turn_spans", "rows_by_episode", "stitch", "turn_gae", "turn_spans",
           "unstitch"]


def rows_by_episode(episode_index: torch.Tensor) -> list[list[int]]:
    """Batch rows of each episode, in row order; episodes in order of first appearance."""
    episodes: dict[int, list[int]] = {}
    for row, episode in enumerate(episode_index.tolist()):
        episodes.setdefault(int(episode), []).append(row)
    return list(episodes.values())


def stitch(rows: list[list[int]], *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each ``(B, R)`` tensor as ``(E, R * most rows of an episode)``: an episode's rows end to
    end (zeros after the last)."""
    width = tensors[0].shape[1] * max(len(r) for r in rows)
    out = []
    for tensor in tensors:
        stitched = tensor.new_zeros((len(rows), width))
        for e, episode in enumerate(rows):
            flat = tensor[episode].reshape(-1)
            stitched[e, :flat.numel()] = flat
        out.append(stitched)
    return out


def unstitch(rows: list[list[int]], stitched: torch.Tensor, width: int) -> torch.Tensor:
    """The inverse of :func:`stitch`: ``(E, L)`` back to ``(B, width)``."""
    out = stitched.new_zeros((sum(len(r) for r in rows), width))
    for e, episode in enumerate(rows):
        out[episode] = stitched[e, :width * len(episode)].reshape(len(episode), width)
    return out


def turn_spans(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of 1s in a response mask row: one per reply (an
    observation, mask 0, always separates two replies)."""
    mask = mask_row.bool().tolist()
    spans, start = [], None
    for i, on in enumerate([*mask, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            spans.append((start, i))
            start = None
    return spans


def episode_turn_spans(rows: list[list[int]], response_mask: torch.Tensor
                       ) -> list[list[tuple[int, int]]]:
    """The turns of each episode in :func:`stitch`'s layout: each row's own :func:`turn_spans`,
    shifted to where :func:`stitch` puts the row, so no turn crosses a row boundary."""
    width = response_mask.shape[1]
    return [[(j * width + start, j * width + end)
             for j, row in enumerate(episode) for start, end in turn_spans(response_mask[row])]
            for episode in rows]


GaeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def turn_gae(gae: GaeFn, token_rewards: torch.Tensor, values: torch.Tensor,
             response_mask: torch.Tensor, *, gamma: float, lam: float,
             spans: list[list[tuple[int, int]]] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` ``(B, R)`` with ``gamma`` and ``lam`` per turn (module
    docstring). ``gae`` is verl's ``compute_gae_advantage_return``. ``spans``: each row's turns
    (:func:`episode_turn_spans` for stitched rows); by default each row's runs of model tokens."""
    from verl.utils.torch_functional import masked_whiten

    if spans is None:
        spans = [turn_spans(row) for row in response_mask]
    turns = max(1, max(len(s) for s in spans))
    shape = (response_mask.shape[0], turns)
    step_rewards = token_rewards.new_zeros(shape)
    step_values = values.new_zeros(shape)
    step_mask = response_mask.new_zeros(shape)
    for row, row_spans in enumerate(spans):
        for k, (start, end) in enumerate(row_spans):
            step_rewards[row, k] = token_rewards[row, start:end].sum()
            step_values[row, k] = values[row, start]
            step_mask[row, k] = 1
    if int(step_mask.sum()) > 1:
        _, step_returns = gae(token_level_rewards=step_rewards, values=step_values,
                              response_mask=step_mask, gamma=gamma, lam=lam)
    else:  # one turn in all (verl's GAE cannot whiten one step): its return is its reward
        step_returns = step_rewards
    returns = torch.zeros_like(token_rewards, dtype=step_returns.dtype)
    first_values = torch.zeros_like(returns)
    for row, row_spans in enumerate(spans):
        for k, (start, end) in enumerate(row_spans):
            returns[row, start:end] = step_returns[row, k]
            first_values[row, start:end] = step_values[row, k]
    advantages = masked_whiten(returns - first_values, response_mask) * response_mask
    return advantages, returns
