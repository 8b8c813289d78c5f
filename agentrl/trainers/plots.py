"""The learning-curve PNG written at the end of a run, from its metrics JSONL.

    plot_learning_curves(run_dir / "metrics.jsonl", run_dir / "learning_curves.png")

The picture explains the run to someone who did not start it:

- a title naming the run (``run.json``), the model, the presets and the engine, from the run's
  config (``config.yaml`` in the run folder, else the newest checkpoint's);
- the warm start marked on every panel: a shaded span up to ``train.sft_steps`` and a line where
  PPO takes over (``sft/loss`` steps when the config is not there);
- held-out success per preset (``val/<preset>/success``, greedy, at the steps validation ran)
  with its 95% Wilson interval as a band (from ``val/<preset>/episodes``: 32 games leave about
  +-17 points around 50%, so two points of a curve closer than the band are not told apart),
  against the random and the oracle policy's success on the run's own validation seeds
  (``references``: :func:`reference_success`, dotted and dashed in the preset's colour);
- training success per preset (sampled episodes);
- the health a practitioner reads, each on its own axes: the critic's explained variance, the
  clip fraction, the KL to the rollout policy (``actor/approx_kl``, ``actor/ppo_kl``, ...; a KL
  that is 0 on every step gets no line, and a note says so), the entropy per real choice (the
  tokens a constraint forced left out);
- the losses on their own scales: ``critic/vf_loss``, ``actor/pg_loss``, the warm start's
  ``sft/loss``.

Steps are integers on every axis; rates keep their [0, 1] (a flat 0 sits on the floor, not in the
middle of a made-up range). :data:`PANELS` and :func:`y_limits` are shared with the HTML report's
charts (:mod:`agentrl.report.data`). A run with none of the metrics still gets a PNG saying so, so
the end of a run never fails on a plot. Drawn on a bare ``matplotlib.figure.Figure`` (Agg, no
pyplot state, no display needed) and written atomically (temporary file, then rename), readable
like any other file the user writes.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from agentrl.evaluation.references import played_references
from agentrl.evaluation.stats import wilson_interval
from agentrl.trainers.tracking import file_mode, matching_keys, read_metrics, run_config

__all__ = ["PANELS", "REFERENCES_FILE", "Panel", "learning_curves_figure", "panel_keys",
           "plot_learning_curves", "reference_success", "run_title", "success_band",
           "warm_start_steps", "y_limits"]

REFERENCES_FILE = "references.json"
"""Beside metrics.jsonl: the reference policies' success, played once per run."""
REFERENCE_STYLES = {"random": ":", "oracle": "--"}
BAND_ALPHA = 0.2
WARM_START_COLOR = "0.5"


@dataclass(frozen=True)
class Panel:
    """One panel: the keys it draws (globs), its y-axis label and how its range is chosen
    (``kind``: ``rate`` [0, 1]; ``share`` from 0, at least to 0.05; ``positive`` from 0;
    ``explained`` up to 1; ``value`` as the data falls)."""

    title: str
    patterns: tuple[str, ...]
    ylabel: str
    kind: str = "value"
    per_preset: bool = False  # one line per preset, labelled by its name
    drop_all_zero: bool = False  # a key that is 0 on every step gets no line


PANELS = (
    Panel("held-out success", ("val/*/success",), "success rate (greedy)", "rate", True),
    Panel("training success", ("train/*/success",), "success rate (sampled)", "rate", True),
    Panel("critic explained variance", ("critic/vf_explained_var", "critic/mc_explained_var",
                                           "critic/head_explained_var"),
          "explained variance (1 = exact)", "explained"),
    Panel("clip fraction", ("actor/pg_clipfrac",), "share of tokens clipped", "share"),
    Panel("KL", ("actor/approx_kl", "actor/ppo_kl", "actor/kl", "actor/kl_loss"),
          "KL per token (nats)", "positive", drop_all_zero=True),
    Panel("entropy per choice", ("actor/entropy",), "nats per token with a choice", "positive"),
    Panel("value loss", ("critic/vf_loss",), "critic loss", "positive"),
    Panel("policy loss", ("actor/pg_loss",), "PPO loss"),
    Panel("SFT loss", ("sft/loss",), "cross-entropy per reply token", "positive"),
)
PANEL_SIZE = (5.0, 3.4)  # inches per panel
MAX_COLUMNS = 3


