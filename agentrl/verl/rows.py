"""verl rows of one played episode: ``AgentLoopOutput`` records, one per episode (the legacy
trainer, or V1 without context windows) or one per context window (V1,
:mod:`agentrl.verl.windows`), with our per-token rewards, the episode's outcome and record, and
a constrained reply's masks (see :mod:`agentrl.verl.agent_loop`'s docstring for the rules).

Why apart from the loop: what a row holds is decided here from a finished ``Trajectory``; the
loop (:class:`~agentrl.verl.agent_loop.GameAgentLoop`) only plays the episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from agentrl.rollout import TrainingSample, Trajectory
from agentrl.rollout.batch import kept_turns, token_rewards
from agentrl.rollout.episode_record import episode_record
from agentrl.verl.constrained import MASKS_FIELD, RowMasks
from agentrl.verl.returns import TRUNCATED
from agentrl.verl.windows import window_rewards, window_samples

__all__ = ["EPISODE_INFO", "EPISODE_RECORD", "REWARD_EXTRA_KEYS", "TOKEN_REWARDS", "WINDOW",
           "GameAgentLoopOutput", "episode_output", "reward_extra_info", "window_outputs"]

TOKEN_REWARDS = "token_rewards"
"""``extra_fields`` key: one reward per response token (becomes ``rm_scores``)."""
EPISODE_INFO = "agentrl_episode"
"""``extra_fields`` key: the episode's ``EpisodeOutcome.to_dict()`` plus its row ``index``."""
EPISODE_RECORD = "agentrl_episode_record"
"""``extra_fields`` key: the episode's record (:mod:`agentrl.rollout.episode_record`); the
manager removes it from the batch."""
WINDOW = "agentrl_window"
"""``extra_fields`` key of a windowed episode's rows: ``[position, rows]``."""
REWARD_EXTRA_KEYS = ("success", "episode_return", "turns")
"""``extra_fields["reward_extra_info"]``'s keys, the same for every episode (verl stacks them)."""


class GameAgentLoopOutput(AgentLoopOutput):
    """verl's ``AgentLoopOutput`` whose ``rm_scores`` carry per-token rewards in the V1 trainer
    (``AgentLoopWorkerTQ`` stores ``as_dict()``; verl's own puts ``reward_score`` on the last
    token only)."""

    def as_dict(self) -> dict[str, Any]:
        output = super().as_dict()
        output["rm_scores"] = torch.tensor(self.extra_fields[TOKEN_REWARDS], dtype=torch.float32)
        # V1 stores extra_fields as one dict per row: the masked engine reads a field of its own
        output[MASKS_FIELD] = output["extra_fields"].pop(MASKS_FIELD, None)
        return output


def episode_output(trajectory: Trajectory, *, response_length: int, reward_placement: str,
                   with_logprobs: bool, turn_gamma: float = 1.0,
                   server_fields: Mapping[str, Any] | None = None,
                   num_preempted: int = -1, budget_exhausted: bool = False,
                   index: int | None = None, constraint_violations: int = 0
                   ) -> GameAgentLoopOutput:
    """verl's output record of one episode as one row (:mod:`agentrl.verl.agent_loop`'s
    docstring).
    ``extra_fields`` carries the episode's outcome (``EPISODE_INFO``) with its task row's
    ``index``, which :class:`GameAgentLoopManager` turns into our metrics. A constrained
    episode's token masks travel in ``extra_fields[MASKS_FIELD]``
    (:class:`~agentrl.verl.constrained.RowMasks`; None when unconstrained), for the trainer's
    masked engine.

    The response is cut after the last model token (no trailing observation, no closing token
    of a cut final reply) and to ``response_length``.
    """
    end = min(response_length, trajectory.turn_end_positions[-1] + 1)
    rewards = token_rewards(trajectory, reward_placement, end, turn_gamma=turn_gamma)
    row = TrainingSample(trajectory, list(trajectory.prompt_ids), 0, end)
    return _row_output(row, rewards, _episode_fields(
        trajectory, server_fields, budget_exhausted, index, constraint_violations),
        score=float(sum(rewards)), with_logprobs=with_logprobs, num_preempted=num_preempted)


