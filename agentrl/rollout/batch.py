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
  ``"turn"`` and a normalized score, every turn's reward goes through the normalizer's affine
  map (``Trajectory.score_map``: scale ``a``, shift ``b``, ``score = a * return + b``): turn
  ``k`` of ``n`` gets ``a * r_k + b / n``. The map keeps the order of the turns, and the
  episode's rewards sum to its normalized score, so normalization acts the same under both
  placements (raw and normalized units are never mixed).
- ``episode_index`` ``(B,)`` and ``group_index`` ``(B,)``: the row's trajectory (its position
  in ``trajectories``) and its group; advantages run per episode, normalization per group.

**One row per context window.** A reply must be trained on the context it was sampled from.
When older turns left the model's context (``AgentConfig.history_window``, or the context
budget; ``Turn.context_start`` records the window of each reply), a trajectory becomes one
row per window (:func:`context_samples`): a new row starts whenever the window start moves;
its prompt is the first prompt plus the kept blocks before the row's first reply (a turn that
opened a fresh chat, ``AgentConfig.context: state``: that chat alone), its response
the replies sampled from that window and the observations between them. An episode whose
context never shrank is one row, exactly the whole trajectory. Every model token is in exactly
one row, with its sampler log-prob, and the rows of an episode come in order, so advantages
can run over the whole episode (:mod:`agentrl.trainers.episodes`).

- ``constraint_kind`` ``(B, R)`` and ``constraint_ids`` ``(B, R, K)``, only when a trajectory
  was decoded under constraints (``Trajectory.response_token_masks``): per response token,
  ``1`` = only ``constraint_ids`` could be chosen, ``0`` = all but them, ``-1`` = free; ids are
  padded with ``-1`` to the largest mask ``K``. The trainer's log-prob recompute applies them
  (:func:`agentrl.trainers.policy.response_logprobs`), so it describes the distribution the
  sampler drew from.

- ``rollout_features`` ``(B, R, H)``, only when every trajectory carries
  ``Trajectory.response_features``: the engine's last hidden state before each model token
  (zeros on inserted tokens and padding), the input of a critic on the actor's backbone.
- ``step_advantages`` ``(B, R)``, only when a trajectory carries ``turn_advantages``: each
  turn's step-level advantage on its reply's model tokens (:func:`token_step_advantages`).
- ``learned_mask`` ``(B, R)``, only when a trajectory carries ``turns_left_out``: 0 on the
  replies the actor's loss leaves out, 1 elsewhere (:func:`token_learned_mask`).
- ``state_ids`` ``(B, R)`` long, only with ``state_ids=True``: on each reply's model tokens an
  id shared by the replies of one group made from the same board (``Turn.state``) at the same
  turn, -1 elsewhere and on turns without a recorded board (:func:`state_id_tensor`; the
  sibling values of :mod:`agentrl.trainers.sibling_values` read it).

