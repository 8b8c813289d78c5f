"""The default run's evidence: bash quick_train.sh, then its held-out curve as JSON and a plot.

    python scripts/bench/quick_train.py                        # bash quick_train.sh, no arguments
    python scripts/bench/quick_train.py --out /tmp/q.json -- 0 "" "" 64 seed=1   # its arguments
    python scripts/bench/quick_train.py --from-run runs/agentrl/quick --out /tmp/quick.json
    agentrl bench quick_train [the same options]

Without ``--from-run`` it runs ``bash quick_train.sh`` (the arguments after ``--``) as a child
in the working folder, then summarizes its run folder: ``runs/<PROJECT>/<EXPERIMENT>``
(arguments 9 and 10: ``agentrl``, ``quick``) or what a ``project=``, ``experiment=`` or
``run_dir=`` override names. A folder holding ``metrics.jsonl`` is refused: quick_train.sh
would resume that run, not start one.

From ``<run>/metrics.jsonl`` (a local or a verl run's, each step's rows merged): held-out
success at each validated step (``val/<preset>/success`` and ``/episodes``, pooled over presets)
with wins and its 95% Wilson interval; each PPO step's training success, ``actor/entropy`` and
``timing/step_s`` (verl's ``timing_s/step``). The warm start is the steps that logged
``sft/loss``. Minutes: the warm start's and PPO's summed step times (training alone), and the
wall from ``run.json``'s ``created`` (after set-up and model loading) to the last row. The seed
is the newest checkpoint's (a verl run's: its config's). ``--machine`` defaults to this machine
(CPU, cores, memory, 1-minute load average at the end): with ``--from-run``, name the one that
trained. JSON goes to ``--out`` (:func:`agentrl.cli.bench.write_result`), the plot beside it
(``.png``).

Expected time: the default run 12-15 min after set-up on 2 CPU cores (2026-12-02: warm start 3.9,
PPO 7.4, wall 12.5 min at load ~1.5); ``--from-run`` a few seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from agentrl.cli.bench import write_result
from agentrl.evaluation.decoding import run_decoding
from agentrl.evaluation.stats import wilson_interval
from agentrl.report.data import run_config
from agentrl.trainers.checkpoint import latest_checkpoint
from agentrl.trainers.tracking import METRICS_FILE, RUN_FILE, read_metrics

ROOT = Path(__file__).resolve().parents[2]
VERL_STEP_S = "timing_s/step"
"""A verl step's seconds (the local engine's ``timing/step_s``)."""
HELD_OUT = "{} val games, instance-disjoint from training (agentrl.envs.splits: instance partition)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-run", metavar="DIR", help="summarize this run folder, no training")
    parser.add_argument("--out", default=f"docs/results/quick_train_{datetime.date.today()}.json",
                        help="JSON path, the plot beside it (.png); default: "
                             "docs/results/quick_train_<today>.json")
    parser.add_argument("--what", help="what ran, for the JSON (default: the command)")
    parser.add_argument("--name", help="the run's name (default: defaults, or the run folder's)")
    parser.add_argument("--machine", help="the machine (default: this CPU, cores, memory, load)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an existing --out (an evidence file is refused otherwise)")
    parser.add_argument("args", nargs="*", metavar="ARG",
                        help="quick_train.sh's arguments, after --")
    args = parser.parse_args(argv)
    if args.from_run and not (Path(args.from_run) / "metrics.jsonl").is_file():
        parser.error(f"--from-run {args.from_run}: no metrics.jsonl there, so no run folder; "
                     "allowed: a folder agentrl train wrote (runs/<project>/<experiment>)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.from_run and args.args:
        raise SystemExit("--from-run trains nothing: quick_train.sh's arguments do not apply")
    if Path(args.out).exists() and not args.force:
        raise SystemExit(f"{args.out} exists (an evidence file?): choose another --out, or --force")
    run = Path(args.from_run) if args.from_run else train(args.args)
    what = args.what or (f"the run in {run}" if args.from_run else
                         f"bash quick_train.sh {shlex.join(args.args) or '(no arguments)'}")
    name = args.name or ("defaults" if not args.from_run and not args.args else run.name)
    summary = summarize(run, what=what, name=name, machine=args.machine or this_machine())
    warm_end = summary.pop("warm_start_end")  # the plot's and the table's, not the JSON's
    stated = decoding(run)
    if stated:  # the evidence's shape stays: said in its 'what'
        summary["what"] += f"; validation decoding: {stated}"
    result = {"date": summary.pop("date"), "held_out": summary.pop("held_out"), "runs": [summary]}
    show(summary, warm_end)
    if stated:
        print(f"validation decoding: {stated}")
    path = write_result(args.out, result)
    print(f"plot: {plot(summary, warm_end, path.with_suffix('.png'))}")
    return result


def run_folder(args: list[str]) -> Path:
    """Where quick_train.sh's run writes, as scripts/positional_args.sh and the config resolve
    it: positional arguments until the first key=value, then overrides (the last one wins)."""
    args = [a for a in args if a != "--dry-run"]
    split = next((i for i, a in enumerate(args) if "=" in a), len(args))
    positional = args[:split] + [""] * 10
    keys = {"project": positional[8] or "agentrl", "experiment": positional[9] or "quick",
            "run_dir": "null"}
    for override in args[split:]:
        key, _, value = override.lstrip("+").partition("=")
        if key in keys:
            keys[key] = value
    if keys["run_dir"] in ("null", ""):
        return Path.cwd() / "runs" / keys["project"] / keys["experiment"]
    return Path(keys["run_dir"]).expanduser().absolute()


def train(args: list[str]) -> Path:
    """bash quick_train.sh as a child; its run folder. Refuses a folder it would resume."""
    script = ["bash", str(ROOT / "quick_train.sh"), *args]
    if {"--dry-run", "--help", "-h"} & set(args):  # nothing to summarize
        raise SystemExit(subprocess.run(script, check=False).returncode)
    run = run_folder(args)
    if (run / METRICS_FILE).exists():
        raise SystemExit(f"{run / METRICS_FILE} exists: quick_train.sh would resume that run. "
                         "Move the folder away, name another (EXPERIMENT, argument 10, or "
                         "run_dir=...), or summarize it with --from-run")
    code = subprocess.run(script, check=False).returncode
    if code:
        raise SystemExit(f"quick_train.sh exited with {code}; its run folder: {run}")
    return run


def summarize(run: Path, *, what: str, name: str, machine: str) -> dict[str, Any]:
    """The evidence of one run folder, from its metrics.jsonl (and run.json for the wall)."""
    path = run / METRICS_FILE
    if not path.exists():
        raise SystemExit(f"{path} not found: {run} is no run folder (no metrics.jsonl)")
    records = by_step(read_metrics(path))
    val = [v for v in map(validation, records) if v]
    if not val:
        raise SystemExit(f"{path} has no validation rows (no val/<preset>/success with "
                         "val/<preset>/episodes): was validation off (val.test_freq=0)?")
    warm_end = max((r["step"] for r in records if "sft/loss" in r), default=0)
    timed = [{**r, "timing/step_s": step_s} for r in records
             if (step_s := r.get("timing/step_s", r.get(VERL_STEP_S))) is not None]
    ppo = [{"step": r["step"], "success": pooled(r, "train")[0], "entropy": r.get("actor/entropy"),
            "step_s": r["timing/step_s"]} for r in timed if r["step"] > warm_end]
    last = datetime.datetime.fromtimestamp(records[-1]["time"])
    return {"date": last.date().isoformat(), "held_out": HELD_OUT.format(val[0]["games"]),
            "what": what, "name": name, "seed": seed(run), "val": val, "ppo_steps": ppo,
            "warm_start_step_minutes": minutes(r for r in timed if r["step"] <= warm_end),
            "ppo_step_minutes": minutes(r for r in timed if r["step"] > warm_end),
            "wall_minutes": wall_minutes(run, last), "machine": machine,
            "warm_start_end": warm_end}


def by_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, its rows merged in the order written: a verl run logs a step in
    several (its rollouts' ``train/<preset>/...``, verl's own ``timing_s/step``, validation)."""
    merged: dict[int, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]


