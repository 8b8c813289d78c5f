"""The rollout layer: episodes (token-in/token-out), agent groups, the batch layout, metrics.

- :mod:`agentrl.rollout.records`: ``Turn``, ``Trajectory``, ``EpisodeOutcome``.
- :mod:`agentrl.rollout.episode`: ``run_episode`` and ``ChatSuffix`` (chat-template suffix ids).
- :mod:`agentrl.rollout.groups`: ``run_groups``, ``filter_groups``, ``drop_uniform_groups``,
  ``step_advantages``, ``distance_shaping``, ``leave_out_after_missed_moves``,
  ``lost_group_rows``, ``normalize_returns``, ``turn_samples``, ``trajectory_groups``,
  ``uniform_group_metrics``.
- :mod:`agentrl.rollout.batch`: ``to_batch`` (verl's tensor layout, one row per context window:
  ``context_samples``).
- :mod:`agentrl.rollout.metrics`: ``rollout_metrics`` (``<split>/<preset>/...``, ``timing/...``),
  ``branch_metrics``.
"""

from agentrl.rollout.batch import REWARD_PLACEMENTS, TrainingSample, context_samples, to_batch
from agentrl.rollout.episode import LLM, ChatSuffix, first_prompt_ids, run_episode
from agentrl.rollout.groups import (
    distance_shaping,
    drop_uniform_groups,
    filter_groups,
    group_trajectories,
    leave_out_after_missed_moves,
    lost_group_rows,
    normalize_returns,
    normalize_scores,
    run_groups,
    step_advantages,
    trajectory_groups,
    turn_samples,
    uniform_group_metrics,
)
from agentrl.rollout.metrics import branch_metrics, rollout_metrics
from agentrl.rollout.records import EpisodeOutcome, Trajectory, Turn

__all__ = [
    "LLM", "REWARD_PLACEMENTS", "ChatSuffix", "branch_metrics", "EpisodeOutcome", "TrainingSample", "Trajectory",
    "Turn", "context_samples", "distance_shaping", "drop_uniform_groups", "filter_groups",
    "first_prompt_ids", "group_trajectories", "leave_out_after_missed_moves", "lost_group_rows",
    "normalize_returns", "normalize_scores", "rollout_metrics", "run_episode", "run_groups",
    "step_advantages", "to_batch", "trajectory_groups", "turn_samples", "uniform_group_metrics",
]
