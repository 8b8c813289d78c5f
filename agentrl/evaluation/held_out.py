"""Held-out evaluation: play every preset on validation seeds and report per-preset metrics.

    from agentrl.evaluation import evaluate
    result = await evaluate(presets, llm, tokenizer=tokenizer, groups=8)   # greedy model
    result = await evaluate(presets, "oracle", groups=8)                   # reference rows
    result = await evaluate(presets, "random", groups=8, seed=0)
    result.metrics["val/simpleSokobanAgent/success"]; rich.print(result.table())
    json.dump(result.to_dict(), file)

The PPO trainer's validation and ``agentrl eval`` both call :func:`evaluate`, so a number in a
training log and in an eval report mean the same thing.

- **Seeds.** Each preset plays ``groups`` games: seeds ``split_seeds(split, groups,
  seed_offset)`` from the held-out range (:mod:`agentrl.envs.splits`), the same seeds for every
  preset and every policy, so rows are comparable across policies and runs. Each game is played
  ``group_size`` times (useful with sampling; greedy members all play alike).
- **Policies.** An LLM (anything with ``async generate``) plays through
  :func:`agentrl.rollout.run_groups`, greedy unless ``sampling`` says otherwise, all episodes
  concurrently. ``"oracle"`` (the game's known solution) and ``"random"`` (uniform legal actions
  from an rng seeded per episode) need no model: their episodes are played at the text level
  (``Agent.step(agent.oracle_response())``), synchronously, and recorded as trajectories
  without tokens. Every policy's trajectories go through the same
  :func:`agentrl.rollout.rollout_metrics`, so the reference rows use the model rows' formulas.
- **Uncertainty.** Every success rate comes with its 95% Wilson interval
  (:func:`agentrl.evaluation.stats.wilson_interval`): the table shows it beside the rate and
  the JSON row carries ``success_ci95 = [low, high]``. 32 games leave about +-17 points around
  50%.
- **Progress.** A tqdm bar on stderr counts finished episodes, with the success rate so far.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.agents import Agent, AgentConfig
from agentrl.engines import SamplingParams
from agentrl.envs.splits import split_seeds
from agentrl.evaluation.stats import wilson_interval
from agentrl.rollout import rollout_metrics, run_groups
from agentrl.rollout.records import Trajectory, Turn, turn_counts

__all__ = ["SCRIPTED_POLICIES", "TABLE_COLUMNS", "EvalResult", "evaluate", "greedy_sampling"]

SCRIPTED_POLICIES = ("oracle", "random")
"""Policies played without a model; anything else must be an LLM object."""
DEFAULT_MAX_CONTEXT_TOKENS = 8192
"""SmolLM2's context; the longest preset (11 turns of 400 tokens) fits."""

TABLE_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("episodes", "episodes", lambda v: f"{v:.0f}"),
    ("success", "success %", lambda v: f"{100 * v:.1f}"),
    ("success_ci95", "95% interval", lambda v: f"{100 * v[0]:.1f}-{100 * v[1]:.1f}"),
    ("return", "mean return", lambda v: f"{v:+.3f}"),
    ("turns", "mean turns", lambda v: f"{v:.2f}"),
    ("action_is_valid", "valid-action %", lambda v: f"{100 * v:.1f}"),
    ("format_error", "format-error %", lambda v: f"{100 * v:.1f}"),
    ("response_length", "mean response tokens", lambda v: f"{v:.1f}"),
)
"""(metric name, column heading, cell format) of :meth:`EvalResult.table`, after 'preset'."""