def decoding(run: Path) -> str | None:
    """How the run's validation decoded its replies, from its resolved config (None: none)."""
    config = run_config(run)
    return run_decoding(config).describe() if config else None


def pooled(record: dict[str, Any], split: str) -> tuple[float | None, int]:
    """Success and episodes of a row's ``split``, pooled over its presets (the default has one)."""
    pairs = [(v, int(record.get(k[:-len("success")] + "episodes") or 0)) for k, v in record.items()
             if k.startswith(f"{split}/") and k.endswith("/success") and k.count("/") == 2]
    pairs = [(s, n) for s, n in pairs if s is not None and n]
    games = sum(n for _, n in pairs)
    if len(pairs) == 1:  # the logged rate itself
        return pairs[0]
    return (sum(s * n for s, n in pairs) / games if games else None), games


def validation(record: dict[str, Any]) -> dict[str, Any] | None:
    """A validated step's success, wins, games and 95% Wilson interval; None for other rows."""
    success, games = pooled(record, "val")
    if success is None:
        return None
    wins = round(success * games)
    return {"step": record["step"], "success": success, "wins": wins, "games": games,
            "ci95": [round(b, 3) for b in wilson_interval(wins, games)]}


def minutes(records) -> float:
    """Summed ``timing/step_s``: the training of these steps, not their validation."""
    return round(sum(r["timing/step_s"] for r in records) / 60, 1)


