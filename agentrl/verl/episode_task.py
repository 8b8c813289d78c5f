"""One task row's episode as the agent loop plays it: the task read from ``extra_info`` and the
response budget that ends it.

Why apart from :mod:`agentrl.verl.agent_loop`: a row's fields are checked here (a bad field
fails naming it, see :mod:`agentrl.verl.data` for the writer) and the budget is pure token
counting; neither needs verl or Ray, so both import without them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from agentrl.agents import (
    Agent,
    AgentConfig,
    AgentWrapper,
    TurnResult,
    agent_presets_from_dict,
)
from agentrl.rollout import REWARD_PLACEMENTS, ChatSuffix
from agentrl.verl import AGENT_NAME

__all__ = ["TASK_FIELDS", "BudgetedAgent", "EpisodeTask", "ResponseBudget", "row_index"]

TASK_FIELDS = ("preset", "seed", "agent_config", "max_context_tokens", "reward_placement")
"""What ``extra_info`` must hold (written by :mod:`agentrl.verl.data`)."""


@dataclasses.dataclass(frozen=True)
class EpisodeTask:
    """One episode to play, read from a task row's ``extra_info``."""

    preset: str
    seed: int
    agent_config: AgentConfig
    max_context_tokens: int
    """Prompt + response tokens of the whole episode at most."""
    reward_placement: str
    """``"turn"`` or ``"last"`` (see the module docstring)."""
    turn_gamma: float = 1.0
    """The discount between turns (``algorithm.gamma_unit: turn``); optional in a row, default 1:
    the turns' rewards are reshaped so verl's GAE at γ = λ = 1 gives per-turn discounted
    returns (:func:`agentrl.rollout.batch.discounted_turn_rewards`)."""

    @classmethod
    def from_extra_info(cls, extra_info: Any, *, windows: bool = False) -> EpisodeTask:
        """Parse and check ``extra_info``; a bad field raises ValueError naming it. A windowed
        preset (``history_window > 0`` or ``context: state``: ``AgentConfig.windowed``) needs
        ``windows`` (verl's V1 trainer, which takes one row per context window:
        :mod:`agentrl.verl.windows`)."""
        if not isinstance(extra_info, Mapping):
            raise ValueError(  # noqa: TRY004 - bad task data, like every other check here
                f"{AGENT_NAME}: the task row's extra_info must be a mapping with "
                f"{list(TASK_FIELDS)}, got {type(extra_info).__name__}")
        missing = [key for key in TASK_FIELDS if extra_info.get(key) is None]
        if missing:
            raise ValueError(f"{AGENT_NAME}: extra_info lacks {missing}; it needs "
                             f"{list(TASK_FIELDS)} (see agentrl.verl.data)")
        preset = str(extra_info["preset"])
        seed = _integer(extra_info, "seed", low=0)
        max_context = _integer(extra_info, "max_context_tokens", low=2)
        if not isinstance(extra_info["agent_config"], str):
            raise ValueError(  # noqa: TRY004 - bad task data, like every other check here
                f"{AGENT_NAME}: extra_info.agent_config must be the JSON text of the preset's "
                f"AgentConfig fields, got {type(extra_info['agent_config']).__name__}")
        placement = extra_info["reward_placement"]
        if placement not in REWARD_PLACEMENTS:
            raise ValueError(f"{AGENT_NAME}: extra_info.reward_placement={placement!r} is not "
                             f"allowed; allowed: {list(REWARD_PLACEMENTS)}")
        config = _agent_config(preset, extra_info["agent_config"])
        if config.windowed and not windows:
            raise ValueError(f"{AGENT_NAME}: preset {preset!r} has history_window="
                             f"{config.history_window}, context={config.context!r}; not allowed "
                             "on verl's legacy trainer (a reply must be trained on the context "
                             "it was sampled from, and it trains one row per episode); allowed: "
                             "history_window 0 with context 'history', or trainer.use_v1=true")
        turn_gamma = extra_info.get("turn_gamma", 1.0)
        number = isinstance(turn_gamma, (int, float, np.floating)) and not isinstance(turn_gamma, bool)
        if not number or not 0.0 <= turn_gamma <= 1.0:
            raise ValueError(f"{AGENT_NAME}: extra_info.turn_gamma={turn_gamma!r} is not "
                             "allowed; allowed: a number in [0, 1]")
        return cls(preset, seed, config, max_context, str(placement), float(turn_gamma))