def window_outputs(trajectory: Trajectory, *, reward_placement: str, with_logprobs: bool,
                   turn_gamma: float = 1.0, outcome: bool = False,
                   server_fields: Mapping[str, Any] | None = None,
                   num_preempted: int = -1, index: int | None = None,
                   constraint_violations: int = 0) -> list[GameAgentLoopOutput]:
    """verl's output records of one episode as one row per context window (V1 trainer,
    :mod:`agentrl.verl.windows`): each row's prompt is the context its replies were sampled
    from, and its last model token also carries the later rows' rewards. Every row carries the
    episode's outcome and record, with ``extra_fields["agentrl_window"]`` its place. With
    ``outcome`` (GRPO, and validation rows, which verl scores by their last row) the last row
    carries the whole episode's rewards instead (:func:`~agentrl.verl.windows.window_rewards`)."""
    samples = window_samples(trajectory)
    rows = window_rewards(samples, reward_placement, turn_gamma, outcome=outcome)
    fields = _episode_fields(trajectory, server_fields, False, index, constraint_violations)
    score = float(sum(map(sum, rows)) if outcome else sum(rows[0]))  # the episode's return
    return [_row_output(sample, rewards, {**fields, WINDOW: [position, len(samples)]},
                        score=score, with_logprobs=with_logprobs, num_preempted=num_preempted)
            for position, (sample, rewards) in enumerate(zip(samples, rows))]


def _episode_fields(trajectory: Trajectory, server_fields: Mapping[str, Any] | None,
                    budget_exhausted: bool, index: int | None, constraint_violations: int
                    ) -> dict[str, Any]:
    """The ``extra_fields`` every row of an episode shares."""
    outcome = trajectory.outcome()
    if budget_exhausted:  # on verl the response budget is the context that ran out
        outcome.metrics["context_exhausted"] = 1.0
    if constraint_violations:
        outcome.metrics["constraint_violations"] = float(constraint_violations)
    return {**(server_fields or {}), "tool_rewards": [],
            EPISODE_INFO: {**outcome.to_dict(), "index": index},
            TRUNCATED: bool(budget_exhausted), "reward_extra_info": reward_extra_info(outcome),
            EPISODE_RECORD: episode_record(trajectory, split="")}


def _row_output(row: TrainingSample, rewards: list[float], fields: dict[str, Any], *,
                score: float, with_logprobs: bool, num_preempted: int) -> GameAgentLoopOutput:
    """One verl row: ``row``'s tokens with ``rewards`` on them. ``score`` is the episode's
    return, as ``reward_score``: set, it keeps verl's reward loop from scoring the row (verl
    trains on and reports ``rm_scores``, which ``as_dict`` fills with ``rewards``)."""
    trajectory, masks = row.trajectory, row.response_token_masks
    return GameAgentLoopOutput(
        prompt_ids=list(row.prompt_ids),
        response_ids=list(row.response_ids),
        response_mask=list(row.response_mask),
        response_logprobs=list(row.response_logprobs) if with_logprobs else None,
        reward_score=score,
        num_turns=2 * trajectory.num_turns,  # opening + replies + observations between them
        metrics=AgentLoopMetrics(generate_sequences=trajectory.timings.get("generate_s", 0.0),
                                 tool_calls=trajectory.timings.get("env_s", 0.0),
                                 num_preempted=num_preempted),
        extra_fields={**fields, TOKEN_REWARDS: rewards,
                      "turn_scores": [reward for end, reward in kept_turns(trajectory, row.end)
                                      if end >= row.start],
                      MASKS_FIELD: RowMasks.pack(masks)},
    )


def reward_extra_info(outcome: Any) -> dict[str, float]:
    """verl's per-sample extras (:data:`REWARD_EXTRA_KEYS`): its validation reports each per data
    source (the preset) as ``val-aux/<preset>/<key>/mean@<n>``, and its dumps carry them."""
    return {"success": float(outcome.success), "episode_return": float(outcome.episode_return),
            "turns": float(outcome.num_turns)}
