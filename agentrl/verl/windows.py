"""An episode as verl rows, one per context window (``verl.trainer=v1``).

Why: a reply must be trained on the context it was sampled from. When older turns leave the
model's context (``AgentConfig.history_window``, or the context cap), the local engine trains
one row per window (:func:`agentrl.rollout.batch.context_samples`) and runs GAE over the
episode's rows together. verl's V1 trainer takes the rows an AgentLoop returns
(``list[AgentLoopOutput]``, one row each) but runs GAE on every row alone. So each row's last
model token also carries the sum of the later rows' rewards: the return-to-go of every model
token is then the whole episode's, and per-row GAE at γ = λ = 1 gives the whole-episode
returns. What verl cannot express: λ < 1 across windows (a row's GAE never sees the next
row's values), a per-token γ < 1 (the later rewards would be discounted by the tokens
between rows) and a KL penalty in the reward (subtracted per token inside each row, so the
later rows' never reach an earlier one); the rules refuse all three
(:mod:`agentrl.config.verl_rules`). A turn discount
(``algorithm.gamma_unit: turn``) is exact: it is carried by the reshaped turn rewards. GRPO is
scored on an episode's last row and its advantage given to every row (verl's
``compute_advantage_for_multi_trajectories``), so there the last row carries the whole
episode's rewards.

Every row fits verl's tensors by construction (:func:`windowed_context_tokens`).
"""

from __future__ import annotations

from agentrl.rollout import Trajectory
from agentrl.rollout.batch import TrainingSample, context_samples, token_rewards

__all__ = ["window_rewards", "window_samples", "windowed_context_tokens"]


def window_samples(trajectory: Trajectory) -> list[TrainingSample]:
    """The episode's context windows in order, each cut after its last model token (as a
    single-row episode is): never ending on an observation or on the mask-0 closing token of a
    cut reply, which the next window's prompt holds, and which would make a row one token
    longer than the context cap allows for."""
    mask = trajectory.response_mask
    rows = []
    for sample in context_samples(trajectory):
        end = max(i for i in range(sample.start, sample.end) if mask[i]) + 1
        rows.append(TrainingSample(trajectory, sample.prompt_ids, sample.start, end))
    return rows


def window_rewards(samples: list[TrainingSample], placement: str, turn_gamma: float = 1.0,
                   *, outcome: bool = False) -> list[list[float]]:
    """Each row's token rewards: the episode's (:func:`token_rewards`) on its tokens, plus the
    sum of all later rows' rewards on its last model token (module docstring). ``outcome``
    (GRPO): verl's V1 scores an episode by its last row alone and gives every row that row's
    advantage, so the last row's last model token carries the whole episode's rewards and the
    earlier rows none."""
    trajectory = samples[0].trajectory
    episode = token_rewards(trajectory, placement, samples[-1].end, turn_gamma=turn_gamma)
    rows = [episode[sample.start:sample.end] for sample in samples]
    if outcome:
        total = sum(episode[samples[0].start:samples[-1].end])
        rows = [[0.0] * len(rewards) for rewards in rows]
        _add_on_last_model_token(samples[-1], rows[-1], total)
        return rows
    later = 0.0  # the rewards of the rows after this one
    for sample, rewards in zip(reversed(samples), reversed(rows)):
        own = sum(rewards)
        _add_on_last_model_token(sample, rewards, later)
        later += own
    return rows


def _add_on_last_model_token(sample: TrainingSample, rewards: list[float], value: float) -> None:
    model = [i for i, kept in enumerate(sample.response_mask) if kept]
    if model:
        rewards[model[-1]] += value


def windowed_context_tokens(first_prompt: int, max_context_tokens: int, prompt_length: int,
                            response_length: int, max_new_tokens: int) -> int:
    """The context cap of a windowed episode inside verl. A turn's context plus its reply fits
    the cap, so a row's prompt (the context of its first reply) fits ``prompt_length``, and a
    row's response (its context's growth over the window, then its last reply) fits
    ``response_length``: ``min(max_context_tokens, prompt_length + max_new_tokens,
    first_prompt + response_length)``."""
    return min(max_context_tokens, prompt_length + max_new_tokens, first_prompt + response_length)
