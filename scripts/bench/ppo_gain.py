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
   recorded (``<--run-dir>/paired/<model>/``). ``--split test`` plays the test split's games
   instead (``paired@test/``): games no lever or default was chosen on.

Reported per seed and over the seeds: both success rates; ``gain = sft_ppo - sft`` with the 95%
interval of the paired difference; McNemar's exact test (the games one won and the other lost);
the PPO run's health numbers (explained variance, clip fraction, KL, entropy per real choice).
Over the seeds: the mean gain, and, since every seed plays the same held-out games, each game's
difference averaged over the seeds: the interval of their mean and the sign test of the games
PPO won on more seeds against those it won on fewer.
The goal (the issue's): a mean gain of at least :data:`GOAL` (+10 points). JSON to ``--out``
(``gain`` per seed and on the mean, ``games`` per seed, each game's wins), the plot beside it.

``--lever NAME=KEY=VALUE[,KEY=VALUE]`` adds a PPO run from the same warm start with these
overrides on its PPO stage (``<--run-dir>/sft_ppo@<groups>x<group-size>+NAME/``), played on the
same games: its gain over ``sft`` and over ``sft_ppo``, each paired, under ``levers``.

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
import json
import statistics
from pathlib import Path
from typing import Any

from agentrl.cli.bench import script_module, write_result
from agentrl.evaluation.stats import mcnemar, paired_difference, paired_over_seeds

LEARN = script_module(Path(__file__).parent / "learn.py")
"""The warm-start and PPO stages, their configs and stage records (scripts/bench/learn.py)."""
MODELS = ("sft", "sft_ppo")
GOAL = 0.10
"""The mean paired gain of ``sft_ppo`` over ``sft`` the issue asks for."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    LEARN.add_stage_arguments(parser, steps=16,
                              steps_help="PPO steps (default 16: ~27 min at ~100 s a step)",
                              val_groups=128, run_dir="bench_results/learn_ppo_runs",
                              out="bench_results/learn_ppo.json")
    parser.add_argument("--groups", type=int, default=4,
                        help="games a PPO step plays (default 4)")
    parser.add_argument("--group-size", type=int, default=8,
                        help="episodes per game and step (default 8)")
    parser.add_argument("--lever", action="append", default=[],
                        metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                        help="one more PPO run with these overrides on its PPO stage, compared "
                             "on the same games; repeat for more levers")
    parser.add_argument("--split", choices=("val", "test"), default="val",
                        help="the held-out split the paired games are drawn from: val (what PPO "
                             "validates on; default) or test (games nothing was chosen on, "
                             "played into <run-dir>/paired@test/)")
    args = parser.parse_args(argv)
    args.levers = LEARN.parse_levers(parser, args.lever)
    if args.split != "val" and args.out == parser.get_default("out"):  # beside, not over, val's
        args.out = str(Path(args.out).with_stem(f"{Path(args.out).stem}@{args.split}"))
    if args.preset == LEARN.BANDIT:
        parser.error(f"--preset {LEARN.BANDIT} has no warm start to compare with; allowed: an "
                     "agent preset")
    return LEARN.check_stage_arguments(parser, args, positive=("groups", "group_size"))


def compared(wins: list[bool], base: list[bool]) -> dict[str, Any]:
    """``wins`` against ``base`` on the same games: the paired gain, its interval, McNemar."""
    gain, interval = paired_difference(wins, base)
    return {"gain": gain, "gain_ci95": list(interval), "mcnemar": mcnemar(wins, base)}


def paired_dir(args: argparse.Namespace) -> Path:
    """Where the paired games' records go: ``paired/`` for the val split, ``paired@<split>/``
    for another."""
    return args.run_dir / ("paired" if args.split == "val" else f"paired@{args.split}")


def paired(args: argparse.Namespace, model: str, seed: int, checkpoint: str) -> dict[str, Any]:
    """``checkpoint``'s wins on the paired games (``<paired_dir>/<model>/seed_<seed>``)."""
    folder = paired_dir(args)
    return LEARN.paired_stage(
        LEARN.Configs(argparse.Namespace(**{**vars(args), "run_dir": folder})),
        folder / model / f"seed_{seed}", model, seed, checkpoint, args, args.split)


def ppo_arm(args: argparse.Namespace, seed: int, warm: dict[str, Any], model: str, arm: str,
            overrides: list[str]) -> dict[str, Any]:
    """One PPO run from the warm start (``overrides`` on its PPO stage, in ``sft_ppo@<arm>``)
    and its paired wins (``<paired_dir>/<model>``)."""
    configs = LEARN.Configs(args)
    ppo = LEARN.ppo_stage(configs, "sft_ppo", seed, {**warm, "train_minutes": 0.0},
                          (arm, overrides))
    played = paired(args, model, seed, ppo["checkpoint"])
    records = LEARN.read_metrics(LEARN.stage_folder(args.run_dir, "sft_ppo", seed, arm)
                                 / "metrics.jsonl")
    return {"success": played["success"], "wins": played["wins"], "ppo_steps": ppo["steps"],
            "ppo_train_minutes": ppo["train_minutes"], "ppo_validation": ppo["after"],
            "health": LEARN.health_of(records), **LEARN.critic_marks(records),
            "val_curve": ppo["val_curve"], "train_curve": ppo["train_curve"]}


def require_checkpoints(args: argparse.Namespace, seed: int, to_play: dict[str, str | None]
                        ) -> None:
    """Stop before any work where a trained model whose games are still to play has lost its
    checkpoint (pruned at the end of the process that trained it): training it again could give
    another model, paired against runs from the first. ``to_play``: model -> its PPO arm (None:
    the warm start)."""
    lost = []
    for model, arm in to_play.items():
        folder = LEARN.stage_folder(args.run_dir, "sft" if arm is None else "sft_ppo", seed, arm)
        if (folder / LEARN.STAGE_FILE).is_file():
            record = json.loads((folder / LEARN.STAGE_FILE).read_text())
            if not LEARN.located(args, record["checkpoint"]).is_dir():
                lost.append(f"{model} ({folder / LEARN.STAGE_FILE})")
    if lost:
        raise SystemExit(f"seed {seed}: {', '.join(lost)} trained without a kept checkpoint, and "
                         f"its games on the {args.split} split are still to play; train with "
                         "--keep-checkpoints (or restore the checkpoints), or use a new --run-dir")


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The warm start, PPO from it (and each lever's), their paired held-out wins compared."""
    size = f"{args.groups}x{args.group_size}"
    base = [f"train.group_num={args.groups}", f"train.group_size={args.group_size}"]
    arms = {"sft_ppo": (size, base), **{f"sft_ppo+{name}": (f"{size}+{name}", [*base, *overrides])
                                        for name, overrides in args.levers.items()}}
    to_play = [model for model in ("sft", *arms)
               if not (paired_dir(args) / model / f"seed_{seed}" / LEARN.STAGE_FILE).is_file()]
    require_checkpoints(args, seed, {model: arms[model][0] if model in arms else None
                                     for model in to_play})
    evaluated = not to_play
    warm = LEARN.sft_stage(LEARN.Configs(argparse.Namespace(**{**vars(args), "minutes": None})),
                           seed, need_checkpoint=not evaluated)
    sft = paired(args, "sft", seed, warm["checkpoint"])
    # PPO's whole --minutes: the warm start is not its budget (as scripts/bench/pool.py)
    ppo, *lever_runs = (ppo_arm(args, seed, warm, model, arm, overrides)
                        for model, (arm, overrides) in arms.items())
    levers = {name: {**run, **compared(run["wins"], sft["wins"]),
                     "vs_sft_ppo": compared(run["wins"], ppo["wins"])}
              for name, run in zip(args.levers, lever_runs)}
    return {"seed": seed, "sft": sft["success"], "sft_ppo": ppo["success"],
            **compared(ppo["wins"], sft["wins"]),
            "wins": {"sft": sft["wins"], "sft_ppo": ppo["wins"]}, "games": len(sft["wins"]),
            **{key: value for key, value in ppo.items() if key not in ("success", "wins")},
            **({"levers": levers} if levers else {})}


def pooled(runs: list[dict[str, Any]], wins_of: Any, base_of: Any) -> dict[str, Any]:
    """Every seed at once, game by game (:func:`~agentrl.evaluation.stats.paired_over_seeds`)."""
    return paired_over_seeds([wins_of(r) for r in runs], [base_of(r) for r in runs])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over seeds, and every game's difference averaged over the seeds (:func:`pooled`)."""
    gains = [r["gain"] for r in runs]
    mean = {**{name: statistics.fmean(r[name] for r in runs) for name in MODELS},
            "gain": statistics.fmean(gains),
            # how much the gain moves with the training seed: the pooled interval leaves it out
            "gain_seed_sd": statistics.stdev(gains) if len(gains) > 1 else None,
            "pooled": pooled(runs, lambda r: r["wins"]["sft_ppo"], lambda r: r["wins"]["sft"])}
    names = runs[0].get("levers", {})
    if names:
        mean["levers"] = {name: {
            "success": statistics.fmean(r["levers"][name]["success"] for r in runs),
            "gain": statistics.fmean(r["levers"][name]["gain"] for r in runs),
            "pooled": pooled(runs, lambda r: r["levers"][name]["wins"],
                             lambda r: r["wins"]["sft"]),
            "vs_sft_ppo": pooled(runs, lambda r: r["levers"][name]["wins"],
                                 lambda r: r["wins"]["sft_ppo"])} for name in names}
    return mean


# -- output --------------------------------------------------------------------------------------
def show(result: dict[str, Any]) -> None:
    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def line(seed: Any, label: str, sft: float, success: float, row: dict[str, Any],
             test: tuple[int, int, float], run: dict[str, Any] | None) -> None:
        low, high = row["gain_ci95"]
        h = run["health"] if run else {}
        steps = run["ppo_steps"] if run else ""
        print(f"{seed!s:>5} {label:<12} {sft:>6.1%} {success:>6.1%} {row['gain']:>+7.1%} "
              f"{f'[{low:+.1%}, {high:+.1%}]':>16} {test[0]:>4}/{test[1]:<4} "
              f"{test[2]:>6.3f} {steps!s:>5} "
              f"{cell(run.get('explained_variance_from_step_5') if run else None, '.3f'):>6} "
              f"{cell(h.get('actor/pg_clipfrac'), '.3f'):>6} "
              f"{cell(h.get('actor/ppo_kl'), '.4f'):>7} {cell(h.get('actor/entropy'), '.3f'):>7}")

    print(f"{'seed':>5} {'PPO run':<12} {'sft':>6} {'+PPO':>6} {'gain':>7} {'95% interval':>16} "
          f"{'won/lost':>9} {'p':>6} {'steps':>5} {'EV':>6} {'clip':>6} {'KL':>7} {'entropy':>7}")
    size = f"{result['groups']}x{result['group_size']}"
    def counts(test: dict[str, Any]) -> tuple[int, int, float]:
        return test["only_a"], test["only_b"], test["p"]

    def games(pooled: dict[str, Any]) -> tuple[int, int, float]:
        return pooled["better"], pooled["worse"], pooled["p"]

    def over_seeds(pooled: dict[str, Any]) -> str:
        interval = pooled.get("seed_ci95")  # absent from results made before it was kept
        if interval is None:
            return ""
        return f" (seeds as units [{interval[0]:+.1%}, {interval[1]:+.1%}])"

    for r in result["runs"]:
        line(r["seed"], size, r["sft"], r["sft_ppo"], r, counts(r["mcnemar"]), r)
        for name, lever in r.get("levers", {}).items():
            line(r["seed"], f"+{name}", r["sft"], lever["success"], lever,
                 counts(lever["mcnemar"]), lever)
    m = result["mean"]
    line("mean", size, m["sft"], m["sft_ppo"], m["pooled"], games(m["pooled"]), None)
    for name, lever in m.get("levers", {}).items():
        line("mean", f"+{name}", m["sft"], lever["success"], lever["pooled"],
             games(lever["pooled"]), None)
        vs = lever["vs_sft_ppo"]
        print(f"  +{name} against {size} on the same games: {vs['gain']:+.1%} "
              f"[{vs['gain_ci95'][0]:+.1%}, {vs['gain_ci95'][1]:+.1%}]{over_seeds(vs)}, "
              f"games better/worse {vs['better']}/{vs['worse']}, p {vs['p']:.3f}")
    spread = ("" if m["gain_seed_sd"] is None
              else f", sd {m['gain_seed_sd']:.1%} over the seeds{over_seeds(m['pooled'])}")
    verdict = "meets" if result["passed"] else "misses"
    print(f"mean gain {m['gain']:+.1%}{spread} ({verdict} the goal of {GOAL:+.0%}); "
          f"{result['val_games']} held-out games ({result['split']} split) a model, greedy, "
          "paired. Per seed: won/lost = games only PPO / only the warm start won, McNemar's p; "
          f"EV from step {LEARN.EV_FROM} on, clip, KL and entropy per real choice over all steps; "
          "mean rows: "
          "each game's difference averaged over the seeds (the same games every seed), "
          "better/worse = games PPO won on more / fewer seeds, the sign test's p; seeds as "
          "units: Student's t interval of the per-seed gains, which a run-to-run spread widens")


LEGEND_COLUMNS = 3
"""Labels a legend row holds within the plot's width (a lever's label is ~20 characters)."""


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*result["runs"], {"seed": "mean", **result["mean"]}]
    bars = [("warm start (SFT)", lambda r: r["sft"]), ("SFT + PPO", lambda r: r["sft_ppo"])]
    bars += [(f"SFT + PPO +{name}", lambda r, name=name: r["levers"][name]["success"])
             for name in result["levers"]]
    legend_rows = -(-len(bars) // LEGEND_COLUMNS)
    fig, ax = plt.subplots(figsize=(6.5, 3.6 + 0.2 * legend_rows))
    width = 0.8 / len(bars)
    for i, (label, value) in enumerate(bars):
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(rows))],
               [value(r) for r in rows], width, label=label)
    for x, row in enumerate(rows):
        ax.annotate(f"PPO {row['gain']:+.1%}", (x, 1.0), ha="center", fontsize=7)
    ax.set_xticks(range(len(rows)), [f"seed {r['seed']}" if r["seed"] != "mean" else "mean"
                                     for r in rows])
    ax.set(ylabel="held-out greedy success", ylim=(0, 1.08),
           title=f"What PPO adds ({result['preset']}, {result['val_games']} "
                 f"{result['split']} games, paired)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1),
              ncol=min(len(bars), LEGEND_COLUMNS))  # under the axes: clear of the bars
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
              "val_games": args.val_groups, "split": args.split, "minutes": args.minutes,
              "steps": args.steps,
              "groups": args.groups, "group_size": args.group_size,
              "sft_episodes": args.sft_episodes, "sft_epochs": args.sft_epochs,
              "overrides": args.overrides, "levers": args.levers, "goal": GOAL,
              "gain": mean["gain"],
              "gain_per_seed": [r["gain"] for r in runs],
              "games": [r["games"] for r in runs], "passed": mean["gain"] >= GOAL,
              "mean": mean, "runs": runs,
              "run_dir": str(args.run_dir.relative_to(Path.cwd())
                             if args.run_dir.is_relative_to(Path.cwd()) else args.run_dir)}
    show(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = str(plot(result, out.with_suffix(".png")))
    write_result(out, result)
    return result


if __name__ == "__main__":
    main()
