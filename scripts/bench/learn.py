"""Does PPO teach a real pretrained model? Held-out success before and after a fixed budget.

    python scripts/bench/learn.py                        # embedded SmolLM2-135M, first-token bandit
    python scripts/bench/learn.py --preset quickSokobanAgent --steps 20 train.group_size=8
    python scripts/bench/learn.py --steps 2 model=tiny   # a smoke run of the script itself
    python scripts/bench/learn.py --preset babyaiGoTo3Agent --compare enable_think=true \
        enable_think=false                              # one run per variant, curves compared

Runs the local trainer (CPU preset unless overridden) for ``--steps`` steps on one preset,
with greedy validation on held-out seeds before the first step and at the end, then prints
the before/after table and the per-step training curve, and writes JSON plus the run's
learning-curve PNG. Extra ``key=value`` arguments are config overrides. The run folder is
kept (``--run-dir``), so a stopped benchmark resumes where it was.

``--compare VARIANT ...`` trains once per variant (agent settings ``KEY=VALUE[,KEY=VALUE]``
laid over the preset, as ``agentrl eval --compare``; each run in ``<run-dir>/<variant>``) with
the same seeds, and prints their before/after rows and curves together.

The default task, ``first-token-bandit`` (:mod:`agentrl.trainers.sanity`), is built from the
model itself: a one-token Bandit whose arms are its ``--arms`` most likely first reply tokens,
paying the least likely. Sampling with ``top_k = --arms`` starts near chance (about
``1/arms``) and greedy validation at 0, so a rise is learning, in a budget a CPU can afford.
The 135M embedded model does not yet follow the games' answer format (its format-error rate
on ``quickSokobanAgent`` is ~100%, so every return is the same and there is nothing to learn
from); a game preset needs a larger model or many more steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentrl.bench_cli import write_result
from agentrl.config import build_config, compose_config
from agentrl.models import load_model
from agentrl.trainers.local import LocalTrainer
from agentrl.trainers.sanity import first_token_bandit, likely_arms
from agentrl.trainers.tracking import read_metrics

BANDIT = "first-token-bandit"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    parser.add_argument("--preset", default=BANDIT,
                        help=f"agent preset to train on, or {BANDIT} (default)")
    parser.add_argument("--arms", type=int, default=4, help=f"arms of {BANDIT} (default 4)")
    parser.add_argument("--val-groups", type=int, default=8, help="held-out games (default 8)")
    parser.add_argument("--run-dir", default="bench_results/learn_run", help="the run folder")
    parser.add_argument("--out", default="bench_results/learn.json", help="JSON output path")
    parser.add_argument("--compare", nargs="+", default=None, metavar="VARIANT",
                        help="agent settings to train with, one run each: KEY=VALUE[,KEY=VALUE]")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser.parse_args(argv)


def variant_overrides(preset: str, text: str) -> list[str]:
    """``enable_think=false`` -> ``agents.<preset>.enable_think=false`` (checked first)."""
    from agentrl.compare import parse_variant

    variant = parse_variant(text)
    return [f"agents.{preset}.{key}={value}" for key, value in
            (pair.split("=", 1) for pair in text.split(",") if pair.strip())
            if key.strip() in variant.settings]


def compare_main(argv: list[str] | None = None) -> list[dict]:
    """One ``main`` run per ``--compare`` variant; their tables and curves printed together."""
    args = parse_args(argv)
    if args.preset == BANDIT:
        raise SystemExit(f"--compare needs an agent preset (--preset), not {BANDIT}")
    results = []
    for text in args.compare:
        run_dir = Path(args.run_dir) / text.replace("=", "-").replace(",", "_")
        out = Path(args.out).with_name(f"{Path(args.out).stem}-{run_dir.name}.json")
        argv_variant = ["--preset", args.preset, "--steps", str(args.steps), "--seed",
                        str(args.seed), "--val-groups", str(args.val_groups), "--run-dir",
                        str(run_dir), "--out", str(out), *args.overrides,
                        *variant_overrides(args.preset, text)]
        results.append({"variant": text, **main(argv_variant)})
    print("\n".join(f"{r['variant']}: held-out success {r['val_success_before']} -> "
                    f"{r['val_success_after']}; train success by step "
                    f"{[round(x or 0.0, 2) for _, x, _ in r['train_curve']]}" for r in results))
    write_result(args.out, {"compare": results})
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    config = compose_config([
        f"val.group_num={args.val_groups}", "val.group_size=1", *args.overrides,
        f"train.total_steps={args.steps}", f"val.test_freq={args.steps}", "val.before_train=true",
        f"seed={args.seed}", f"run_dir={Path(args.run_dir).resolve()}", "trainer.logger=[console]"])
    data = config.to_dict()
    if args.preset == BANDIT:
        model, tokenizer = load_model(config.model.name, dtype=config.model.dtype,
                                      chat_template=config.model.chat_template)
        data["agents"] = {BANDIT: first_token_bandit(likely_arms(model, tokenizer, args.arms))}
        data["rollout"].update(top_k=args.arms, max_new_tokens=1,
                               constrained_actions=False)  # the first free token is the task
        del model
    data["train"]["presets"] = data["val"]["presets"] = [args.preset]
    config = build_config(data)
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
        "arms": list(config.agents[args.preset].env_kwargs.get("arms", ())) if args.preset == BANDIT else None,
        "episodes_per_step": config.train.group_num * config.train.group_size,
        "val_games": args.val_groups, "val_success_before": val.get(0),
        "val_success_after": val.get(args.steps), "train_curve": curve,
        "plot": str(run.plot) if run.plot else None, "run_dir": str(run.run_dir),
    }
    show(result)
    write_result(args.out, result)
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
    compare_main() if "--compare" in sys.argv else main()