def plot_learning_curves(metrics_jsonl: str | Path, out_png: str | Path, *,
                         title: str | None = None,
                         references: dict[str, dict[str, float]] | None = None,
                         sft_steps: int | None = None) -> Path:
    """Draw the panels of ``PANELS`` that have data into ``out_png``; returns its path.
    ``references``: ``{preset: {"random": success, "oracle": success}}`` for the held-out
    panel. ``title`` and ``sft_steps`` default to what the run folder (the metrics file's)
    says: :func:`run_title`, :func:`warm_start_steps`."""
    metrics_jsonl = Path(metrics_jsonl)
    records = read_metrics(metrics_jsonl)
    config = _run_config(metrics_jsonl.parent)
    if title is None:
        found = sorted({k.split("/")[1] for r in records for k in r
                        if k.count("/") == 2 and k.split("/")[0] in ("train", "val")})
        title = run_title(metrics_jsonl.parent, config, presets=found)
    if sft_steps is None:
        sft_steps = warm_start_steps(records, config)
    figure = learning_curves_figure(records, title=title, references=references,
                                    sft_steps=sft_steps)
    return _save(figure, Path(out_png))


def learning_curves_figure(records: Sequence[Mapping[str, Any]], *, title: str | None = None,
                           references: Mapping[str, Mapping[str, float]] | None = None,
                           sft_steps: int = 0) -> Figure:
    """The Figure of :func:`plot_learning_curves` (nothing written)."""
    drawn, silent = panel_keys(records)
    columns = min(MAX_COLUMNS, max(1, len(drawn)))
    rows = max(1, math.ceil(len(drawn) / columns))
    figure = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows + 0.6),
                    layout="constrained")
    if title:
        figure.suptitle(title)
    if not drawn:
        figure.text(0.5, 0.5, "no metrics to plot", ha="center", va="center")
    steps = [r["step"] for r in records]
    for index, (panel, keys) in enumerate(drawn):
        axes = figure.add_subplot(rows, columns, index + 1)
        axes.set_xlim(min(steps) - 0.5, max(steps) + 0.5)  # every panel on the run's steps
        _draw_panel(axes, panel, keys, records, references or {})
        if sft_steps:
            _mark_warm_start(axes, records, sft_steps, legend=index == 0)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_xlabel("step")
        axes.set_ylabel(panel.ylabel)
        axes.grid(alpha=0.3)
        if len(axes.get_legend_handles_labels()[1]) > 1 or panel.per_preset:
            axes.legend(fontsize="small")
    if silent:
        figure.supxlabel("not drawn, 0 at every step: " + ", ".join(silent),
                         fontsize="small", color="0.4")
    return figure


def panel_keys(records: Sequence[Mapping[str, Any]]
               ) -> tuple[list[tuple[Panel, list[str]]], list[str]]:
    """The panels with something to draw and their keys; and the keys left out because they
    are 0 on every step (a KL of one pass over the batch: nothing to read)."""
    keys = {k for record in records for k in record}
    drawn, silent = [], []
    for panel in PANELS:
        found = [k for pattern in panel.patterns for k in matching_keys(keys, pattern)]
        if panel.drop_all_zero:
            zero = [k for k in found if not any(_series(records, k)[1])]
            silent += zero
            found = [k for k in found if k not in zero]
        if found:
            drawn.append((panel, found))
    return drawn, silent


def y_limits(kind: str, values: Sequence[float]) -> tuple[float, float] | None:
    """The y range of a panel of ``kind`` (:class:`Panel`) holding ``values``; None: the
    data's own (a flat line then gets a small range around its value)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if kind == "rate":
        return -0.02, 1.02
    if not values:
        return None
    low, high = min(values), max(values)
    if kind == "share":
        return 0.0, max(0.05, min(1.0, 1.1 * high))
    if kind == "positive" and low >= 0:
        return 0.0, 1.1 * high if high > 0 else 1.0
    if kind == "explained":
        return min(-0.1, low - 0.05 * (1 - low)), 1.05
    return None


def warm_start_steps(records: Sequence[Mapping[str, Any]],
                     config: Mapping[str, Any] | None = None) -> int:
    """``train.sft_steps`` of the run's config, else the last step that logged ``sft/loss``."""
    configured = ((config or {}).get("train") or {}).get("sft_steps")
    if isinstance(configured, int):
        return configured
    steps = [r["step"] for r in records if r.get("sft/loss") is not None]
    return max(steps, default=0)