@dataclass(frozen=True)
class EvalResult:
    """Trajectories of one evaluation and their metrics (``rollout_metrics`` names)."""

    policy: str
    """'oracle', 'random', or the model's label."""
    split: str
    seeds: tuple[int, ...]
    """The held-out seeds; every preset played each of them ``group_size`` times."""
    group_size: int
    trajectories: tuple[Trajectory, ...]
    metrics: dict[str, float]
    """``<split>/<preset>/<name>`` and ``timing/*``, ready for a training log."""
    seconds: float
    """Wall time of the whole evaluation."""

    @property
    def presets(self) -> list[str]:
        return list(dict.fromkeys(t.preset for t in self.trajectories))

    def preset_metrics(self, preset: str) -> dict[str, Any]:
        """One preset's metrics without the ``<split>/<preset>/`` prefix, plus ``episodes`` and
        ``success_ci95`` (the success rate's 95% Wilson interval, ``[low, high]``)."""
        prefix = f"{self.split}/{preset}/"
        row: dict[str, Any] = {k[len(prefix):]: v for k, v in self.metrics.items()
                               if k.startswith(prefix)}
        episodes = Counter(t.preset for t in self.trajectories)[preset]
        row["episodes"] = episodes
        row["success_ci95"] = list(wilson_interval(row["success"] * episodes, episodes))
        return row

    def table(self, title: str | None = None):
        """A rich table: one row per preset, the columns of ``TABLE_COLUMNS``."""
        from rich.table import Table

        title = title or (f"{self.policy} on {self.split} seeds ({len(self.seeds)} per preset"
                          f" x {self.group_size}), {self.seconds:.1f} s")
        table = Table(title=title)
        table.add_column("preset", style="bold")
        for _, heading, _ in TABLE_COLUMNS:
            table.add_column(heading, justify="right")
        for preset in self.presets:
            row = self.preset_metrics(preset)
            table.add_row(preset, *(fmt(row[key]) for key, _, fmt in TABLE_COLUMNS))
        return table

    def episode_records(self, per_preset: int) -> list[dict[str, Any]]:
        """Turn-by-turn records (:mod:`agentrl.rollout.episode_record`) of up to
        ``per_preset`` episodes of each preset, new seeds first."""
        from agentrl.rollout.episode_record import episode_record, sample_episodes

        return [episode_record(t, split=self.split)
                for preset in self.presets
                for t in sample_episodes([t for t in self.trajectories if t.preset == preset],
                                         per_preset)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary: settings, per-preset metrics, timings (no trajectories)."""
        return {
            "policy": self.policy,
            "split": self.split,
            "seeds": list(self.seeds),
            "group_size": self.group_size,
            "seconds": self.seconds,
            "presets": {p: self.preset_metrics(p) for p in self.presets},
            "timing": {k.removeprefix("timing/"): v for k, v in self.metrics.items()
                       if k.startswith("timing/")},
        }


def greedy_sampling(presets: Mapping[str, AgentConfig]) -> SamplingParams:
    """Greedy decoding up to the longest reply any preset allows (each episode caps at its own)."""
    return SamplingParams(greedy=True, max_new_tokens=max(c.max_response_tokens
                                                          for c in presets.values()))


async def evaluate(
    presets: Mapping[str, AgentConfig],
    policy: Any,
    *,
    groups: int,
    group_size: int = 1,
    split: str = "val",
    seed_offset: int = 0,
    tokenizer: Any = None,
    sampling: SamplingParams | None = None,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
    seed: int = 0,
    label: str | None = None,
    progress: bool = True,
) -> EvalResult:
    """Play ``groups`` held-out games x ``group_size`` per preset with ``policy``.

    ``policy`` is ``"oracle"``, ``"random"`` or an LLM; an LLM needs ``tokenizer`` (default:
    ``policy.tokenizer``, which :class:`agentrl.engines.BatchingLLM` has) and plays with
    ``sampling`` (default :func:`greedy_sampling`). ``seed`` seeds the random policy.
    ``label`` names the policy in the result (default: the policy string, or 'model').
    """
    if not presets:
        raise ValueError("no presets given")
    if groups < 1 or group_size < 1:
        raise ValueError(f"groups and group_size must be >= 1, got {groups}, {group_size}")
    scripted = isinstance(policy, str)
    if scripted and policy not in SCRIPTED_POLICIES:
        raise ValueError(f"unknown policy={policy!r}; allowed: {list(SCRIPTED_POLICIES)} or an "
                         "LLM object with async generate()")
    if not scripted:
        tokenizer = tokenizer if tokenizer is not None else getattr(policy, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("evaluating an LLM needs its tokenizer: pass tokenizer=...")
    seeds = split_seeds(split, groups, seed_offset)
    schedule = [seeds[g // len(presets)] for g in range(groups * len(presets))]
    bar = _ProgressBar(groups * group_size * len(presets), label or _label(policy), progress)
    start = time.perf_counter()
    try:
        if scripted:
            trajectories = _play_scripted(presets, policy, schedule, group_size, seed, bar.report)
        else:
            trajectories = await run_groups(
                presets, policy, tokenizer, sampling or greedy_sampling(presets),
                group_num=len(schedule), group_size=group_size, seeds=schedule,
                max_context_tokens=max_context_tokens, on_episode_done=bar.report)
    finally:
        bar.close()
    return EvalResult(policy=label or _label(policy), split=split, seeds=tuple(seeds),
                      group_size=group_size, trajectories=tuple(trajectories),
                      metrics=rollout_metrics(trajectories, split=split),
                      seconds=time.perf_counter() - start)


def _label(policy: Any) -> str:
    return policy if isinstance(policy, str) else "model"


# -- scripted policies ---------------------------------------------------------------------------
def _play_scripted(presets: Mapping[str, AgentConfig], policy: str, schedule: list[int],
                   group_size: int, seed: int,
                   report: Callable[[Trajectory], None]) -> list[Trajectory]:
    """Episodes in ``run_groups``' order: group ``g`` plays preset ``g % P`` on ``schedule[g]``."""
    pairs = list(presets.items())
    agents = {name: Agent(config) for name, config in pairs}
    trajectories = []
    try:
        for g, game_seed in enumerate(schedule):
            name, _ = pairs[g % len(pairs)]
            for member in range(group_size):
                rng = np.random.default_rng((seed, g, member))
                trajectory = _scripted_episode(agents[name], name, game_seed, g, policy, rng)
                report(trajectory)
                trajectories.append(trajectory)
    finally:
        for agent in agents.values():
            agent.close()
    return trajectories


def _scripted_episode(agent: Agent, preset: str, seed: int, group_index: int, policy: str,
                      rng: np.random.Generator) -> Trajectory:
    """One text-level episode, recorded as a trajectory without tokens (turns keep the text)."""
    start = time.perf_counter()
    messages = agent.reset(seed=seed)
    turns = []
    while not agent.done:
        text = agent.oracle_response() if policy == "oracle" else agent.random_response(rng)
        observation = messages[-1]["content"]
        result = agent.step(text)
        messages = result.messages
        turns.append(Turn(prompt_ids=(), response_ids=(), logprobs=(), reward=result.reward,
                          format_ok=result.format_ok, num_actions=result.num_actions,
                          num_valid=result.num_valid_actions,
                          num_effective=result.num_effective_actions,
                          truncated_by_length=False, text=text, observation=observation,
                          actions=tuple(result.info["actions"]),
                          action_valid=tuple(result.info["action_valid"]),
                          format_progress=float(result.info["format_progress"])))
    metrics = turn_counts(turns)  # no tokens: response_length and the context counts read 0
    # No tokens, so no turn end positions: per-turn rewards live in ``turns``.
    return Trajectory(
        preset=preset, seed=seed, group_index=group_index, prompt_ids=[], response_ids=[],
        response_mask=[], response_logprobs=[], turn_end_positions=[], turn_rewards=[],
        success=bool(agent.success), episode_return=float(sum(t.reward for t in turns)),
        num_turns=len(turns), turns=turns, metrics=metrics,
        timings={"generate_s": 0.0, "env_s": time.perf_counter() - start, "tokenize_s": 0.0})


# -- progress ------------------------------------------------------------------------------------
class _ProgressBar:
    """A tqdm bar over finished episodes showing the success rate so far."""

    def __init__(self, total: int, label: str, enabled: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=f"eval {label}", unit="episode", disable=not enabled,
                        dynamic_ncols=True)
        self.done = self.solved = 0

    def report(self, trajectory: Trajectory) -> None:
        self.done += 1
        self.solved += bool(trajectory.success)
        self.bar.set_postfix(success=f"{self.solved}/{self.done}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
