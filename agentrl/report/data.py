"""What the report page shows, gathered from a run folder or an ``agentrl eval --out`` file into
one JSON-able dict (the page's embedded data).

- **Config summary**: ``<run_dir>/config.yaml`` (verl runs) or the newest checkpoint's
  ``config.yaml`` (local runs), flattened to ``key: value`` rows (the agent presets left out),
  after the run's best checkpoint by held-out validation (``checkpoints/best.json``).
- **Curves**: ``metrics.jsonl``: per preset ``success``, ``return``, ``format_error``,
  ``action_is_valid``, ``turns``, ``response_length`` (train and val), and the trainer's health
  and losses, values rounded to 4 significant digits; drawn as the charts of :func:`charts`, the
  panels of the learning-curve PNG (:data:`agentrl.trainers.plots.PANELS`: each on its own
  axes, rates on [0, 1], a KL 0 on every step left out), the warm start
  (``train.sft_steps``) marked.
- **Reference lines**: random and oracle success per preset, from ``agentrl eval --policy
  random|oracle --out FILE`` results given with ``--reference``, and (unless turned off) from
  the oracle and random policies played now on the run's own validation seeds
  (:func:`agentrl.evaluation.evaluate`, text level, no model: seconds for grid games).
- **Per-preset table**: the last and best validation success, return, turns, valid-action and
  format-error rates, the last training success, and the references.
- **Episodes**: ``episodes/step_N.jsonl`` of at most ``max_episode_steps`` steps, evenly spread
  and always with the first and the last, so a 1,000-step run gives a page of a few MB at most.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.evaluation.decoding import run_decoding
from agentrl.evaluation.references import REFERENCE_POLICIES, played_references
from agentrl.evaluation.stats import rounded
from agentrl.trainers.checkpoint import read_best
from agentrl.trainers.episode_log import read_episodes, step_files
from agentrl.trainers.plots import PANELS, panel_keys, run_title, warm_start_steps, y_limits
from agentrl.trainers.tracking import read_metrics, run_config

__all__ = ["CURVE_SUFFIXES", "TRAINER_KEYS", "charts", "eval_data", "read_eval_file", "run_data",
           "spread"]

CURVE_SUFFIXES = ("success", "return", "format_error", "action_is_valid", "turns",
                  "response_length")
"""Per-preset metrics drawn (``train/<preset>/<suffix>`` and ``val/<preset>/<suffix>``)."""
EXTRA_CHARTS = (("grad norm", ("actor/grad_norm",), "gradient norm before clipping", "positive"),
                ("seconds a step", ("timing/step_s", "timing_s/step"), "seconds", "positive"))
"""Charts of the page beyond the PNG's panels: (title, keys, y label, range kind)."""
TRAINER_KEYS = tuple(dict.fromkeys(
    [p for panel in PANELS if not panel.per_preset for p in panel.patterns]
    + [key for _, keys, _, _ in EXTRA_CHARTS for key in keys]))
"""Trainer metrics drawn when present (local and verl names)."""
SUFFIX_CHARTS = {"return": ("return", "return per episode", "value"),
                 "format_error": ("format error", "share of replies", "rate"),
                 "action_is_valid": ("valid actions", "share of actions", "rate"),
                 "turns": ("turns", "turns per episode", "positive"),
                 "response_length": ("reply length", "tokens per reply", "positive")}
"""Per-preset metrics other than success: (title, y label, range kind), train and val lines."""
SUMMARY_KEYS = ("experiment", "backend", "model.name", "train.presets", "val.presets",
                "train.total_steps", "train.group_num", "train.group_size", "val.group_num",
                "val.test_freq", "algorithm.adv_estimator", "actor.lr", "rollout.temperature",
                "rollout.max_new_tokens", "seed")
"""Config keys shown first (the rest follow under 'all settings')."""
DEFAULT_MAX_EPISODE_STEPS = 40


