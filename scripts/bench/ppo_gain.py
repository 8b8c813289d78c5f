"""What does PPO add to the warm start? ``sft`` against ``sft_ppo``, paired on the same games.

    python scripts/bench/ppo_gain.py                      # tightBlocksworldTurnsAgent, 3 seeds
    python scripts/bench/ppo_gain.py --only-seed 0 threads=1
    python scripts/bench/ppo_gain.py --seeds 1 --steps 1 --val-groups 2 --sft-episodes 4 \\
        --sft-epochs 1 --groups 1 --group-size 2 model=tiny threads=1     # a smoke run
    agentrl bench ppo_gain [the same options]

Per training seed:

1. **Warm start**: the learning benchmark's SFT stage (scripts/bench/learn.py: oracle
   demonstrations, ``--sft-episodes`` x ``--sft-epochs``), in ``<--run-dir>/sft/``.
2. **PPO from it** (learn.py's PPO stage) for ``--steps`` steps or ``--minutes`` of training,
   whichever ends first, ``--groups`` games x ``--group-size`` episodes a step (the pool
   benchmark's 4 x 8 by default: groups of 8 see a spread where groups of 4 see none), in
   ``<--run-dir>/sft_ppo@<groups>x<group-size>/``.
3. **Paired evaluation**: both models play the same ``--val-groups`` instance-disjoint held-out
   games greedy (constrained decoding, as PPO validates), one episode a game, each game's win
   recorded (``<--run-dir>/paired/<model>/``).

Reported per seed and over the seeds: both success rates; ``gain = sft_ppo - sft`` with the 95%
interval of the paired difference; McNemar's exact test (the games one won and the other lost);
the PPO run's health numbers (explained variance, clip fraction, KL, entropy per real choice).
Over the seeds: the mean gain, and the interval and McNemar test of all seeds' games pooled.
The goal (the issue's): a mean gain of at least :data:`GOAL` (+10 points). JSON to ``--out``
(``gain`` per seed and on the mean, ``games`` per seed, each game's wins), the plot beside it.

Stages resume as the learning benchmark's (``stage.json`` per folder; other settings refused);
the warm start is not PPO's budget (uncapped). Checkpoints this process trained are deleted at
its end unless ``--keep-checkpoints``.

Expected time (embedded SmolLM2-135M, 2 CPU cores, load ~2): a warm start of 192 demonstrations
x 1 epoch ~20-25 min, a PPO step of 32 episodes ~100 s, 128 greedy held-out games ~4 min, so a
seed is about 25 + 27 + 2 x 4 = 60 min at 16 steps; ``--only-seed`` splits the seeds over
processes sharing ``--run-dir``.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from agentrl.cli.bench import script_module, write_result
from agentrl.evaluation.stats import mcnemar, paired_difference

LEARN = script_module(Path(__file__).parent / "learn.py")
"""The warm-start and PPO stages, their configs and stage records (scripts/bench/learn.py)."""
MODELS = ("sft", "sft_ppo")
GOAL = 0.10
"""The mean paired gain of ``sft_ppo`` over ``sft`` the issue asks for."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tightBlocksworldTurnsAgent")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds (default 3)")
    parser.add_argument("--only-seed", type=int, action="append", default=None, metavar="S",
                        help="run only training seed S of the --seeds (repeatable)")
    parser.add_argument("--steps", type=int, default=16,
                        help="PPO steps (default 16: ~27 min at ~100 s a step)")
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="PPO's training wall budget per seed (default 30)")
    parser.add_argument("--groups", type=int, default=4,
                        help="games a PPO step plays (default 4)")
    parser.add_argument("--group-size", type=int, default=8,
                        help="episodes per game and step (default 8)")
    parser.add_argument("--sft-episodes", type=int, default=192,
                        help="warm-start demonstrations (default 192, quick_train.sh's)")
    parser.add_argument("--sft-epochs", type=int, default=1, help="warm-start epochs (default 1)")
    parser.add_argument("--val-groups", type=int, default=128,
                        help="held-out games, the same for both models (default 128)")
    parser.add_argument("--run-dir", default="bench_results/ppo_gain_runs",
                        help="folder of the stage folders (reused: a stopped benchmark resumes)")
    parser.add_argument("--out", default="bench_results/learn_ppo.json",
                        help="JSON output path; the plot goes beside it as .png")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep the checkpoints of the stages this run trains")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides of every stage")
    args = parser.parse_args(argv)
    for name in ("seeds", "steps", "groups", "group_size", "sft_episodes", "sft_epochs",
                 "val_groups"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    if args.only_seed and not all(0 <= seed < args.seeds for seed in args.only_seed):
        parser.error(f"--only-seed must be a training seed of --seeds {args.seeds}: "
                     f"0..{args.seeds - 1}")
    args.run_dir = Path(args.run_dir).resolve()
    args.val_every, args.arms = args.steps, 4  # what learn.py's stages read from its arguments
    return args


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Both models of one training seed, their paired held-out wins and the comparison."""
    def configs(**changes: Any) -> Any:
        return LEARN.Configs(argparse.Namespace(**{**vars(args), **changes}))

    ppo_configs = configs()
    paired_configs = configs(run_dir=args.run_dir / "paired")
    folders = {name: args.run_dir / "paired" / name / f"seed_{seed}" for name in MODELS}
    lever = (f"{args.groups}x{args.group_size}",
             [f"train.group_num={args.groups}", f"train.group_size={args.group_size}"])
    ppo_folder = args.run_dir / f"sft_ppo@{lever[0]}" / f"seed_{seed}"
    evaluated = all((folders[name] / LEARN.STAGE_FILE).is_file() for name in MODELS)
    warm = LEARN.sft_stage(configs(minutes=None), seed, need_checkpoint=not evaluated)
    paired = {"sft": LEARN.paired_stage(paired_configs, folders["sft"], "sft", seed,
                                        warm["checkpoint"], args)}
    # PPO's whole --minutes: the warm start is not its budget (as scripts/bench/pool.py)
    ppo = LEARN.ppo_stage(ppo_configs, "sft_ppo", seed, {**warm, "train_minutes": 0.0}, lever)
    paired["sft_ppo"] = LEARN.paired_stage(paired_configs, folders["sft_ppo"], "sft_ppo", seed,
                                           ppo["checkpoint"], args)
    wins = {name: paired[name]["wins"] for name in MODELS}
    gain, interval = paired_difference(wins["sft_ppo"], wins["sft"])
    records = LEARN.read_metrics(ppo_folder / "metrics.jsonl")
    return {"seed": seed, **{name: paired[name]["success"] for name in MODELS},
            "gain": gain, "gain_ci95": list(interval),
            "mcnemar": mcnemar(wins["sft_ppo"], wins["sft"]), "wins": wins,
            "games": len(wins["sft"]), "ppo_steps": ppo["steps"],
            "ppo_train_minutes": ppo["train_minutes"], "ppo_validation": ppo["after"],
            "health": LEARN.health_of(records),
            "explained_variance_pooled": LEARN.pooled_explained_variance(records),
            "val_curve": ppo["val_curve"], "train_curve": ppo["train_curve"]}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over seeds, and every seed's games pooled: the paired interval and McNemar."""
    wins = {name: [w for r in runs for w in r["wins"][name]] for name in MODELS}
    gain, interval = paired_difference(wins["sft_ppo"], wins["sft"])
    return {**{name: statistics.fmean(r[name] for r in runs) for name in MODELS},
            "gain": statistics.fmean(r["gain"] for r in runs),
            "pooled": {"gain": gain, "gain_ci95": list(interval), "games": len(wins["sft"]),
                       **mcnemar(wins["sft_ppo"], wins["sft"])}}


# -- output --------------------------------------------------------------------------------------
def show(result: dict[str, Any]) -> None:
    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print(f"{'seed':>5} {'sft':>6} {'+PPO':>6} {'gain':>7} {'95% interval':>16} "
          f"{'won/lost':>9} {'p':>6} {'steps':>5} {'EV':>6} {'clip':>6} {'KL':>7} {'entropy':>7}")
    for r in result["runs"]:
        h, test = r["health"], r["mcnemar"]
        low, high = r["gain_ci95"]
        print(f"{r['seed']:>5} {r['sft']:>6.1%} {r['sft_ppo']:>6.1%} {r['gain']:>+7.1%} "
              f"{f'[{low:+.1%}, {high:+.1%}]':>16} {test['only_a']:>4}/{test['only_b']:<4} "
              f"{test['p']:>6.3f} {r['ppo_steps']:>5} "
              f"{cell(h['critic/vf_explained_var'], '>6.3f')} "
              f"{cell(h['actor/pg_clipfrac'], '>6.3f')} {cell(h['actor/ppo_kl'], '>7.4f')} "
              f"{cell(h['actor/entropy'], '>7.3f')}")
    m, pooled = result["mean"], result["mean"]["pooled"]
    low, high = pooled["gain_ci95"]
    print(f"{'mean':>5} {m['sft']:>6.1%} {m['sft_ppo']:>6.1%} {m['gain']:>+7.1%} "
          f"{f'[{low:+.1%}, {high:+.1%}]':>16} {pooled['only_a']:>4}/{pooled['only_b']:<4} "
          f"{pooled['p']:>6.3f}")
    print(f"mean gain {m['gain']:+.1%} ({'meets' if result['passed'] else 'misses'} the goal of "
          f"{GOAL:+.0%}); {result['val_games']} held-out games a model, greedy, paired; the "
          f"interval and p pool {pooled['games']} game pairs")


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*result["runs"], {"seed": "mean", **result["mean"]}]
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    width = 0.8 / len(MODELS)
    for i, (name, label) in enumerate(zip(MODELS, ("warm start (SFT)", "SFT + PPO"))):
        ax.bar([x + (i - 0.5) * width for x in range(len(rows))], [r[name] for r in rows], width,
               label=label)
    for x, row in enumerate(rows):
        ax.annotate(f"{row['gain']:+.1%}", (x, 1.0), ha="center", fontsize=7)
    ax.set_xticks(range(len(rows)), [f"seed {r['seed']}" if r["seed"] != "mean" else "mean"
                                     for r in rows])
    ax.set(ylabel="held-out greedy success", ylim=(0, 1.08),
           title=f"What PPO adds ({result['preset']}, {result['val_games']} games, paired)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    LEARN.TRAINED_STAGES.clear()  # this call's stages only (tests call main more than once)
    runs = [run_seed(args, seed) for seed in (args.only_seed or range(args.seeds))]
    if not args.keep_checkpoints:
        LEARN.prune_checkpoints(LEARN.TRAINED_STAGES)
    mean = summarize(runs)
    result = {"preset": args.preset, "seeds": [r["seed"] for r in runs],
              "val_games": args.val_groups, "minutes": args.minutes, "steps": args.steps,
              "groups": args.groups, "group_size": args.group_size,
              "sft_episodes": args.sft_episodes, "sft_epochs": args.sft_epochs,
              "overrides": args.overrides, "goal": GOAL, "gain": mean["gain"],
              "gain_per_seed": [r["gain"] for r in runs],
              "games": [r["games"] for r in runs], "passed": mean["gain"] >= GOAL,
              "mean": mean, "runs": runs, "run_dir": str(args.run_dir)}
    show(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = str(plot(result, out.with_suffix(".png")))
    write_result(out, result)
    return result


if __name__ == "__main__":
    main()
