"""Agent groups: ``group_num x group_size`` concurrent episodes, then filtering and normalization.

    trajectories = await run_groups([("simpleSokobanAgent", config)], llm, tokenizer, sampling,
                                    group_num=8, group_size=4, seeds=range(8),
                                    max_context_tokens=4096)
    kept = filter_groups(trajectories, filter_ratio=0.5, mode="std")
    kept = normalize_returns(kept, grouping="state", method="mean_std")

- Group ``g`` plays preset ``presets[g % len(presets)]`` on game ``seeds[g]``; its
  ``group_size`` episodes share that seed. Envs are deterministic in the seed, so every member
  gets the same game. That is also how the game is *generated once per group*: all envs of the
  repo build their game from ``reset(seed)``, and TextWorld's compiled games are cached on disk
  per (parameters, seed) by :mod:`agentrl.envs.textworld_pool`. Resets are synchronous and run
  in gather order before any episode awaits, so the first member compiles the game and the others
  load it. (No ``copy.deepcopy`` of env state: a seed is cheaper and works for every game.)
- All episodes run at once with one ``asyncio.gather``; there is no per-turn barrier, so an
  episode that finishes early frees its slot in the LLM's batch at once.

Filtering (:func:`filter_groups`): rank groups by the standard deviation of their members'
episode returns and keep the top ``ceil(filter_ratio * num_groups)`` (at least 1): ``mode="std"``
keeps the highest std (the most informative groups: some members did better than others),
``"std_rev"`` the lowest. Ties keep the earlier group. ``filter_ratio=1`` keeps everything.
:func:`drop_uniform_groups` then drops every group whose members got the same return.

Step-level advantages (:func:`step_advantages`, GiGPO's anchor states): a group replays one
game, so its episodes meet the same board again and again; the turns taken from one board are
compared by their returns-to-go (``mean_std`` within that board's turns), which credits the
reply that differed rather than the whole episode.

Groups no episode won (:func:`lost_group_rows`): the batch rows a push on the advantages
(``algorithm.lost_group_advantage``) lands on, so a game every episode lost still teaches
"not this" when the values know the game and give its episodes no advantage.

Distance shaping (:func:`distance_shaping`): where a game's oracle can say how many actions
the goal still is, each turn earns the distance it closed (potential-based shaping), so a
turn's credit need not wait for the episode's end.

Turns after a missed move (:func:`leave_out_after_missed_moves`): a context that shows the
previous move tells the policy what it just did. In BlocksWorld the best reply after a missed
move nearly always moves the same block again (often back), a reply a shortest plan never
makes after a good move; the actor's loss can leave those turns out, so that their credit
does not teach "move what you just moved" in contexts the policy cannot tell apart from its
good moves (measured on three training seeds: no gain, docs/results/learning.md).

Normalization (:func:`normalize_returns`) of episode returns into ``Trajectory.score``:
``grouping="state"`` normalizes within each group (same preset and seed), ``"batch"`` over all
trajectories; ``method`` is ``identity`` (score = return), ``mean_std`` ((r - mean) / (std +
1e-6), all zeros when std < 1e-6, std unbiased as ``torch.std``) or ``asym_clip`` (mean_std
clipped to [-1, 3], as RAGEN). Each trajectory also gets the map as ``score_map = (scale,
shift)`` with ``score = scale * return + shift`` (mean_std: ``1 / (std + 1e-6)`` and
``-mean * scale``; a clipped or constant score: scale 0), which ``to_batch`` applies to every
turn's reward under ``reward_placement: turn``. The format penalty is applied *before* normalization: it is already
in the episode return, because ``Agent.step`` gives a malformed reply ``Agent.format_penalty`` as its
turn reward (raised by its ``format_progress`` under ``format_credit``), so a malformed reply lowers
its episode's score relative to its group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import defaultdict
from typing import Any, Awaitable, Callable, Iterable, Literal, Mapping, Sequence

import torch

from agentrl.agents import Agent, AgentConfig
from agentrl.rollout.episode import ChatSuffix, run_episode
from agentrl.rollout.records import EpisodeOutcome, Trajectory

__all__ = ["distance_shaping", "drop_uniform_groups", "filter_groups", "group_trajectories",
           "leave_out_after_missed_moves", "lost_group_rows", "missed_move_turns",
           "normalize_returns", "run_groups", "step_advantages", "trajectory_groups",
           "turn_samples", "uniform_group_metrics"]

FILTER_MODES = ("std", "std_rev")
GROUPINGS = ("state", "batch")
METHODS = ("identity", "mean_std", "asym_clip")
ASYM_CLIP = (-1.0, 3.0)
EPS = 1e-6


async def run_groups(
    presets: Mapping[str, AgentConfig] | Sequence[tuple[str, AgentConfig]],
    llm: Any,
    tokenizer: Any,
    sampling: Any,
    *,
    group_num: int,
    group_size: int,
    seeds: Iterable[int] | None = None,
    max_context_tokens: int,
    on_episode_done: Callable[[Trajectory], None] | None = None,
    goal_distances: bool = False,
    branches: int = 0,
) -> list[Trajectory]:
    """Run every episode of every group concurrently; trajectories in group order.

    ``seeds`` gives one seed per group (default ``0..group_num-1``). ``on_episode_done`` is
    called with each trajectory as its episode ends (for progress bars), in completion order.
    ``goal_distances`` records the oracle's distance to the goal at every turn
    (``run_episode``'s argument), for :func:`distance_shaping`; ``branches`` samples that many
    more replies at every turn (``run_episode``'s argument), for :func:`turn_samples`.
    """
    pairs = list(presets.items()) if isinstance(presets, Mapping) else list(presets)
    if not pairs:
        raise ValueError("no presets given")
    if group_num < 1 or group_size < 1:
        raise ValueError(f"group_num and group_size must be >= 1, got {group_num}, {group_size}")
    seeds = list(range(group_num)) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != group_num:
        raise ValueError(f"{len(seeds)} seeds for {group_num} groups: give one seed per group")
    suffix = ChatSuffix(tokenizer)
    agents: list[Agent] = []
    jobs = []
    for g, seed in enumerate(seeds):
        name, config = pairs[g % len(pairs)]
        for _ in range(group_size):
            agent = Agent(config)
            agents.append(agent)
            jobs.append(run_episode(agent, seed, llm, tokenizer, sampling,
                                    max_context_tokens=max_context_tokens, group_index=g,
                                    preset=name, suffix=suffix,
                                    goal_distances=goal_distances, branches=branches))
    if on_episode_done is not None:
        jobs = [_reporting(job, on_episode_done) for job in jobs]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        for agent in agents:
            agent.close()


async def _reporting(job: Awaitable[Trajectory], report: Callable[[Trajectory], None]) -> Trajectory:
    trajectory = await job
    report(trajectory)
    return trajectory


def group_trajectories(trajectories: Sequence[Trajectory]) -> dict[tuple, list[int]]:
    """Indices of ``trajectories`` by group key ``(group_index, preset, seed)``, in first-seen order."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[(t.group_index, t.preset, t.seed)].append(i)
    return dict(groups)


def trajectory_groups(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """``trajectories`` in their groups (:func:`group_trajectories`), in first-seen order."""
    return [[trajectories[i] for i in idx] for idx in group_trajectories(trajectories).values()]


def turn_samples(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """Every turn's sampled replies (``Trajectory.turn_branches``) as one-turn trajectories, a
    group of their own per turn: replies to one context, compared with each other rather than
    whole episodes that a near-greedy policy plays alike. Group indices are renumbered so no
    two turns share one; a trajectory without branches raises."""
    missing = [t for t in trajectories if t.turn_branches is None]
    if missing:
        raise ValueError(f"episode {missing[0].preset}/{missing[0].seed} has no turn "
                         "branches: run the rollout with branches > 0")
    turns = [samples for t in trajectories for samples in t.turn_branches]
    return [dataclasses.replace(sample, group_index=index)
            for index, samples in enumerate(turns) for sample in samples]


def _std(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).std()) if len(values) > 1 else 0.0


def filter_groups(trajectories: Sequence[Trajectory], filter_ratio: float = 1.0,
                  mode: str = "std") -> list[Trajectory]:
    """Keep the groups with the highest (``std``) or lowest (``std_rev``) return std."""
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; allowed: {FILTER_MODES}")
    if not 0 < filter_ratio <= 1:
        raise ValueError(f"filter_ratio must be in (0, 1], got {filter_ratio}")
    groups = list(group_trajectories(trajectories).values())
    stds = [_std([trajectories[i].episode_return for i in idx]) for idx in groups]
    keep = max(1, math.ceil(filter_ratio * len(groups) - 1e-9))
    sign = -1.0 if mode == "std" else 1.0
    order = sorted(range(len(groups)), key=lambda g: (sign * stds[g], g))[:keep]
    kept = sorted(order)
    return [trajectories[i] for g in kept for i in groups[g]]


def drop_uniform_groups(trajectories: Sequence[Trajectory],
                        outcome: Literal["any", "won", "lost"] = "any") -> list[Trajectory]:
    """The groups whose members' returns differ (with their shaping terms, when
    :func:`distance_shaping` ran first); may be none. A group that all won or all lost alike
    compares nothing, and a near-greedy policy replays one episode ``group_size`` times: its
    update would follow only the critic's error, at the full cost of a forward and backward
    pass (DAPO's dynamic sampling, without resampling). ``outcome`` ``won`` (``lost``) drops
    only the uniform groups that all won (did not all win), to tell which kind's update a
    policy gains from."""
    if outcome not in ("any", "won", "lost"):
        raise ValueError(f"outcome={outcome!r}; allowed: 'any', 'won', 'lost'")

    def dropped(group: Sequence[Trajectory]) -> bool:
        return _is_uniform(group) and (outcome == "any" or _all_won(group) == (outcome == "won"))

    return [member for group in trajectory_groups(trajectories) if not dropped(group)
            for member in group]


def uniform_group_metrics(groups: Iterable[Sequence[Trajectory | EpisodeOutcome]]
                          ) -> dict[str, float]:
    """``train/uniform_groups``: the share of ``groups`` whose members' returns do not differ
    (0 for no groups; empty groups are not counted), what :func:`drop_uniform_groups` would
    leave out; and ``train/uniform_groups_won``: the share whose members all won with the same
    return. GRPO gives such a group no advantage (undiscounted: under ``gamma_unit: turn`` with
    gamma < 1, equal returns reached in different turn counts still differ); GAE its returns
    against the critic's values. A share near 1 means a step compares almost nothing within its
    games (groups of 8 at under ~8% or over ~92% success a game). Members are trajectories
    (local) or episode outcomes (verl: a group is a task row's episodes)."""
    groups = [list(group) for group in groups if group]
    uniform = [group for group in groups if _is_uniform(group)]
    won = [group for group in uniform if _all_won(group)]
    count = max(1, len(groups))
    return {"train/uniform_groups": len(uniform) / count,
            "train/uniform_groups_won": len(won) / count}


def lost_group_rows(group_index: torch.Tensor, trajectories: Sequence[Trajectory]
                    ) -> torch.Tensor:
    """``(B,)`` bool: whether each batch row's ``group_index`` is one no episode of
    ``trajectories`` with that index won (``algorithm.lost_group_advantage``). Keyed on the
    index alone, as the batch is: a step's groups are numbered apart (:func:`run_groups`)."""
    won = {t.group_index for t in trajectories if t.success}
    lost = sorted({t.group_index for t in trajectories} - won)
    return torch.isin(group_index, torch.tensor(lost, dtype=group_index.dtype))


def _is_uniform(group: Sequence[Trajectory | EpisodeOutcome]) -> bool:
    """Whether the group's members got the same training return."""
    return _std([_training_return(member) for member in group]) <= EPS


def _all_won(group: Sequence[Trajectory | EpisodeOutcome]) -> bool:
    """Whether every member of the group won."""
    return all(member.success for member in group)


def _training_return(episode: Trajectory | EpisodeOutcome) -> float:
    """The return training sees: the episode's, plus its shaping terms when shaped (an
    outcome has none: verl does not shape)."""
    return episode.episode_return + sum(getattr(episode, "turn_shaping", None) or ())


def step_advantages(trajectories: Sequence[Trajectory], gamma: float = 1.0
                    ) -> list[Trajectory]:
    """Copies of ``trajectories`` with ``turn_advantages``: each turn's return-to-go (turn
    rewards from it on, discounted by ``gamma`` a turn) normalized (``mean_std``) among the
    turns of its group taken from the same board (``Turn.state``). A board met once, or whose
    turns all did equally well, gives 0; so does a turn without a recorded board."""
    out = list(trajectories)
    for idx in group_trajectories(trajectories).values():
        anchors: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
        for i in idx:
            trajectory, to_go = trajectories[i], 0.0
            for k in reversed(range(len(trajectory.turn_rewards))):
                to_go = trajectory.turn_rewards[k] + gamma * to_go
                state = trajectory.turns[k].state if k < len(trajectory.turns) else ""
                if state:
                    anchors[state].append((i, k, to_go))
        values = {i: [0.0] * len(trajectories[i].turn_rewards) for i in idx}
        for members in anchors.values():
            returns = torch.tensor([g for _, _, g in members], dtype=torch.float64)
            for (i, k, _), a in zip(members, normalize_scores(returns, "mean_std").tolist()):
                values[i][k] = a
        for i in idx:
            out[i] = dataclasses.replace(trajectories[i], turn_advantages=values[i])
    return out


def distance_shaping(trajectories: Sequence[Trajectory], weight: float, gamma: float = 1.0
                     ) -> list[Trajectory]:
    """Copies of ``trajectories`` with ``turn_shaping``: ``weight * (d_k - gamma * d_{k+1})``
    for the turn from oracle distance ``d_k`` to ``d_{k+1}`` (``Trajectory.goal_distances``).

    This is potential-based shaping with the potential ``-weight * distance`` (Ng, Harada and
    Russell, 1999): every turn learns at once whether it brought the goal nearer, yet an
    episode's shaped return differs from its own only by ``weight * (d_0 - gamma^T d_T)``, so
    the best policy stays the best. A turn next to an unknown distance gets 0; a trajectory
    without recorded distances raises (the rollout must ask for them)."""
    out = []
    for trajectory in trajectories:
        distances = trajectory.goal_distances
        if distances is None:
            raise ValueError(f"episode {trajectory.preset}/{trajectory.seed} has no goal "
                             "distances: run the rollout with goal_distances=True")
        shaping = [0.0 if before is None or after is None
                   else weight * (before - gamma * after)
                   for before, after in zip(distances, distances[1:])]
        out.append(dataclasses.replace(trajectory, turn_shaping=shaping))
    return out


def missed_move_turns(goal_distances: Sequence[int | None]) -> list[bool]:
    """Per turn, whether the turn before it missed: it did not bring a known oracle distance
    nearer (``goal_distances`` as ``Trajectory.goal_distances``: one before the first turn and
    one after each). The first turn follows no move: False."""
    steps = list(zip(goal_distances, goal_distances[1:]))
    return [False] + [before is None or after is None or after >= before
                      for before, after in steps[:-1]]


def leave_out_after_missed_moves(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """Copies of ``trajectories`` whose ``turns_left_out`` flag every turn that follows a
    missed move (:func:`missed_move_turns`); a trajectory without recorded distances raises
    (the rollout must ask for them)."""
    out = []
    for trajectory in trajectories:
        if trajectory.goal_distances is None:
            raise ValueError(f"episode {trajectory.preset}/{trajectory.seed} has no goal "
                             "distances: run the rollout with goal_distances=True")
        out.append(dataclasses.replace(
            trajectory, turns_left_out=missed_move_turns(trajectory.goal_distances)))
    return out


def normalize_scores(returns: torch.Tensor, method: str) -> torch.Tensor:
    """Normalize one 1-D tensor of returns (one group, or the batch) by ``method``."""
    if method not in METHODS:
        raise ValueError(f"unknown normalization method {method!r}; allowed: {METHODS}")
    if method == "identity":
        return returns.clone()
    std = returns.std() if returns.numel() > 1 else torch.zeros((), dtype=returns.dtype)
    if std.abs() < EPS:
        out = torch.zeros_like(returns)
    else:
        out = (returns - returns.mean()) / (std + EPS)
    if method == "asym_clip":
        out = out.clamp(*ASYM_CLIP)
    return out


def normalize_returns(trajectories: Sequence[Trajectory], grouping: str = "state",
                      method: str = "identity") -> list[Trajectory]:
    """Copies of ``trajectories`` with ``score`` = the normalized episode return."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; allowed: {GROUPINGS}")
    returns = torch.tensor([t.episode_return for t in trajectories], dtype=torch.float64)
    scores = torch.zeros_like(returns)
    if grouping == "batch":
        parts = [list(range(len(trajectories)))]
    else:
        parts = list(group_trajectories(trajectories).values())
    scales = torch.zeros_like(returns)
    for idx in parts:
        if idx:
            scores[idx] = normalize_scores(returns[idx], method)
            scales[idx] = _scale(returns[idx], scores[idx], method)
    return [dataclasses.replace(t, score=float(s), score_map=(float(a), float(s - a * r)))
            for t, s, a, r in zip(trajectories, scores, scales, returns)]


def _scale(returns: torch.Tensor, scores: torch.Tensor, method: str) -> torch.Tensor:
    """The slope of the normalizer's affine map per return: 1 (identity), ``1 / (std + eps)``
    (mean_std), 0 where the score does not move with the return (a clipped one, or no spread)."""
    if method == "identity":
        return torch.ones_like(returns)
    std = returns.std() if returns.numel() > 1 else torch.zeros((), dtype=returns.dtype)
    if std.abs() < EPS:
        return torch.zeros_like(returns)
    scale = torch.full_like(returns, float(1.0 / (std + EPS)))
    if method == "asym_clip":
        clipped = (scores <= ASYM_CLIP[0]) | (scores >= ASYM_CLIP[1])
        scale[clipped] = 0.0
    return scale
