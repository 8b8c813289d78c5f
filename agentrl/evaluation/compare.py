"""Agent-setting variants played side by side: does reasoning before the action help?

    agentrl eval --presets babyaiGoTo3Agent --compare enable_think=true enable_think=false

Each variant is a set of agent-preset settings (``KEY=VALUE[,KEY=VALUE...]``, values read as
YAML) laid over every chosen preset. All variants play the same held-out seeds with the same
policy (:func:`agentrl.evaluation.evaluate`), one after the other, so rows differ only by the
settings. One table (per variant and preset: success, return, reply tokens, seconds per
episode) and one PNG (the same numbers as bars) come out.

Seconds per episode is the mean of an episode's own generate + env + tokenize time; episodes
run concurrently, so compare it between variants of one run, not across machines.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.agents import AgentConfig
from agentrl.agents.config import RULES
from agentrl.evaluation.held_out import EvalResult, evaluate

__all__ = ["COMPARE_COLUMNS", "Variant", "compare", "comparison_rows", "parse_variant",
           "plot_comparison"]

FIXED_KEYS = ("game", "env_kwargs", "held_out_of")
"""Settings a variant may not change: they decide which game is played."""

COMPARE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("success", "success %", "{:.1f}"),
    ("return", "mean return", "{:+.3f}"),
    ("response_length", "reply tokens / episode", "{:.1f}"),
    ("seconds_per_episode", "s / episode", "{:.2f}"),
)
"""(row key, column heading, cell format); success is shown in percent."""


@dataclass(frozen=True)
class Variant:
    label: str
    """The text it was given as, e.g. ``enable_think=false``."""
    settings: dict[str, Any]


def parse_variant(text: str) -> Variant:
    """``"enable_think=false,max_response_tokens=64"`` -> a Variant; unknown keys raise."""
    import yaml

    settings: dict[str, Any] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = pair.partition("=")
        key = key.strip()
        changeable = [k for k in RULES if k not in FIXED_KEYS]
        if not sep or key not in changeable:
            raise ValueError(f"--compare: {pair!r} is not KEY=VALUE with KEY an agent setting; "
                             f"allowed keys: {changeable}")
        settings[key] = yaml.safe_load(value)
    if not settings:
        raise ValueError(f"--compare: empty variant {text!r}; expected KEY=VALUE[,KEY=VALUE]")
    return Variant(label=text, settings=settings)


def apply_variant(presets: Mapping[str, AgentConfig], variant: Variant) -> dict[str, AgentConfig]:
    """Every preset with the variant's settings (validated: a bad value raises naming it)."""
    try:
        return {name: dataclasses.replace(config, **variant.settings)
                for name, config in presets.items()}
    except ValueError as error:
        raise ValueError(f"--compare {variant.label!r}: {error}") from None


async def compare(presets: Mapping[str, AgentConfig], policy: Any, variants: list[Variant],
                  **evaluate_kwargs: Any) -> list[tuple[Variant, EvalResult]]:
    """:func:`evaluate` once per variant, on the same seeds (all variants checked first)."""
    configured = [(variant, apply_variant(presets, variant)) for variant in variants]
    results = []
    for variant, variant_presets in configured:
        label = f"{evaluate_kwargs.get('label') or 'model'} [{variant.label}]"
        kwargs = {**evaluate_kwargs, "label": label}
        results.append((variant, await evaluate(variant_presets, policy, **kwargs)))
    return results


def comparison_rows(results: list[tuple[Variant, EvalResult]]) -> list[dict[str, Any]]:
    """One row per (variant, preset): the COMPARE_COLUMNS numbers plus episodes."""
    rows = []
    for variant, result in results:
        for preset in result.presets:
            metrics = result.preset_metrics(preset)
            episodes = [t for t in result.trajectories if t.preset == preset]
            seconds = sum(sum(t.timings.values()) for t in episodes) / max(1, len(episodes))
            rows.append({"variant": variant.label, "preset": preset,
                         "episodes": len(episodes), "success": 100 * metrics["success"],
                         "return": metrics["return"],
                         "response_length": metrics["response_length"],
                         "seconds_per_episode": seconds})
    return rows


def comparison_table(rows: list[dict[str, Any]], title: str):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("variant", style="bold")
    table.add_column("preset")
    table.add_column("episodes", justify="right")
    for _, heading, _ in COMPARE_COLUMNS:
        table.add_column(heading, justify="right")
    for row in rows:
        table.add_row(row["variant"], row["preset"], str(row["episodes"]),
                      *(fmt.format(row[key]) for key, _, fmt in COMPARE_COLUMNS))
    return table


def plot_comparison(rows: list[dict[str, Any]], out_png: str | Path, title: str = "") -> Path:
    """Bars per preset, one colour per variant, one panel per COMPARE_COLUMNS number."""
    from matplotlib.figure import Figure

    variants = list(dict.fromkeys(row["variant"] for row in rows))
    presets = list(dict.fromkeys(row["preset"] for row in rows))
    value = {(row["variant"], row["preset"]): row for row in rows}
    figure = Figure(figsize=(4.2 * len(COMPARE_COLUMNS), 3.6), layout="constrained")
    if title:
        figure.suptitle(title)
    width = 0.8 / len(variants)
    for index, (key, heading, _) in enumerate(COMPARE_COLUMNS):
        axes = figure.add_subplot(1, len(COMPARE_COLUMNS), index + 1)
        for v, variant in enumerate(variants):
            heights = [value[(variant, p)][key] if (variant, p) in value else 0.0
                       for p in presets]
            axes.bar([i + v * width for i in range(len(presets))], heights, width,
                     label=variant)
        axes.set_xticks([i + width * (len(variants) - 1) / 2 for i in range(len(presets))],
                        presets, rotation=20, ha="right", fontsize=7)
        axes.set_title(heading)
        if index == 0:
            axes.legend(fontsize=7)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=".png", dir=out_png.parent)
    os.close(handle)
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, out_png)
    return out_png