A longer prompt or response than the given maximum raises (verl's padding would not truncate
either; cutting silently would drop rewards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from agentrl.rollout.records import Trajectory

__all__ = ["REWARD_PLACEMENTS", "TrainingSample", "constraint_tensors", "context_samples",
           "discounted_turn_rewards", "feature_tensor", "kept_turns", "state_id_tensor", "to_batch",
           "token_rewards", "token_step_advantages"]

REWARD_PLACEMENTS = ("turn", "last")


def kept_turns(trajectory: Trajectory, length: int) -> list[tuple[int, float]]:
    """(last model token, reward) of the turns that end within ``response_ids[:length]``
    (the rewards as :func:`token_rewards` places them under ``"turn"``)."""
    rewards = turn_rewards(trajectory)
    return [(end, reward) for end, reward in
            zip(trajectory.turn_end_positions, rewards) if end < length]


def turn_rewards(trajectory: Trajectory) -> list[float]:
    """Each turn's reward, through the normalizer's affine map when the return was normalized:
    ``a * r_k + b / n`` (see the module docstring), plus its shaping term when it has one
    (``Trajectory.turn_shaping``, never normalized: its scale is the weight's)."""
    shaping = trajectory.turn_shaping or [0.0] * len(trajectory.turn_rewards)
    if trajectory.score is None:
        return [reward + extra for reward, extra in zip(trajectory.turn_rewards, shaping)]
    scale, shift = trajectory.score_map or (1.0, trajectory.score - trajectory.episode_return)
    n = max(1, len(trajectory.turn_rewards))
    return [scale * reward + shift / n + extra
            for reward, extra in zip(trajectory.turn_rewards, shaping)]


def discounted_turn_rewards(rewards: Sequence[float], gamma: float) -> list[float]:
    """Turn rewards whose *undiscounted* tails are the per-turn discounted returns.

    With ``G_k = r_k + gamma * G_{k+1}`` (γ between turns, 1 within a reply), turn ``k`` gets
    ``G_k - G_{k+1}``: the rewards from turn ``k`` on then sum to ``G_k``. So GAE with
    ``gamma = lam = 1`` over them gives exactly the returns and advantages of GAE over turns
    with ``lam = 1`` (the local engine's ``algorithm.gamma_unit: turn``). This is how verl, whose
    GAE discounts per token and cannot be given a per-turn one, trains with a turn discount."""
    returns = [0.0] * (len(rewards) + 1)
    for k in range(len(rewards) - 1, -1, -1):
        returns[k] = rewards[k] + gamma * returns[k + 1]
    return [returns[k] - returns[k + 1] for k in range(len(rewards))]


def token_rewards(trajectory: Trajectory, placement: str, length: int | None = None,
                  turn_gamma: float = 1.0) -> list[float]:
    """One reward per token of ``trajectory.response_ids[:length]`` (all when ``None``), placed
    as the module docstring says; both trainers' rewards come from here. A turn whose last
    model token lies beyond ``length`` counts for nothing (verl cuts responses to its width).
    ``turn_gamma < 1`` reshapes the turns' rewards with :func:`discounted_turn_rewards`."""
    if placement not in REWARD_PLACEMENTS:
        raise ValueError(f"unknown reward_placement {placement!r}; "
                         f"allowed: {REWARD_PLACEMENTS}")
    length = len(trajectory.response_ids) if length is None else length
    rewards = [0.0] * length
    kept = kept_turns(trajectory, length)
    if not kept:
        return rewards
    per_turn = [reward for _, reward in kept]
    if placement == "last":
        per_turn = [0.0] * (len(kept) - 1) + [
            sum(per_turn) if trajectory.score is None else trajectory.score]
    if turn_gamma != 1.0:
        per_turn = discounted_turn_rewards(per_turn, turn_gamma)
    for (end, _), reward in zip(kept, per_turn):
        rewards[end] += reward
    return rewards


@dataclass(frozen=True)
class TrainingSample:
    """One row of the batch: the replies of ``trajectory`` sampled from one context window."""

    trajectory: Trajectory
    prompt_ids: list[int]
    """The context of the sample's first reply: the first prompt + the kept blocks before it."""
    start: int
    """The response is ``trajectory.response_ids[start:end]``."""
    end: int

    @property
    def response_ids(self) -> list[int]:
        return self.trajectory.response_ids[self.start:self.end]

    @property
    def response_mask(self) -> list[int]:
        return self.trajectory.response_mask[self.start:self.end]

    @property
    def response_logprobs(self) -> list[float]:
        return self.trajectory.response_logprobs[self.start:self.end]

    @property
    def response_token_masks(self) -> list | None:
        masks = self.trajectory.response_token_masks
        return None if masks is None else masks[self.start:self.end]

    @property
    def response_features(self) -> list | None:
        features = self.trajectory.response_features
        return None if features is None else features[self.start:self.end]

    def token_rewards(self, placement: str) -> list[float]:
        """The episode's token rewards (:func:`token_rewards`) on this sample's tokens."""
        return token_rewards(self.trajectory, placement)[self.start:self.end]

    def token_step_advantages(self) -> list[float]:
        """The episode's :func:`token_step_advantages` on this sample's tokens."""
        return token_step_advantages(self.trajectory)[self.start:self.end]

    def token_learned_mask(self) -> list[float]:
        """The episode's :func:`token_learned_mask` on this sample's tokens."""
        return token_learned_mask(self.trajectory)[self.start:self.end]


def turn_values_on_tokens(trajectory: Trajectory, per_turn: Sequence[float],
                          elsewhere: float) -> list[float]:
    """Per response token: its turn's value in ``per_turn`` on the turn's reply (times the
    token's ``response_mask``), ``elsewhere`` on every other token."""
    values = [elsewhere] * len(trajectory.response_ids)
    for end, turn, value in zip(trajectory.turn_end_positions, trajectory.turns, per_turn):
        for position in range(end + 1 - len(turn.response_ids), end + 1):
            values[position] = value * trajectory.response_mask[position]
    return values


def token_step_advantages(trajectory: Trajectory) -> list[float]:
    """Each turn's step-level advantage (``Trajectory.turn_advantages``) on its reply's model
    tokens, 0 elsewhere (and everywhere when there are none)."""
    return turn_values_on_tokens(trajectory, trajectory.turn_advantages or (), 0.0)


def token_learned_mask(trajectory: Trajectory) -> list[float]:
    """0 on the replies of the turns ``Trajectory.turns_left_out`` flags, 1 elsewhere."""
    return turn_values_on_tokens(
        trajectory, [0.0 if out else 1.0 for out in trajectory.turns_left_out or ()], 1.0)


def context_samples(trajectory: Trajectory) -> list[TrainingSample]:
    """The trajectory as one :class:`TrainingSample` per context window (module docstring).

    A row ends after its last reply (and the closing token of a cut reply); the observation
    after it opens the next row's prompt. Without ``Turn`` records, or when no turn's context
    was shortened, the one sample is the whole trajectory.
    """
    turns, ends = trajectory.turns, trajectory.turn_end_positions
    if len(turns) != len(ends) or all(turn.context_start == 0 for turn in turns):
        return [TrainingSample(trajectory, list(trajectory.prompt_ids), 0,
                               len(trajectory.response_ids))]
    windows: list[list[int]] = []  # the turns of each window, in order
    for k, turn in enumerate(turns):
        if not windows or turns[windows[-1][0]].context_start != turn.context_start:
            windows.append([])
        windows[-1].append(k)
    samples = []
    for i, window in enumerate(windows):
        first, last = turns[window[0]], turns[window[-1]]
        start = ends[window[0]] + 1 - len(first.response_ids)
        end = (len(trajectory.response_ids) if i == len(windows) - 1
               else ends[window[-1]] + 1 + int(last.truncated_by_length))
        prompt = trajectory.turn_context(window[0])
        samples.append(TrainingSample(trajectory, prompt, start, end))
    return samples


def constraint_tensors(trajectories: Sequence[Trajectory | TrainingSample], length: int
                       ) -> dict[str, torch.Tensor]:
    """``constraint_kind`` and ``constraint_ids`` of the rows (trajectories or their context
    samples; see the module docstring); empty when no row was constrained."""
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


def feature_tensor(samples: Sequence[Trajectory | TrainingSample], length: int
                   ) -> dict[str, torch.Tensor]:
    """``rollout_features`` ``(B, length, H)`` of the rows (module docstring), a new float32
    tensor (not the engine's inference tensors: the critic's update reads it); empty unless
    every row carries features."""
    rows = [s.response_features for s in samples]
    if not rows or any(row is None for row in rows):
        return {}
    width = next(f for row in rows for f in row if f is not None).shape[-1]
    out = torch.zeros((len(rows), length, width), dtype=torch.float32)
    for index, row in enumerate(rows):
        columns = [column for column, f in enumerate(row) if f is not None]
        if columns:
            out[index, columns] = torch.stack([row[c] for c in columns]).float()
    return {"rollout_features": out}


def per_token_tensor(rows: Sequence[list[float]], width: int, padding: float) -> torch.Tensor:
    """``(len(rows), width)`` float32: each row's values, then ``padding``."""
    out = torch.full((len(rows), width), padding, dtype=torch.float32)
    for row, values in enumerate(rows):
        if values:
            out[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


def state_id_tensor(samples: Sequence[TrainingSample], width: int) -> torch.Tensor:
    """``(len(samples), width)`` long: each reply's id of (group, board, turn number) on its
    model tokens, -1 elsewhere; ids count up from 0 in order of first appearance."""
    ids: dict[tuple[int, str, int], int] = {}
    rows = []
    for sample in samples:
        trajectory = sample.trajectory
        per_turn = [-1 if not turn.state else
                    ids.setdefault((trajectory.group_index, turn.state, k), len(ids))
                    for k, turn in enumerate(trajectory.turns)]
        values = turn_values_on_tokens(trajectory, per_turn, -1)
        mask = trajectory.response_mask
        rows.append([v if mask[i] else -1 for i, v in enumerate(values)][sample.start:sample.end])
    return per_token_tensor(rows, width, -1.0).long()


def to_batch(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    reward_placement: str = "turn",
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    state_ids: bool = False,
) -> dict[str, torch.Tensor]:
    """Stack ``trajectories``, one row per context window, into verl-layout tensors (see the
    module docstring); ``state_ids`` adds the ``state_ids`` tensor."""
    if reward_placement not in REWARD_PLACEMENTS:
        raise ValueError(f"unknown reward_placement {reward_placement!r}; "
                         f"allowed: {REWARD_PLACEMENTS}")
    if not trajectories:
        raise ValueError("no trajectories")
    rows = [(i, sample) for i, t in enumerate(trajectories) for sample in context_samples(t)]
    p_len = max(len(s.prompt_ids) for _, s in rows)
    r_len = max(s.end - s.start for _, s in rows)
    if max_prompt_length is not None:
        if p_len > max_prompt_length:
            raise ValueError(f"a prompt has {p_len} tokens > max_prompt_length={max_prompt_length}")
        p_len = max_prompt_length
    if max_response_length is not None:
        if r_len > max_response_length:
            raise ValueError(f"a response has {r_len} tokens > "
                             f"max_response_length={max_response_length}")
        r_len = max_response_length
    b = len(rows)
    prompts = torch.full((b, p_len), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((b, p_len), dtype=torch.long)
    responses = torch.full((b, r_len), pad_token_id, dtype=torch.long)
    response_attn = torch.zeros((b, r_len), dtype=torch.long)
    response_mask = torch.zeros((b, r_len), dtype=torch.long)
    logprobs = torch.zeros((b, r_len), dtype=torch.float32)
    rewards = torch.zeros((b, r_len), dtype=torch.float32)
    for row, (_, s) in enumerate(rows):
        n_p, n_r = len(s.prompt_ids), s.end - s.start
        if n_p:
            prompts[row, p_len - n_p:] = torch.tensor(s.prompt_ids, dtype=torch.long)
            prompt_attn[row, p_len - n_p:] = 1
        if n_r:
            responses[row, :n_r] = torch.tensor(s.response_ids, dtype=torch.long)
            response_attn[row, :n_r] = 1
            response_mask[row, :n_r] = torch.tensor(s.response_mask, dtype=torch.long)
            logprobs[row, :n_r] = torch.tensor(s.response_logprobs, dtype=torch.float32)
            rewards[row, :n_r] = torch.tensor(s.token_rewards(reward_placement),
                                              dtype=torch.float32)
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    samples = [sample for _, sample in rows]
    per_turn = {}
    if any(t.turn_advantages is not None for t in trajectories):
        per_turn["step_advantages"] = per_token_tensor(
            [s.token_step_advantages() for s in samples], r_len, 0.0)
    if any(t.turns_left_out is not None for t in trajectories):
        per_turn["learned_mask"] = per_token_tensor(
            [s.token_learned_mask() for s in samples], r_len, 1.0)
    if state_ids:
        per_turn["state_ids"] = state_id_tensor(samples, r_len)
    return {
        **per_turn,
        **constraint_tensors(samples, r_len),
        **feature_tensor(samples, r_len),
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_log_probs": logprobs,
        "token_level_rewards": rewards,
        "episode_index": torch.tensor([i for i, _ in rows], dtype=torch.long),
        "group_index": torch.tensor([trajectories[i].group_index for i, _ in rows],
                                    dtype=torch.long),
    }
