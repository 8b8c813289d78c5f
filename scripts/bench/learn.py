"""Does PPO teach a real pretrained model? Held-out success before and after a fixed budget.

    python scripts/bench/learn.py                        # embedded SmolLM2-135M, quickSokobanAgent
    python scripts/bench/learn.py --steps 20 --seed 3 train.group_size=8
    python scripts/bench/learn.py --steps 2 model=tiny   # a smoke run of the script itself

Runs ``agentrl train`` (the local engine, CPU preset unless overridden) for ``--steps`` steps
on the training preset with greedy validation on held-out seeds before the first step and at
the end, then prints the before/after table and the per-step training curve, and writes JSON
plus the learning-curve PNG of the run. Extra ``key=value`` arguments are config overrides.
The run folder is kept (``--run-dir``), so a stopped benchmark resumes where it was.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentrl.config import compose_config
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.tracking import read_metrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    parser.add_argument("--preset", default="quickSokobanAgent", help="agent preset to train on")
    parser.add_argument("--val-groups", type=int, default=8, help="held-out games (default 8)")
    parser.add_argument("--run-dir", default="bench_results/learn_run", help="the run folder")
    parser.add_argument("--out", default="bench_results/learn.json", help="JSON output path")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    config = compose_config([
        f"train.presets=[{args.preset}]", f"val.presets=[{args.preset}]",
        f"val.group_num={args.val_groups}", "val.group_size=1", *args.overrides,
        f"train.total_steps={args.steps}", f"val.test_freq={args.steps}", "val.before_train=true",
        f"seed={args.seed}", f"run_dir={Path(args.run_dir).resolve()}", "trainer.logger=[console]"])
    trainer = LocalTrainer(config)
    try:
        run = trainer.fit()
    finally:
        trainer.close()
    records = read_metrics(run.metrics)
    key = f"val/{args.preset}/success"
    val = {r["step"]: r[key] for r in records if r.get(key) is not None}
    curve = [(r["step"], r.get(f"train/{args.preset}/success"), r.get(f"train/{args.preset}/return"))
             for r in records if r["step"] > 0]
    result = {
        "model": config.model.name, "preset": args.preset, "seed": args.seed, "steps": args.steps,
        "episodes_per_step": config.train.group_num * config.train.group_size,
        "val_games": args.val_groups, "val_success_before": val.get(0),
        "val_success_after": val.get(args.steps), "train_curve": curve,
        "plot": str(run.plot) if run.plot else None, "run_dir": str(run.run_dir),
    }
    show(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


def show(result: dict) -> None:
    table = Table(title=f"{result['model']} on {result['preset']}: {result['steps']} steps x "
                        f"{result['episodes_per_step']} episodes, seed {result['seed']}")
    for column in ("", "held-out success", "games"):
        table.add_column(column, justify="right")
    for label, key in (("before", "val_success_before"), ("after", "val_success_after")):
        value = result[key]
        table.add_row(label, "-" if value is None else f"{100 * value:.1f}%", str(result["val_games"]))
    Console().print(table)
    print("train success / return by step:",
          ", ".join(f"{s}: {0 if x is None else x:.2f}/{0 if r is None else r:.2f}"
                    for s, x, r in result["train_curve"]))
    if result["plot"]:
        print(f"curve: {result['plot']}")


if __name__ == "__main__":
    main()
