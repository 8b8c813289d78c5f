"""How replies were decoded, said the same way everywhere: a run's validation decoding read from
its resolved config, and the line an eval, a report and a training console print.

    decoding = run_decoding(yaml.safe_load(open("runs/x/checkpoints/step_000002/config.yaml")))
    decoding.describe()   # 'greedy, constrained to valid actions, replies up to 96 tokens, ...'

A run validates greedily (``val.*`` settings), constrained when ``rollout.constrained_actions``
says so (null: on for the local backend, off for verl), with replies cut at
``val.max_new_tokens`` (null: ``rollout.max_new_tokens``; a preset's own lower limit wins) and
each episode's context at ``rollout.max_context_tokens``. ``agentrl eval --model <run>`` and
``agentrl play --model <run>`` decode so unless a flag says otherwise, so the two numbers agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Decoding", "run_decoding"]


@dataclass(frozen=True)
class Decoding:
    """The decoding of one evaluation (or a run's validation)."""

    constrained: bool
    """Replies masked to well-formed answers of the turn's valid actions."""
    max_new_tokens: int | None = None
    """Reply limit; None: each preset's own ``max_response_tokens``."""
    temperature: float = 0.0
    """0: greedy."""
    max_context_tokens: int | None = None
    """Token budget of one episode's context; None: not stated."""
    history_windows: dict[str, int | str] = field(default_factory=dict)
    """Past turns each preset shows (0: all), or ``"state"`` for a preset whose every turn is
    its own chat (``context: state``: :func:`history_shown`)."""
    source: str = ""
    """Where the settings came from (a run's config file, flags, defaults)."""

    def describe(self) -> str:
        """One line: sampling, masking, reply limit, context, history windows, source."""
        parts = ["greedy" if self.temperature == 0 else f"sampled at temperature {self.temperature:g}",
                 "constrained to valid actions" if self.constrained else "free (unconstrained)",
                 f"replies up to {self.max_new_tokens} tokens" if self.max_new_tokens
                 else "each preset's own reply limit"]
        if self.max_context_tokens:
            parts.append(f"context up to {self.max_context_tokens} tokens")
        if self.history_windows:
            parts.append("history " + ", ".join(
                f"{name} {_history_words(window)}" for name, window in self.history_windows.items()))
        text = ", ".join(parts)
        return f"{text} ({self.source})" if self.source else text

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "description": self.describe()}


def history_shown(agent: Any) -> int | str:
    """What a preset (an ``AgentConfig`` or its mapping) shows of past turns, as
    ``Decoding.history_windows`` holds it: its ``history_window``, or ``"state"`` when every
    turn is its own chat (``context: state``)."""
    get = agent.get if isinstance(agent, Mapping) else lambda key, default: getattr(agent, key,
                                                                                  default)
    if get("context", "history") == "state":
        return "state"
    return int(get("history_window", 0) or 0)


def _history_words(window: int | str) -> str:
    if window == "state":
        return "none (each turn its own chat)"
    return "all turns" if window == 0 else f"last {window}"


def run_decoding(config: Mapping[str, Any], source: str = "") -> Decoding:
    """The validation decoding of a run whose resolved config (``config.yaml`` as a checkpoint
    saves it, or ``TrainConfig.to_dict()``) is ``config``; keys it lacks take base.yaml's
    defaults. History windows are those of ``val.presets`` in the config's ``agents``."""
    rollout = config.get("rollout") or {}
    val = config.get("val") or {}
    setting = rollout.get("constrained_actions")
    constrained = (config.get("backend", "local") == "local") if setting is None else bool(setting)
    limit = val.get("max_new_tokens") or rollout.get("max_new_tokens")
    agents = config.get("agents") or {}
    windows = {name: history_shown(agents.get(name) or {})
               for name in val.get("presets") or [] if name in agents}
    return Decoding(constrained=constrained, max_new_tokens=int(limit) if limit else None,
                    temperature=0.0, max_context_tokens=rollout.get("max_context_tokens"),
                    history_windows=windows, source=source)