def wall_minutes(run: Path, last: datetime.datetime) -> float | None:
    """From the tracker's start (run.json's ``created``) to the last row; None without it."""
    if not (run / RUN_FILE).exists():
        return None
    created = datetime.datetime.fromisoformat(json.loads((run / RUN_FILE).read_text())["created"])
    return round((last - created).total_seconds() / 60, 1)


def seed(run: Path) -> int | None:
    """The training seed in the newest checkpoint's config, else the run's (a verl run keeps
    its config in the run folder); metrics.jsonl does not hold it."""
    checkpoint = latest_checkpoint(run)
    config = checkpoint / "config.yaml" if checkpoint else None
    if config and config.exists():
        return yaml.safe_load(config.read_text()).get("seed")
    return (run_config(run) or {}).get("seed")


def this_machine() -> str:
    """CPU model, cores, memory and the 1-minute load average now (at the end of the run)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [line.split(":", 1)[1].strip() for line in info.splitlines()
             if line.startswith("model name")]
    cpu = names[0] if names else platform.processor() or platform.machine()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return (f"{os.cpu_count()}-core {cpu}, {memory:.0f} GB; load average "
            f"{os.getloadavg()[0]:.1f} at the end")


def show(summary: dict[str, Any], warm_end: int) -> None:
    """One row a validated or PPO step, by step."""
    rows = {}
    for v in summary["val"]:
        low, high = v["ci95"]
        rows[v["step"]] = [f"{100 * v['success']:.1f}% ({100 * low:.1f}-{100 * high:.1f})",
                           f"{v['wins']}/{v['games']}", "", "", ""]
    for p in summary["ppo_steps"]:
        rows.setdefault(p["step"], [""] * 5)[2:] = [
            "-" if p["success"] is None else f"{100 * p['success']:.1f}%",
            "-" if p["entropy"] is None else f"{p['entropy']:.3f}", f"{p['step_s']:.1f}"]
    table = Table(title=f"{summary['name']}: held-out success, then PPO's steps")
    for column in ("step", "held-out success (95%)", "wins", "train success", "entropy", "step s"):
        table.add_column(column, justify="right")
    for step, cells in sorted(rows.items()):
        table.add_row(str(step), *cells)
    Console().print(table)
    print(f"warm start (steps 1-{warm_end}) {summary['warm_start_step_minutes']} min, PPO steps "
          f"{summary['ppo_step_minutes']} min, wall {summary['wall_minutes']} min")


def plot(summary: dict[str, Any], warm_end: int, path: Path) -> Path:
    """Held-out success with its interval per validated step, training success per PPO step,
    and a line where the warm start ends."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 4.0), layout="constrained")
    axes = figure.add_subplot()
    val = summary["val"]
    axes.errorbar([v["step"] for v in val], [v["success"] for v in val], capsize=4, marker="o",
                  yerr=[[v["success"] - v["ci95"][0] for v in val],
                        [v["ci95"][1] - v["success"] for v in val]],
                  label=f"held-out success ({val[0]['games']} games, 95% Wilson interval)")
    ppo = [p for p in summary["ppo_steps"] if p["success"] is not None]
    axes.plot([p["step"] for p in ppo], [p["success"] for p in ppo], ".:", alpha=0.6,
              label="training success (PPO step)")
    if warm_end:
        axes.axvline(warm_end, color="grey", linestyle="--",
                     label=f"end of the warm start (step {warm_end})")
    axes.set(xlabel="step", ylabel="success", ylim=(-0.02, 1.02),
             title=f"{summary['name']}, seed {summary['seed']}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=100)
    return path


if __name__ == "__main__":
    main()
