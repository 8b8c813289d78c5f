"""The report page of an `agentrl sft` output folder: the warm start's held-out success before
and after (with random and oracle lines), its loss, the numbers of its summary and its settings.

    folder = sft_folder(Path("runs/agentrl/quick"))     # its sft/, or the folder itself; None
    write_page(sft_data(folder), folder / "report.html")

`agentrl sft` writes ``sft_summary.json`` beside its checkpoints
(:class:`agentrl.trainers.sft.SFTResult`): the held-out evaluations before the first update and
after the last, and the first and last update's loss (every update's, where it keeps a
``losses`` list). The page draws those as curves over SFT updates, on the charts a training
run's page draws (:func:`agentrl.report.data.charts`), and the per-preset table holds the
evaluation after SFT. The summary keeps no episodes, so the page shows none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SUMMARY_FILE", "sft_data", "sft_folder"]

SUMMARY_FILE = "sft_summary.json"
"""What `agentrl sft` writes into its output folder (``agentrl.trainers.sft.SUMMARY_FILE``)."""
SUFFIXES = ("success", "return", "format_error", "action_is_valid", "turns", "response_length")
SETTINGS = ("model.name", "sft.presets", "val.presets", "val.group_num", "sft.episodes",
            "sft.epochs", "sft.lr", "sft.mini_batch_size", "sft.random_action_share",
            "lora.rank", "seed")


def sft_folder(source: Path) -> Path | None:
    """The `agentrl sft` output folder ``source`` stands for: itself, or the ``sft/`` of a run
    folder that holds no training run (no metrics.jsonl); None for anything else."""
    if (source / SUMMARY_FILE).is_file():
        return source
    if (source / "sft" / SUMMARY_FILE).is_file() and not (source / "metrics.jsonl").is_file():
        return source / "sft"
    return None


def sft_data(folder: Path, *, reference_files: Iterable[str | Path] = (),
             play_references: bool = True) -> dict[str, Any]:
    """The page data (:mod:`agentrl.report.data`'s layout) of the output folder ``folder``."""
    from agentrl.evaluation.decoding import run_decoding
    from agentrl.evaluation.references import played_references
    from agentrl.evaluation.stats import rounded
    from agentrl.report.data import charts, read_references
    from agentrl.trainers.tracking import run_config

    summary = _read_summary(folder / SUMMARY_FILE)
    config = run_config(folder)
    before, after = summary.get("before") or {}, summary.get("after") or {}
    presets = list(dict.fromkeys([*(after.get("presets") or {}), *(before.get("presets") or {})]))
    updates = int(summary.get("updates") or 1)
    series: dict[str, list] = {}
    for preset in presets:
        for suffix in SUFFIXES:
            points = [[step, rounded(_metric(evaluation, preset, suffix))]
                      for step, evaluation in ((0, before), (updates, after))]
            points = [point for point in points if point[1] is not None]
            if points:
                series[f"val/{preset}/{suffix}"] = points
    every = summary.get("losses")  # each update's loss, where the summary keeps them
    if isinstance(every, list) and every:
        losses = list(enumerate(every, 1))
    else:
        losses = [(1, summary.get("first_loss")), (updates, summary.get("last_loss"))]
        losses = losses[:1 if updates == 1 else 2]
    losses = [[step, rounded(loss)] for step, loss in losses
              if isinstance(loss, (int, float)) and not isinstance(loss, bool)]
    if losses:
        series["sft/loss"] = losses
    references = read_references(reference_files)
    if play_references:
        missing = [preset for preset in presets if preset not in references]
        groups = len(after.get("seeds") or before.get("seeds") or []) or int(
            (config.get("val") or {}).get("group_num", 4))
        for preset, policies in played_references(missing, groups).items():
            references.setdefault(preset, {}).update(policies)
    table = []
    for preset in presets:
        row = {"preset": preset}
        for suffix in ("success", "return", "turns", "action_is_valid", "format_error"):
            value = rounded(_metric(after, preset, suffix))
            if value is not None:
                row[f"val_{suffix}"] = value
        for policy, reference in references.get(preset, {}).items():
            row[policy] = reference.get("success")
        table.append(row)
    rows = _flatten(config)
    extra = [("sft folder", str(folder)), ("checkpoint", str(summary.get("checkpoint"))),
             ("demonstrations", str(summary.get("demonstrations"))),
             ("reply tokens per epoch", str(summary.get("tokens_per_epoch"))),
             ("updates", str(summary.get("updates"))),
             ("loss first -> last", " -> ".join(f"{loss:.3f}" for _, loss in (
                losses[:1] + losses[1:][-1:]))),
             ("held-out success before -> after", "; ".join(
                 f"{preset} {_percent(before, preset)} -> {_percent(after, preset)}"
                 for preset in presets))]
    if config:
        extra.append(("decoding", "held-out " + run_decoding(config).describe()))
    index = dict(rows)
    first = [[key, index[key]] for key in SETTINGS if key in index]
    model = (config.get("model") or {}).get("name")
    subtitle = " · ".join(part for part in (
        f"the warm start in {folder}", model and f"model {model}", ", ".join(presets),
        "x: SFT updates (held-out games played before the first and after the last)") if part)
    return {"kind": "run", "title": f"agentrl sft {folder}", "subtitle": subtitle,
            "warm_start": 0, "charts": charts(series, presets, references),
            "config": {"summary": [*([k, v] for k, v in extra), *first], "all": rows},
            "series": series, "presets": presets, "references": references, "table": table,
            "episodes": {}, "episode_steps_total": 0}


def _read_summary(path: Path) -> dict[str, Any]:
    allowed = "allowed: the sft_summary.json agentrl sft writes"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} cannot be read as JSON ({error}); {allowed}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object; {allowed}")
    return data


def _metric(evaluation: Mapping[str, Any], preset: str, suffix: str) -> Any:
    row = (evaluation.get("presets") or {}).get(preset)
    value = row.get(suffix) if isinstance(row, Mapping) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _percent(evaluation: Mapping[str, Any], preset: str) -> str:
    value = _metric(evaluation, preset, "success")
    return "?" if value is None else f"{100 * value:.1f}%"


def _flatten(config: Any, prefix: str = "") -> list[list[str]]:
    """``key: value`` rows of a nested config as a run's page has them (the agent presets left
    out, lists as JSON)."""
    if isinstance(config, Mapping):
        return [row for key, value in config.items() if prefix or key != "agents"
                for row in _flatten(value, f"{prefix}{key}.")]
    text = json.dumps(config) if isinstance(config, (list, dict)) else str(config)
    return [[prefix[:-1], text[:300]]]