def row_index(extra_info: Any) -> int | None:
    """The task row's ``extra_info.index`` (verl's dataset numbers rows by it), if it has one."""
    index = extra_info.get("index") if isinstance(extra_info, Mapping) else None
    is_integer = isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_))
    return int(index) if is_integer else None


def _integer(extra_info: Mapping, key: str, low: int) -> int:
    value = extra_info[key]
    is_integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not is_integer or value < low:
        raise ValueError(f"{AGENT_NAME}: extra_info.{key}={value!r} is not allowed; allowed: "
                         f"an integer >= {low}")
    return int(value)


@lru_cache(maxsize=256)
def _agent_config(preset: str, agent_config: str) -> AgentConfig:
    """The preset's AgentConfig from its JSON (``dataclasses.asdict``); cached per text.
    ``held_out_of`` is dropped: it names another preset, which a row does not carry, and it
    does not change how an episode is played."""
    try:
        fields = json.loads(agent_config)
    except (TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"{AGENT_NAME}: extra_info.agent_config of preset {preset!r} is not a "
                         f"JSON object of AgentConfig fields ({error})") from None
    if not isinstance(fields, dict):
        raise ValueError(  # noqa: TRY004 - bad task data, like every other check here
            f"{AGENT_NAME}: extra_info.agent_config of preset {preset!r} must be a JSON object "
            f"of AgentConfig fields, got {type(fields).__name__}")
    fields.pop("held_out_of", None)
    return agent_presets_from_dict({preset: fields}, source=f"{AGENT_NAME} extra_info.agent_config",
                                   check_envs=False)[preset]


@dataclasses.dataclass
class ResponseBudget:
    """Response tokens an episode may still add: replies, the closing tokens of cut replies
    and observations all count, as they do in verl's ``response_length``."""

    total: int
    used: int = 0
    exhausted: bool = False
    """The episode was ended because the next turn did not fit."""

    @property
    def left(self) -> int:
        return self.total - self.used


class BudgetedAgent(AgentWrapper):
    """An :class:`Agent` as ``run_episode`` plays it inside verl.

    ``reset`` returns the opening made off the event loop (by :func:`open_episode`), once;
    ``step`` ends the episode when the next observation and one reply token would not fit
    ``budget``; the rest is the agent's (:class:`AgentWrapper`).
    """

    def __init__(self, agent: Agent, seed: int, opening: list[dict], budget: ResponseBudget,
                 suffix: ChatSuffix):
        super().__init__(agent)
        self.budget = budget
        self._seed = seed
        self._opening: list[dict] | None = opening
        self._suffix = suffix

    def reset(self, seed: int | None = None) -> list[dict]:
        if self._opening is None or seed != self._seed:
            raise RuntimeError(f"BudgetedAgent plays one episode, on seed {self._seed} "
                               f"(reset(seed={seed!r}) called after it started or on another seed)")
        opening, self._opening = self._opening, None
        return opening

    def step(self, response_text: Any) -> TurnResult:
        result = self.agent.step(response_text)
        if result.done:
            return result
        observation = len(self._suffix.first_prompt(result.messages) if result.fresh
                          else self._suffix(result.messages))
        if self.budget.used + observation + 1 > self.budget.total:
            self.budget.exhausted = True
            return dataclasses.replace(result, done=True, messages=[])
        self.budget.used += observation
        return result
