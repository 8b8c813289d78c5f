"""Typed records of the rollout layer: one :class:`Turn` per model reply, one :class:`Trajectory`
per episode, and its :class:`EpisodeOutcome` (what metrics read; small enough to travel between
processes, as it does on verl).

A trajectory is one token sequence, exactly as the model saw and produced it::

    prompt_ids | response_ids
    first chat | reply 1, observation 1 (+ next generation prompt), reply 2, ..., reply N

``response_mask`` is 1 on the model's own tokens and 0 on everything the rollout inserted
(observations, generation prompts, and the end-of-turn token closing a reply that was cut by the
length limit). ``response_logprobs`` are the sampler's log-probs on model tokens and 0.0 elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Turn:
    """One model reply and what it did."""

    prompt_ids: tuple[int, ...]
    """Ids appended before this turn's generation: the first prompt on turn 1, afterwards the
    chat-template suffix of the last observation (ending with the generation prompt)."""
    response_ids: tuple[int, ...]
    """The ids the model generated (as returned by ``llm.generate``; nothing added)."""
    logprobs: tuple[float, ...]
    """One per response id."""
    reward: float
    """``TurnResult.reward`` (the format penalty for a malformed reply)."""
    format_ok: bool
    num_actions: int
    num_valid: int
    num_effective: int
    truncated_by_length: bool
    """The reply hit ``max_new_tokens`` without an end-of-turn token; the rollout closed it by
    appending the end-of-turn token with mask 0."""
    text: str = ""
    """The decoded reply handed to ``Agent.step``."""
    context_start: int = 0
    """The model saw ``prompt_ids + response_ids[context_start:]`` (of the trajectory) for this
    reply: > 0 when older turns were dropped from its context (see the rollout's rules)."""
    fresh_context: bool = False
    """The model saw ``response_ids[context_start:]`` alone, without the first prompt: this
    turn opened a fresh chat (``AgentConfig.context: state``), whose ids ``prompt_ids`` holds."""
    token_masks: tuple[Any, ...] | None = None
    """Constrained decoding: per response id, the engine's ``TokenMask`` (the tokens it could
    choose from); None when the reply was free."""
    observation: str = ""
    """The user message this reply answered (turn 1: instructions and the first state; then the
    feedback and the new state): what episode records show as the board."""
    state: str = ""
    """The game's own observation this reply acted on (the board, without the turn's counters
    and feedback): equal states recur across a group's episodes, where step-level advantages
    compare the replies made in them (:func:`agentrl.rollout.groups.step_advantages`)."""
    actions: tuple[str, ...] = ()
    """The actions run in the game this turn, in order."""
    action_valid: tuple[bool, ...] = ()
    """One flag per entry of ``actions``: the game accepted it."""
    format_progress: float = 1.0
    """How far the reply got toward the answer format (1 when well-formed; the share of the
    format's tags written, in order, when not: :func:`agentrl.agents.parsing.format_progress`)."""


def turn_counts(turns: list[Turn]) -> dict[str, float]:
    """An episode's action, format and length-cut counts from its turns (the part of
    ``Trajectory.metrics`` every way of playing an episode shares)."""
    return {
        "num_actions": float(sum(t.num_actions for t in turns)),
        "num_valid": float(sum(t.num_valid for t in turns)),
        "num_effective": float(sum(t.num_effective for t in turns)),
        "format_errors": float(sum(not t.format_ok for t in turns)),
        "format_progress": float(sum(t.format_progress for t in turns)),
        "truncated_turns": float(sum(t.truncated_by_length for t in turns)),
    }


@dataclass(frozen=True)
class Trajectory:
    """One episode as one token sequence plus its per-turn bookkeeping."""

    preset: str
    seed: int
    group_index: int
    prompt_ids: list[int]
    """The first prompt (chat template of the opening messages + generation prompt)."""
    response_ids: list[int]
    """Everything after the first prompt, in order: model tokens and observation tokens."""
    response_mask: list[int]
    """1 on model tokens only."""
    response_logprobs: list[float]
    """Sampler log-probs on model tokens, 0.0 on inserted tokens."""
    turn_end_positions: list[int]
    """Index in ``response_ids`` of each turn's last model token (mask 1)."""
    turn_rewards: list[float]
    success: bool
    episode_return: float
    """Sum of the turn rewards (format penalties included)."""
    num_turns: int
    turns: list[Turn] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-episode counts: ``num_actions``, ``num_valid``, ``num_effective``, ``format_errors``,
    ``format_progress`` (summed over turns),
    ``truncated_turns``, ``dropped_turns`` (turns left out of the context), ``context_truncated``
    (0/1: any turn was), ``context_exhausted`` (0/1: the episode ended for lack of context),
    ``response_length`` (model tokens)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds this episode spent in ``generate_s``, ``env_s``, ``tokenize_s``."""
    response_token_masks: list[Any] | None = None
    """Constrained decoding: per response id, the ``TokenMask`` the engine sampled it under
    (None on free and inserted tokens); None when no token was constrained. ``to_batch``
    turns them into the trainer's ``constraint_*`` tensors."""
    response_features: list[Any] | None = None
    """Per response id, the engine's last hidden state before it (a 1-D tensor; None on
    inserted tokens), when the rollout asked for them (``SamplingParams.return_features``);
    ``to_batch`` stacks them into ``rollout_features``."""
    score: float | None = None
    """The normalized episode return (see :func:`agentrl.rollout.groups.normalize_returns`);
    None until normalized. ``to_batch(reward_placement="last")`` uses it when set."""
    turn_advantages: list[float] | None = None
    """One step-level advantage per turn (:func:`agentrl.rollout.groups.step_advantages`);
    ``to_batch`` puts each on its reply's tokens (``step_advantages``). None: not computed."""
    goal_distances: list[int | None] | None = None
    """The oracle's remaining actions before the first turn and after each turn (one more than
    the turns; None where it had no plan), when the rollout asked for them. None: not recorded."""
    turns_left_out: list[bool] | None = None
    """Per turn, whether the actor's loss leaves its reply out (:func:`agentrl.rollout.groups.
    leave_out_after_missed_moves`); its tokens stay in the context and in the critic's and the
    advantages' masks. None: every reply learns."""
    turn_shaping: list[float] | None = None
    """One shaping term per turn (:func:`agentrl.rollout.groups.distance_shaping`), added to
    the turn's reward in training only: returns and metrics never include it."""
    score_map: tuple[float, float] | None = None
    """The normalizer's affine map ``(scale, shift)``: ``score = scale * episode_return +
    shift`` (scale 0 where the score is a constant: a clipped score, or a group without
    spread). ``to_batch(reward_placement="turn")`` maps every turn's reward with it."""
    turn_branches: list[list["Trajectory"]] | None = None
    """Per turn, the replies sampled at its context as one-turn trajectories, the executed
    reply first (``run_episode(branches=K)``: K more, each played on a copy of the game); the
    trainer compares them in a group per turn (:func:`agentrl.rollout.groups.turn_samples`).
    None: not sampled."""

    def __post_init__(self):
        n = len(self.response_ids)
        if not (len(self.response_mask) == len(self.response_logprobs) == n):
            raise ValueError(f"response ids/mask/logprobs lengths differ: {n}, "
                             f"{len(self.response_mask)}, {len(self.response_logprobs)}")
        if self.response_token_masks is not None and len(self.response_token_masks) != n:
            raise ValueError(f"{len(self.response_token_masks)} token masks for {n} response ids")
        if self.response_features is not None and len(self.response_features) != n:
            raise ValueError(f"{len(self.response_features)} features for {n} response ids")
        if len(self.turn_end_positions) != len(self.turn_rewards):
            raise ValueError("one turn end position per turn reward")
        if self.turn_advantages is not None and len(self.turn_advantages) != len(self.turn_rewards):
            raise ValueError("one turn advantage per turn reward")
        if self.turns_left_out is not None and len(self.turns_left_out) != len(self.turn_rewards):
            raise ValueError("one left-out flag per turn reward")
        if self.turn_shaping is not None and len(self.turn_shaping) != len(self.turn_rewards):
            raise ValueError("one shaping term per turn reward")
        if (self.goal_distances is not None
                and len(self.goal_distances) != len(self.turn_rewards) + 1):
            raise ValueError("one goal distance before the first turn and one after each turn")

    @property
    def input_ids(self) -> list[int]:
        return list(self.prompt_ids) + list(self.response_ids)

    def turn_context(self, k: int) -> list[int]:
        """The ids turn ``k``'s reply was sampled from: ``prompt_ids +
        response_ids[context_start:reply]``, or without ``prompt_ids`` for a turn that opened a
        fresh chat (``Turn.fresh_context``)."""
        turn = self.turns[k]
        reply = self.turn_end_positions[k] + 1 - len(turn.response_ids)
        opening = [] if turn.fresh_context else list(self.prompt_ids)
        return opening + list(self.response_ids[turn.context_start:reply])

    def outcome(self) -> EpisodeOutcome:
        return EpisodeOutcome(self.preset, self.seed, self.success, self.episode_return,
                              self.num_turns, dict(self.metrics), dict(self.timings))


@dataclass(frozen=True)
class EpisodeOutcome:
    """How an episode went, without its tokens: everything
    :func:`agentrl.rollout.metrics.rollout_metrics` reads. A :class:`Trajectory` has the same
    fields; this record is what crosses a process boundary (verl's ``extra_fields``) as a plain
    dict (:meth:`to_dict` / :meth:`from_dict`)."""

    preset: str
    seed: int
    success: bool
    episode_return: float
    num_turns: int
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> EpisodeOutcome:
        """The outcome :meth:`to_dict` wrote; a missing or ill-typed field raises ValueError
        naming it."""
        if not isinstance(record, Mapping):
            raise ValueError(  # noqa: TRY004 - bad record data, like the checks below
                f"an episode outcome must be a mapping, got {type(record).__name__}")
        missing = [name for name in cls.__dataclass_fields__ if name not in record]
        if missing:
            raise ValueError(f"episode outcome lacks {missing}")
        try:
            return cls(str(record["preset"]), int(record["seed"]), bool(record["success"]),
                       _number(record["episode_return"]), int(record["num_turns"]),
                       {str(k): _number(v) for k, v in dict(record["metrics"]).items()},
                       {str(k): _number(v) for k, v in dict(record["timings"]).items()})
        except (TypeError, ValueError) as error:
            raise ValueError(f"episode outcome {dict(record)!r:.200}: {error}") from None


def _number(value: Any) -> float:
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"not a number: {value!r}")
    return number