def spread(items: Sequence[int], count: int) -> list[int]:
    """At most ``count`` of ``items`` (sorted), evenly spaced, with the first and the last."""
    items = sorted(items)
    if len(items) <= count:
        return items
    if count <= 1:
        return items[-1:]
    picks = {items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)}
    return sorted(picks)


def _flatten(config: Any, prefix: str = "") -> list[list[str]]:
    rows = []
    if isinstance(config, Mapping):
        for key, value in config.items():
            if not prefix and key == "agents":
                continue  # every preset's settings: long, and in configs/agents.yaml
            rows += _flatten(value, f"{prefix}{key}.")
        return rows
    text = json.dumps(config) if isinstance(config, (list, dict)) else str(config)
    return [[prefix[:-1], text[:300]]]


def _summary(config: Mapping[str, Any], extra: Iterable[tuple[str, str]] = ()) -> dict:
    rows = _flatten(config)
    index = {key: value for key, value in rows}
    first = [[key, index[key]] for key in SUMMARY_KEYS if key in index]
    return {"summary": [*([k, v] for k, v in extra), *first], "all": rows}


def _curves(records: list[dict[str, Any]]) -> dict[str, Any]:
    keys = sorted({k for r in records for k in r
                   if (k.split("/")[0] in ("train", "val") and k.count("/") == 2
                       and k.rsplit("/", 1)[1] in CURVE_SUFFIXES) or k in TRAINER_KEYS})
    series = {}
    for key in keys:
        points = [[r["step"], rounded(r[key])] for r in records if rounded(r.get(key)) is not None]
        if points:
            series[key] = points
    return series


def charts(series: Mapping[str, list], presets: Sequence[str],
           references: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The page's charts: ``{"title", "ylabel", "y": [low, high] or None (the data's own),
    "lines": [{"key", "name", "split"}], "refs": [{"name", "value", "policy"}]}``. Success per
    preset (train and held-out, the random and oracle lines), the other per-preset metrics, then
    the PNG's health and loss panels, each on its own axes."""
    made = []

    def add(title, ylabel, kind, lines, refs=()):
        lines = [line for line in lines if series.get(line["key"])]
        if not lines:
            return
        values = [p[1] for line in lines for p in series[line["key"]]]
        limits = (0, 1) if kind == "rate" else y_limits(kind, values)  # the page draws no margin
        made.append({"title": title, "ylabel": ylabel, "lines": lines, "refs": list(refs),
                     "y": None if limits is None else [_tidy(v) for v in limits]})

    for preset in presets:
        refs = [{"name": f"{policy} ({ref['success']})", "value": ref["success"],
                 "policy": policy}
                for policy, ref in references.get(preset, {}).items()
                if ref.get("success") is not None]
        add(f"success: {preset}", "success rate (train sampled, val greedy)", "rate",
            [{"key": f"{split}/{preset}/success", "name": f"{split} success", "split": split}
             for split in ("train", "val")], refs)
    for suffix, (title, ylabel, kind) in SUFFIX_CHARTS.items():
        add(title, ylabel, kind,
            [{"key": f"{split}/{preset}/{suffix}", "name": f"{split} {preset}", "split": split}
             for preset in presets for split in ("train", "val")])
    records = _records(series)
    for panel, keys in panel_keys(records)[0]:
        if not panel.per_preset:
            add(panel.title, panel.ylabel, panel.kind,
                [{"key": key, "name": key, "split": ""} for key in keys])
    for title, keys, ylabel, kind in EXTRA_CHARTS:
        add(title, ylabel, kind, [{"key": key, "name": key, "split": ""} for key in keys])
    return made


def _records(series: Mapping[str, list]) -> list[dict[str, Any]]:
    """The series back as per-step records (what :func:`panel_keys` reads)."""
    by_step: dict[int, dict[str, Any]] = {}
    for key, points in series.items():
        for step, value in points:
            by_step.setdefault(step, {"step": step})[key] = value
    return [by_step[step] for step in sorted(by_step)]


