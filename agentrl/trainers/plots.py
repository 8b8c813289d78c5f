"""The learning-curve PNG written at the end of a run, from its metrics JSONL.

    plot_learning_curves(run_dir / "metrics.jsonl", run_dir / "learning_curves.png")

Panels, each drawn only when the run logged one of its keys:

- train success per preset (``train/<preset>/success``), validation success per preset
  (``val/<preset>/success``, at the steps validation ran) with its 95% Wilson interval as a
  band (from ``val/<preset>/episodes``: 32 games leave about +-17 points around 50%, so two
  points of a curve closer than the band are not told apart);
- reference lines in the validation panel: the random and the oracle policy's success per
  preset on the run's own validation seeds (``references``: :func:`reference_success`, dashed
  and dotted in the preset's colour), so a curve reads against luck and against the best play;
- loss (``actor/pg_loss``, ``critic/vf_loss``, the warm start's ``sft/loss``), KL (``actor/kl``, ``actor/ppo_kl``,
  ``actor/kl_loss``), entropy (``actor/entropy``).

A run with none of them still gets a PNG saying so, so the end of a run never fails on a plot.
Drawn on a bare ``matplotlib.figure.Figure`` (Agg, no pyplot state, no display needed) and
written atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from agentrl.evaluation.references import played_references
from agentrl.evaluation.stats import wilson_interval
from agentrl.trainers.tracking import matching_keys, read_metrics

__all__ = ["PANELS", "REFERENCES_FILE", "plot_learning_curves", "reference_success",
           "success_band"]

REFERENCES_FILE = "references.json"
"""Beside metrics.jsonl: the reference policies' success, played once per run."""
REFERENCE_STYLES = {"random": ":", "oracle": "--"}

# (title, key patterns, per preset): per-preset panels are success rates in [0, 1], one line per
# preset labelled by its name; the others have one line per key.
BAND_PANELS = ("validation success",)
"""Per-preset panels drawn with the success rate's 95% interval as a band."""
BAND_ALPHA = 0.2
PANELS = (
    ("train success", ("train/*/success",), True),
    ("validation success", ("val/*/success",), True),
    ("loss", ("actor/pg_loss", "critic/vf_loss", "sft/loss"), False),
    ("KL", ("actor/kl", "actor/ppo_kl", "actor/kl_loss"), False),
    ("entropy", ("actor/entropy",), False),
)
PANEL_SIZE = (5.0, 3.4)  # inches per panel
MAX_COLUMNS = 3


def plot_learning_curves(metrics_jsonl: str | Path, out_png: str | Path, *,
                         title: str | None = None,
                         references: dict[str, dict[str, float]] | None = None) -> Path:
    """Draw the panels of ``PANELS`` that have data into ``out_png``; returns its path.
    ``references``: ``{preset: {"random": success, "oracle": success}}`` for the validation
    panel."""
    records = read_metrics(metrics_jsonl)
    keys = {k for record in records for k in record}
    panels = [(name, [k for p in patterns for k in matching_keys(keys, p)], per_preset)
              for name, patterns, per_preset in PANELS]
    panels = [panel for panel in panels if panel[1]]
    columns = min(MAX_COLUMNS, max(1, len(panels)))
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows), layout="constrained")
    if title:
        figure.suptitle(title)
    if not panels:
        figure.text(0.5, 0.5, "no metrics to plot", ha="center", va="center")
    for index, (name, panel_keys, per_preset) in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        for key in panel_keys:
            steps, values = _series(records, key)
            line, = axes.plot(steps, values, marker="." if len(steps) < 50 else None,
                              label=key.split("/")[1] if per_preset else key)
            if name in BAND_PANELS:
                band_steps, low, high = success_band(records, key)
                if band_steps:
                    axes.fill_between(band_steps, low, high, color=line.get_color(),
                                      alpha=BAND_ALPHA, linewidth=0)
                preset = key.split("/")[1]
                for policy, success in (references or {}).get(preset, {}).items():
                    axes.axhline(success, color=line.get_color(), linewidth=1,
                                 linestyle=REFERENCE_STYLES.get(policy, "-."),
                                 label=f"{preset} {policy}")
        axes.set_title(name)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if per_preset:
            axes.set_ylim(-0.02, 1.02)
        if per_preset or len(panel_keys) > 1:
            axes.legend(fontsize="small")
    return _save(figure, Path(out_png))


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
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
