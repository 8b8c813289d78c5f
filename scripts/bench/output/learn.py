"""The learning benchmark's output (scripts/bench/learn.py): its table and its plot.

Why apart: the benchmark runs recipes and writes a result; how the result is shown (a rich
table, bars of success before and after, the held-out curves) is read from that result alone,
so it changes without touching the runs. Loaded by path (:func:`agentrl.cli.bench.script_module`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

TABLE_WIDTH = 130  # columns of the table when the output is not a terminal


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def show(result: dict[str, Any], with_sft: bool) -> None:
    """The summary table; ``with_sft``: a recipe has an SFT stage (the title names its size)."""
    table = Table(title=(
        f"{result['model']} on {result['preset']}: held-out greedy success (%) on "
        f"{result['val_games']} games; {result['steps']} PPO steps x "
        f"{result['episodes_per_step']} episodes"
        + (f", SFT {result['sft_episodes']} episodes x {result['sft_epochs']} epochs"
           if with_sft else "")
        + (f", <= {result['minutes']:g} min a run" if result["minutes"] else "")))
    for column in ("recipe", "runs", "before", "after (mean)", "min-max", "std", "gain",
                   "format err. after", "PPO steps", "train min/run", "wall min/run"):
        table.add_column(column, justify="left" if column == "recipe" else "right",
                         no_wrap=column == "recipe")
    for row in result["summary"]:
        table.add_row(escape(row["label"]), str(row["runs"]), percent(row["before"]),
                      percent(row["after_mean"]),
                      f"{percent(row['after_min'])}-{percent(row['after_max'])}",
                      percent(row["after_std"]), f"{100 * row['gain']:+.1f}",
                      percent(row["format_error_after"]),
                      "-" if row["steps"] is None else f"{row['steps']:.1f}",
                      f"{row['train_minutes']:.1f}", f"{row['wall_minutes']:.1f}")
    for label, row in result["references"].items():
        policy, _, variant = label.partition(" ")
        table.add_row(f"[dim]{policy} policy {escape(variant)}[/dim]", "", "",
                      percent(row["success"]), *[""] * 7)
    console = Console()
    console.width = console.width if console.is_terminal else TABLE_WIDTH
    console.print(table)
    health = [row for row in result["summary"] if row.get("health")]
    if health:
        console.print(health_table(health))
    print(f"plot: {result['plot']}")


def health_table(rows: list[dict[str, Any]]) -> Table:
    """The PPO rows' RL health, means over their seeds: what a practitioner reads first."""
    table = Table(title="RL health of the PPO runs (means over PPO steps and seeds)")
    for column in ("recipe", "explained var.", "explained var. steps 5-20",
                   "pooled over steps 5-20", "clip fraction", "KL", "entropy / choice"):
        table.add_column(column, justify="left" if column == "recipe" else "right")

    def cell(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for row in rows:
        h = row["health"]
        table.add_row(escape(row["label"]), cell(h["critic/vf_explained_var"], 3),
                      cell(row.get("explained_variance_steps_5_20"), 3),
                      cell(row.get("explained_variance_pooled_steps_5_20"), 3),
                      cell(h["actor/pg_clipfrac"], 3), cell(h["actor/ppo_kl"], 4),
                      cell(h["actor/entropy"], 3))
    return table


def plot(result: dict[str, Any], path: Path) -> Path:
    """Bars of mean success after each recipe (error bars: min-max over seeds), ticks before."""
    from matplotlib.figure import Figure

    rows = result["summary"]
    curves = {label: [run["stages"][-1]["val_curve"] for run in runs]
              for label, runs in result["runs"].items()
              if runs and runs[0].get("stages") and len(runs[0]["stages"][-1].get("val_curve", ())) > 2}
    width = 1.6 * len(rows) + 2.5
    figure = Figure(figsize=(width + 5.0 * bool(curves), 3.8), layout="constrained")
    axes = figure.add_subplot(1, 1 + bool(curves), 1)
    if curves:
        plot_curves(figure.add_subplot(1, 2, 2), curves, result)
    x = range(len(rows))
    means = [100 * r["after_mean"] for r in rows]
    errors = [[m - 100 * r["after_min"] for m, r in zip(means, rows)],
              [100 * r["after_max"] - m for m, r in zip(means, rows)]]
    axes.bar(x, means, yerr=errors, capsize=5, color="tab:blue", label="after (min-max)")
    axes.scatter(x, [100 * r["before"] for r in rows], marker="_", s=600, color="black",
                 zorder=3, label="before")
    styles = {"random": ("tab:red", "--"), "oracle": ("tab:green", ":")}
    for label, row in result["references"].items():
        color, style = styles[label.split()[0]]
        axes.axhline(100 * row["success"], color=color, linestyle=style, label=label)
    axes.set_xticks(list(x), [r["label"].replace(" [", "\n[") for r in rows])
    axes.set_ylabel(f"held-out greedy success % ({result['val_games']} games)")
    axes.set_ylim(0, 105)
    axes.set_title(f"{result['model']} on {result['preset']}, {result['seeds']} seed(s)")
    axes.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def plot_curves(axes: Any, curves: dict[str, list[list]], result: dict[str, Any]) -> None:
    """Held-out success per PPO step, one thin line per training seed, the mean thick."""
    colors = iter(["tab:purple", "tab:orange", "tab:cyan", "tab:olive", "tab:brown"])
    for label, runs in curves.items():
        color = next(colors, "tab:gray")
        for curve in runs:
            axes.plot(*zip(*[(s, 100 * v) for s, v in curve]), color=color, alpha=0.35, lw=1)
        steps = sorted(set.intersection(*(set(s for s, _ in curve) for curve in runs)))
        means = [100 * statistics.fmean(dict(curve)[s] for curve in runs) for s in steps]
        axes.plot(steps, means, color=color, lw=2.5, marker="o", label=f"{label} (mean)")
    axes.set_xlabel("PPO step (0: where PPO starts)")
    axes.set_ylabel(f"held-out greedy success % ({result['val_games']} games)")
    axes.set_ylim(0, 105)
    axes.legend(fontsize="small")