def _tidy(value: float) -> float | int:
    """A range end as the page writes it: 0 and 1, not 0.0 and 1.0."""
    return int(value) if float(value).is_integer() else rounded(value)


def _presets(series: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    named = [*config.get("train", {}).get("presets", []), *config.get("val", {}).get("presets", [])]
    found = [key.split("/")[1] for key in series if key.count("/") == 2
             and key.split("/")[0] in ("train", "val")]
    return list(dict.fromkeys([*named, *found]))


def read_references(paths: Iterable[str | Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{preset: {policy: {"success": s, "return": r, "source": file}}}`` from eval files of
    the random or oracle policy (other policies' files are skipped)."""
    references: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        data = read_eval_file(path, "--reference")
        policy = data.get("policy")
        if policy not in REFERENCE_POLICIES:
            continue
        for preset, row in data["presets"].items():
            references.setdefault(preset, {})[policy] = {
                "success": rounded(row.get("success")), "return": rounded(row.get("return")),
                "source": Path(path).name}
    return references


def _check_reference_presets(paths: Iterable[str | Path], presets: Sequence[str]) -> None:
    """A reference file that names none of the run's presets would draw nothing: say so."""
    for path in paths:
        data = read_eval_file(path, "--reference")
        if data.get("policy") in REFERENCE_POLICIES and presets and not set(data["presets"]) & set(
                presets):
            raise ValueError(f"--reference {path}: its presets ({', '.join(data['presets'])}) "
                             f"are none of this run's; allowed: an `agentrl eval --policy "
                             f"random|oracle --out` file of {', '.join(presets)}")


def _merge(*sources: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for source in sources:  # later sources win
        for preset, policies in source.items():
            merged.setdefault(preset, {}).update(policies)
    return merged


def _table(presets: Sequence[str], series: Mapping[str, list], references: Mapping) -> list:
    rows = []
    for preset in presets:
        row: dict[str, Any] = {"preset": preset}
        val = series.get(f"val/{preset}/success", [])
        if val:
            row["val_success"] = val[-1][1]
            best = max(val, key=lambda point: point[1])
            row["best_val_success"], row["best_step"] = best[1], best[0]
        for suffix in ("return", "turns", "action_is_valid", "format_error"):
            points = series.get(f"val/{preset}/{suffix}", [])
            if points:
                row[f"val_{suffix}"] = points[-1][1]
        train = series.get(f"train/{preset}/success", [])
        if train:
            row["train_success"] = train[-1][1]
        for policy in REFERENCE_POLICIES:
            ref = references.get(preset, {}).get(policy)
            if ref is not None:
                row[policy] = ref["success"]
        rows.append(row)
    return rows


def run_data(run_dir: str | Path, *, reference_files: Iterable[str | Path] = (),
             play_references: bool = True,
             max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS) -> dict[str, Any]:
    """The page data of a training run folder (local or verl: the same files)."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file() and not step_files(run_dir):
        raise ValueError(f"{run_dir} has neither metrics.jsonl nor episodes/: not a run folder "
                         "(or an `agentrl eval --out` file)")
    config = run_config(run_dir)
    run = {}
    if (run_dir / "run.json").is_file():
        run = json.loads((run_dir / "run.json").read_text())
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
    except (TypeError, ValueError) as error:  # a line not of agentrl's metrics
        raise ValueError(f"{error}; allowed: metrics.jsonl as agentrl train writes it (one "
                         "JSON object a line, each with an integer 'step')") from None
    series = _curves(records)
    presets = _presets(series, config)
    references = read_references(reference_files)
    _check_reference_presets(reference_files, presets)
    if play_references:
        val_presets = [p for p in presets if p not in references]
        groups = int(config.get("val", {}).get("group_num", 4))
        references = _merge(played_references(val_presets, groups), references)
    steps = spread(list(step_files(run_dir)), max_episode_steps)
    episodes = {step: recs for step, recs in read_episodes(run_dir).items() if step in steps}
    last_step = records[-1]["step"] if records else None
    extra = [("run folder", str(run_dir)), ("run id", str(run.get("run_id", "?"))),
             ("steps logged", str(last_step))]
    if config:
        extra.append(("decoding", "validation " + run_decoding(config).describe()))
    extra.append(("best checkpoint", _best_checkpoint(run_dir)))
    return {"kind": "run", "title": f"agentrl run {run.get('run_id') or run_dir.name}",
            "subtitle": run_title(run_dir, config, presets),
            "warm_start": warm_start_steps(records, config),
            "charts": charts(series, presets, references),
            "config": _summary(config, extra), "series": series, "presets": presets,
            "references": references, "table": _table(presets, series, references),
            "episodes": {str(step): recs for step, recs in episodes.items()},
            "episode_steps_total": len(step_files(run_dir))}


def _best_checkpoint(run_dir: Path) -> str:
    """The run's best checkpoint by held-out validation, which a run folder stands for."""
    try:
        best = read_best(run_dir)
    except ValueError as error:
        return f"unreadable: {error}"
    if best is None:
        return "none recorded (the run folder stands for its newest)"
    return (f"step {best.step}, held-out success {100 * best.val_success:.1f}% "
            "(checkpoints/best.json; eval and play take it)")


def read_eval_file(path: str | Path, flag: str = "") -> dict[str, Any]:
    """An ``agentrl eval --out`` file's JSON, checked: an object whose ``presets`` maps each
    preset to an object of its metrics. ``ValueError`` naming the file (and ``flag``)."""
    path = Path(path)
    name = f"{flag} {path}".strip()
    allowed = "allowed: a JSON file `agentrl eval --out` wrote"
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"{name}: cannot be read ({error.strerror}); {allowed}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{name} is not JSON ({error}); {allowed}") from None
    presets = data.get("presets") if isinstance(data, dict) else None
    if not isinstance(presets, dict) or not all(isinstance(r, dict) for r in presets.values()):
        raise ValueError(f"{name} is not an `agentrl eval --out` file ('presets' is "
                         f"{type(presets).__name__}, not an object of per-preset metrics); "
                         f"{allowed}")
    return data


def eval_data(path: str | Path) -> dict[str, Any]:
    """The page data of an ``agentrl eval --out`` file: its table and its episodes."""
    path = Path(path)
    data = read_eval_file(path)
    presets = list(data["presets"])
    table = []
    for preset, row in data["presets"].items():
        table.append({"preset": preset, "val_success": rounded(row.get("success")),
                      "val_return": rounded(row.get("return")),
                      "val_turns": rounded(row.get("turns")),
                      "val_action_is_valid": rounded(row.get("action_is_valid")),
                      "val_format_error": rounded(row.get("format_error"))})
    model = data.get("model", {}).get("name") if isinstance(data.get("model"), dict) else None
    extra = [("file", str(path)), ("policy", str(model or data.get("policy"))),
             ("split", str(data.get("split"))), ("seeds", str(data.get("seeds"))),
             ("group size", str(data.get("group_size")))]
    decoding = data.get("decoding")
    if isinstance(decoding, dict) and isinstance(decoding.get("description"), str):
        extra.append(("decoding", decoding["description"]))
    elif data.get("policy") not in REFERENCE_POLICIES:
        extra.append(("decoding", "not recorded (a file of an older agentrl eval)"))
    return {"kind": "eval", "title": f"agentrl eval {path.name}",
            "config": {"summary": [[k, v] for k, v in extra], "all": []}, "series": {},
            "subtitle": "", "warm_start": 0, "charts": [],
            "presets": presets, "references": {}, "table": table,
            "episodes": {"eval": data.get("episodes", [])}, "episode_steps_total": 1}
