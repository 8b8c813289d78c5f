"""Trajectories -> padded tensors in verl's ``DataProto`` layout (one function for both trainers).

    batch = to_batch(trajectories, pad_token_id=tokenizer.pad_token_id, reward_placement="turn")

Shapes (``B`` trajectories, ``P`` = longest prompt, ``R`` = longest response, or the given
``max_prompt_length``/``max_response_length``):

- ``prompts`` ``(B, P)``: left-padded; ``responses`` ``(B, R)``: right-padded.
- ``input_ids`` ``(B, P+R)`` = ``cat(prompts, responses)``; ``attention_mask`` 1 on real tokens;
  ``position_ids`` = ``cumsum(attention_mask) - 1`` clipped at 0 (as verl computes them).
- ``response_mask`` ``(B, R)``: 1 on model tokens only (0 on observations and padding).
- ``rollout_log_probs`` ``(B, R)``: the sampler's log-probs, 0.0 elsewhere.
- ``token_level_rewards`` ``(B, R)``: ``"turn"`` puts each turn's reward on that turn's last
  model token (where verl's GAE picks it up); ``"last"`` puts only the episode's score
  (``Trajectory.score`` if normalized, else ``episode_return``) on the last model token. With
  ``"turn"`` and a normalized score, the last turn also carries ``score - episode_return``:
  the turns keep their relative shape and the episode's rewards sum to its normalized score,
  so normalization acts under both placements.

- ``constraint_kind`` ``(B, R)`` and ``constraint_ids`` ``(B, R, K)``, only when a trajectory
  was decoded under constraints (``Trajectory.response_token_masks``): per response token,
  ``1`` = only ``constraint_ids`` could be chosen, ``0`` = all but them, ``-1`` = free; ids are
  padded with ``-1`` to the largest mask ``K``. The trainer's log-prob recompute applies them
  (:func:`agentrl.trainers.policy.response_logprobs`), so it describes the distribution the
  sampler drew from.

A longer prompt or response than the given maximum raises (verl's padding would not truncate
either; cutting silently would drop rewards).
"""

from __future__ import annotations

from typing import Sequence

import torch

from agentrl.rollout.records import Trajectory

__all__ = ["REWARD_PLACEMENTS", "constraint_tensors", "kept_turns", "to_batch", "token_rewards"]

REWARD_PLACEMENTS = ("turn", "last")


def kept_turns(trajectory: Trajectory, length: int) -> list[tuple[int, float]]:
    """(last model token, reward) of the turns that end within ``response_ids[:length]``."""
    return [(end, reward) for end, reward in
            zip(trajectory.turn_end_positions, trajectory.turn_rewards) if end < length]


def token_rewards(trajectory: Trajectory, placement: str, length: int | None = None
                  ) -> list[float]:
    """One reward per token of ``trajectory.response_ids[:length]`` (all when ``None``), placed
    as the module docstring says; both trainers' rewards come from here. A turn whose last
    model token lies beyond ``length`` counts for nothing (verl cuts responses to its width)."""
    if placement not in REWARD_PLACEMENTS:
        raise ValueError(f"unknown reward_placement {placement!r}; "
                         f"allowed: {REWARD_PLACEMENTS}")
    length = len(trajectory.response_ids) if length is None else length
    rewards = [0.0] * length
    kept = kept_turns(trajectory, length)
    if not kept:
        return rewards
    last = kept[-1][0]
    if placement == "turn":
        for end, reward in kept:
            rewards[end] += reward
        if trajectory.score is not None:  # normalized: the last turn carries the difference
            rewards[last] += trajectory.score - trajectory.episode_return
    else:
        rewards[last] = (sum(reward for _, reward in kept) if trajectory.score is None
                         else trajectory.score)
    return rewards


def constraint_tensors(trajectories: Sequence[Trajectory], length: int
                       ) -> dict[str, torch.Tensor]:
    """``constraint_kind`` and ``constraint_ids`` (see the module docstring); empty when no
    trajectory was constrained."""
    if all(t.response_token_masks is None for t in trajectories):
        return {}
    widest = max((len(m.ids) for t in trajectories for m in t.response_token_masks or ()
                  if m is not None), default=1)
    kind = torch.full((len(trajectories), length), -1, dtype=torch.long)
    ids = torch.full((len(trajectories), length, max(1, widest)), -1, dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        for column, mask in enumerate(trajectory.response_token_masks or ()):
            if mask is not None:
                kind[row, column] = int(mask.allow)
                ids[row, column, :len(mask.ids)] = mask.index
    return {"constraint_kind": kind, "constraint_ids": ids}


def to_batch(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    reward_placement: str = "turn",
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Stack ``trajectories`` into verl-layout tensors (see the module docstring)."""
    if reward_placement not in REWARD_PLACEMENTS:
        raise ValueError(f"unknown reward_placement {reward_placement!r}; "
                         f"allowed: {REWARD_PLACEMENTS}")
    if not trajectories:
        raise ValueError("no trajectories")
    p_len = max(len(t.prompt_ids) for t in trajectories)
    r_len = max(len(t.response_ids) for t in trajectories)
    if max_prompt_length is not None:
        if p_len > max_prompt_length:
            raise ValueError(f"a prompt has {p_len} tokens > max_prompt_length={max_prompt_length}")
        p_len = max_prompt_length
    if max_response_length is not None:
        if r_len > max_response_length:
            raise ValueError(f"a response has {r_len} tokens > "
                             f"max_response_length={max_response_length}")
        r_len = max_response_length
    b = len(trajectories)
    prompts = torch.full((b, p_len), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((b, p_len), dtype=torch.long)
    responses = torch.full((b, r_len), pad_token_id, dtype=torch.long)
    response_attn = torch.zeros((b, r_len), dtype=torch.long)
    response_mask = torch.zeros((b, r_len), dtype=torch.long)
    logprobs = torch.zeros((b, r_len), dtype=torch.float32)
    rewards = torch.zeros((b, r_len), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        n_p, n_r = len(t.prompt_ids), len(t.response_ids)
        if n_p:
            prompts[i, p_len - n_p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
            prompt_attn[i, p_len - n_p:] = 1
        if n_r:
            responses[i, :n_r] = torch.tensor(t.response_ids, dtype=torch.long)
            response_attn[i, :n_r] = 1
            response_mask[i, :n_r] = torch.tensor(t.response_mask, dtype=torch.long)
            logprobs[i, :n_r] = torch.tensor(t.response_logprobs, dtype=torch.float32)
            rewards[i, :n_r] = torch.tensor(token_rewards(t, reward_placement),
                                            dtype=torch.float32)
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    constraints = constraint_tensors(trajectories, r_len)
    return {
        **constraints,
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_log_probs": logprobs,
        "token_level_rewards": rewards,
    }
