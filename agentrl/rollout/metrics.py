"""Rollout metrics by preset, with the same names on every engine.

    metrics = rollout_metrics(trajectories, split="train")
    # {"train/simpleSokobanAgent/success": 0.25, ..., "timing/generate_s": 1.3}

Per preset (means over that preset's episodes unless said otherwise):

- ``episodes`` (count: with ``success`` it gives the rate's confidence interval, see
  :mod:`agentrl.evaluation.stats`), ``success`` (rate), ``return`` (episode return, format penalties included), ``turns``,
  ``num_actions`` (actions run per episode), ``response_length`` (model tokens per episode),
  ``truncated_turns`` (replies cut by the length limit, per episode), ``dropped_turns`` (turns
  left out of the context by the budget or the history window, per episode),
  ``context_truncated`` (rate of episodes that dropped any), ``context_exhausted`` (rate of
  episodes ended because even the newest turn no longer fit).
- ``action_is_valid`` / ``action_is_effective``: valid / effective actions over all actions run
  by the preset (0 when none ran); ``format_error``: malformed replies over all replies;
  ``format_progress``: the mean over replies of how far each got toward the format (1 when
  well-formed; the share of its tags written when not).

Timings: ``timing/generate_s``, ``timing/env_s``, ``timing/tokenize_s`` are the mean seconds one
episode spent in each. Episodes run concurrently, so these are per-episode latencies, not shares
of the wall clock (a sum would count overlapping waits many times).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from agentrl.rollout.groups import group_trajectories
from agentrl.rollout.records import EpisodeOutcome, Trajectory

__all__ = ["TIMING_KEYS", "branch_metrics", "rollout_metrics"]

TIMING_KEYS = ("generate_s", "env_s", "tokenize_s")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def rollout_metrics(trajectories: Sequence[Trajectory | EpisodeOutcome], split: str = "train"
                    ) -> dict[str, float]:
    """``<split>/<preset>/<name>`` for every preset present, plus ``timing/*``, from
    trajectories or their outcomes (verl's workers send outcomes)."""
    by_preset: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_preset[t.preset].append(t)
    out: dict[str, float] = {}
    for preset, ts in by_preset.items():
        p = f"{split}/{preset}"
        m = lambda key: [t.metrics.get(key, 0.0) for t in ts]  # noqa: E731
        actions = sum(m("num_actions"))
        turns = sum(t.num_turns for t in ts)
        out.update({
            f"{p}/episodes": float(len(ts)),
            f"{p}/success": _mean([float(t.success) for t in ts]),
            f"{p}/return": _mean([t.episode_return for t in ts]),
            f"{p}/turns": _mean([float(t.num_turns) for t in ts]),
            f"{p}/num_actions": _mean(m("num_actions")),
            f"{p}/action_is_valid": _ratio(sum(m("num_valid")), actions),
            f"{p}/action_is_effective": _ratio(sum(m("num_effective")), actions),
            f"{p}/format_error": _ratio(sum(m("format_errors")), turns),
            f"{p}/format_progress": _ratio(sum(m("format_progress")), turns),
            f"{p}/response_length": _mean(m("response_length")),
            f"{p}/truncated_turns": _mean(m("truncated_turns")),
            f"{p}/dropped_turns": _mean(m("dropped_turns")),
            f"{p}/context_truncated": _mean(m("context_truncated")),
            f"{p}/context_exhausted": _mean(m("context_exhausted")),
        })
    for key in TIMING_KEYS:
        out[f"timing/{key}"] = _mean([t.timings.get(key, 0.0) for t in trajectories])
    return out


def branch_metrics(samples: Sequence[Trajectory]) -> dict[str, float]:
    """Of the turn groups of :func:`agentrl.rollout.groups.turn_samples`: ``branch/turns``
    (groups), ``branch/distinct_replies`` (different reply texts a turn, mean) and
    ``branch/spread`` (share of turns whose replies did not all earn the same: a reward or,
    where recorded, a distance to the goal after them)."""
    groups = {key: [samples[i] for i in idx]
              for key, idx in group_trajectories(samples).items()}

    def outcome(t: Trajectory) -> tuple:
        return (t.episode_return, (t.goal_distances or [None])[-1])

    return {
        "branch/turns": float(len(groups)),
        "branch/distinct_replies": _mean([float(len({t.turns[0].text for t in g}))
                                          for g in groups.values()]),
        "branch/spread": _mean([float(len({outcome(t) for t in g}) > 1)
                                for g in groups.values()]),
    }
