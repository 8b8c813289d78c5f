"""Sibling values: a turn's value from the returns its group's other episodes got from the
same board at the same turn, blended with the critic's.

    mean, count = sibling_returns(returns, batch["state_ids"], batch["episode_index"], mask)
    values = blend(critic_values, mean, count, pseudocount=2.0)

Why: a group plays one game 8 times, so its episodes start from the same board and often meet
the same boards again. The mean return-to-go of the *other* episodes from a board is a
Monte-Carlo estimate of that board's value under the current policy (VinePPO estimates values
from fresh rollouts the same way; here the group's own episodes are the rollouts, at no cost).
It knows what a critic reading one board at a time has to learn across games: how well the
policy plays *this* game. It leaves the episode's own return out, so it does not depend on the
episode's own actions and stays a valid baseline. Few siblings give a noisy mean, so it is
shrunk toward the critic's value: with ``n`` siblings the value is ``(n * mean + k * critic) /
(n + k)``, the critic counting as ``k`` = ``critic.sibling_pseudocount`` episodes (empirical
Bayes' weight for a prior worth ``k`` observations). A turn no sibling shares keeps the
critic's value. The critic still learns from GAE's returns: at ``lam`` 1 the episodes' own
returns-to-go; below 1 they bootstrap from the values GAE read, the blend included (and
``critic/vf_explained_var`` scores the blend against them, as verl scores any critic).
"""

from __future__ import annotations

import torch

from agentrl.trainers.episodes import turn_spans

__all__ = ["blend", "sibling_returns"]


def sibling_returns(returns: torch.Tensor, state_ids: torch.Tensor, episode_index: torch.Tensor,
                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per model token, the mean return-to-go of the other episodes' turns with the turn's
    ``state_ids`` id (each read at its reply's first token), and how many there are; ``(B, R)``
    each, 0 where a turn has no id or no such sibling. ``returns``: the returns-to-go ``(B, R)``;
    ``episode_index`` ``(B,)``: rows of one episode never count as each other's siblings."""
    turns = []  # (row, start, end, id, episode, return at the turn's first token)
    for row in range(returns.shape[0]):
        for start, end in turn_spans(mask[row]):
            state = int(state_ids[row, start])
            if state >= 0:
                turns.append((row, start, end, state, int(episode_index[row]),
                              float(returns[row, start])))
    totals: dict[int, list[float]] = {}
    by_episode: dict[tuple[int, int], list[float]] = {}
    for _, _, _, state, episode, value in turns:
        for table, key in ((totals, state), (by_episode, (state, episode))):
            entry = table.setdefault(key, [0.0, 0])
            entry[0] += value
            entry[1] += 1
    mean = torch.zeros(returns.shape, dtype=torch.float32)
    count = torch.zeros(returns.shape, dtype=torch.float32)
    for row, start, end, state, episode, _ in turns:
        (total, n), (own_total, own_n) = totals[state], by_episode[(state, episode)]
        if n > own_n:
            mean[row, start:end] = (total - own_total) / (n - own_n)
            count[row, start:end] = n - own_n
    return mean, count


def blend(values: torch.Tensor, sibling_mean: torch.Tensor, sibling_count: torch.Tensor,
          pseudocount: float) -> torch.Tensor:
    """``(n * sibling mean + k * values) / (n + k)`` per token, ``n`` = ``sibling_count`` and
    ``k`` = ``pseudocount`` (> 0); ``values`` where ``n`` is 0."""
    if pseudocount <= 0:
        raise ValueError(f"pseudocount must be > 0, got {pseudocount}")
    weight = sibling_count / (sibling_count + pseudocount)
    return values + weight.to(values) * (sibling_mean.to(values) - values)