def run_title(run_dir: str | Path, config: Mapping[str, Any] | None = None,
              presets: Sequence[str] = ()) -> str:
    """``run <id> · model <name> · <presets> · <engine>`` and a second line on the recipe,
    from the run folder (what is not there is left out; ``presets``: those the metrics name,
    for a folder without its config)."""
    run_dir = Path(run_dir)
    config = _run_config(run_dir) if config is None else config
    run_id = None
    try:
        run_id = json.loads((run_dir / "run.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        pass
    parts = [f"run {run_id or run_dir.name}"]
    model = (config.get("model") or {}).get("name")
    if model:
        parts.append(f"model {model}")
    presets = list(dict.fromkeys([*(config.get("train") or {}).get("presets", []),
                                  *(config.get("val") or {}).get("presets", []), *presets]))
    if presets:
        parts.append(", ".join(presets))
    backend = config.get("backend")
    if backend:
        parts.append({"local": "local engine", "verl": "verl + vLLM"}.get(backend, backend))
    lines = [" · ".join(parts)]
    recipe = []
    sft_steps = (config.get("train") or {}).get("sft_steps")
    if sft_steps:
        recipe.append(f"warm start: {sft_steps} SFT step(s) (train.sft_steps)")
    estimator = (config.get("algorithm") or {}).get("adv_estimator")
    if estimator:
        recipe.append(f"PPO, {estimator} advantages")
    if recipe:
        lines.append(", then ".join(recipe))
    return "\n".join(lines)


def _draw_panel(axes, panel: Panel, keys: list[str], records, references) -> None:
    values = []
    games = set()
    for key in keys:
        steps, series = _series(records, key)
        values += series
        label = key.split("/")[1] if panel.per_preset else key
        line, = axes.plot(steps, series, marker="." if len(steps) < 50 else None, label=label)
        if panel.per_preset and key.startswith("val/"):
            band_steps, low, high = success_band(records, key)
            if band_steps:
                axes.fill_between(band_steps, low, high, color=line.get_color(),
                                  alpha=BAND_ALPHA, linewidth=0)
            games |= {int(r[key.rsplit("/", 1)[0] + "/episodes"]) for r in records
                      if r.get(key.rsplit("/", 1)[0] + "/episodes")}
            preset = key.split("/")[1]
            for policy, success in references.get(preset, {}).items():
                axes.axhline(success, color=line.get_color(), linewidth=1,
                             linestyle=REFERENCE_STYLES.get(policy, "-."),
                             label=f"{preset} {policy}")
    title = panel.title
    if games:
        title += (f" ({'/'.join(map(str, sorted(games)))} games a preset, "
                  "band: 95% interval)")
    axes.set_title(title, fontsize="medium")
    limits = y_limits(panel.kind, values)
    if limits is not None:
        axes.set_ylim(*limits)
    if panel.kind == "explained":
        axes.axhline(0.0, color="0.6", linewidth=0.8, label="_no better than the mean")


def _mark_warm_start(axes, records, sft_steps: int, legend: bool) -> None:
    first = min((r["step"] for r in records), default=0)
    axes.axvspan(first - 0.5, sft_steps + 0.5, color=WARM_START_COLOR, alpha=0.12, linewidth=0)
    axes.axvline(sft_steps + 0.5, color=WARM_START_COLOR, linestyle="-.", linewidth=1,
                 label=(f"warm start ends (train.sft_steps={sft_steps})" if legend
                        else "_warm start ends"))


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config (:func:`agentrl.trainers.tracking.run_config`); {} when
    unreadable."""
    try:
        return run_config(run_dir)
    except (OSError, ValueError):
        return {}


def reference_success(run_dir: Path, presets: list[str], groups: int
                      ) -> dict[str, dict[str, float]]:
    """The random and oracle policies' success per preset on the first ``groups`` validation
    seeds, played once and kept in ``run_dir/references.json`` (a resumed run reads it)."""
    path = run_dir / REFERENCES_FILE
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("groups") == groups and set(presets) <= set(stored["presets"]):
            return stored["presets"]
    played = {preset: {policy: row["success"] for policy, row in policies.items()}
              for preset, policies in played_references(presets, groups).items()}
    path.write_text(json.dumps({"groups": groups, "presets": played}, indent=1))
    return played


def success_band(records: list[dict[str, Any]], success_key: str
                 ) -> tuple[list[int], list[float], list[float]]:
    """Steps, lower and upper 95% Wilson bounds of a ``<split>/<preset>/success`` series, at
    the steps that also logged ``<split>/<preset>/episodes`` (older runs did not)."""
    episodes_key = success_key.rsplit("/", 1)[0] + "/episodes"
    steps, low, high = [], [], []
    for record in records:
        rate, count = record.get(success_key), record.get(episodes_key)
        if rate is None or not count:
            continue
        bounds = wilson_interval(rate * count, int(count))
        steps.append(record["step"])
        low.append(bounds[0])
        high.append(bounds[1])
    return steps, low, high


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The steps at which ``key`` has a value (validation runs only every few steps)."""
    points = [(r["step"], r[key]) for r in records
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in points], [v for _, v in points]


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(tmp, dpi=100)
        os.chmod(tmp, file_mode())  # mkstemp's 0600 -> as any file the user writes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
