"""Can RL beat a flawed teacher? The share of a random opening's cost that PPO wins back.

PPO from a warm start whose demonstrations open with a random move, against the clean warm
start, on the same held-out games, paired.

    python scripts/bench/flawed_teacher.py                  # tightBlocksworldTurnsAgent, 3 seeds, 30 PPO min
    python scripts/bench/flawed_teacher.py --only-seed 0 threads=2
    python scripts/bench/flawed_teacher.py --seeds 1 --steps 1 --val-groups 2 --sft-episodes 4 \\
        --sft-epochs 1 model=tiny threads=1                 # a smoke run
    agentrl bench flawed_teacher [the same options]

Per training seed:

1. **Clean warm start**: the learning benchmark's SFT stage (scripts/bench/learn.py: oracle
   demonstrations, ``--sft-episodes`` x ``--sft-epochs``), in ``<--run-dir>/sft/``.
2. **Flawed warm start**: the same stage with ``sft.flawed_first_move=true``: every
   demonstration opens with a random legal move that is learned (not masked out, unlike
   ``sft.random_action_share``'s random turns), then the oracle plays on from the board it left
   (agentrl/rollout/demonstrations.py). Same games, same budget, in ``<--run-dir>/flawed/sft/``.
3. **PPO from the flawed warm start** (learn.py's PPO stage) for ``--steps`` steps or
   ``--minutes`` of training, whichever ends first, in ``<--run-dir>/flawed/sft_ppo/``.
4. **Paired evaluation**: each of the three models plays the same ``--val-groups``
   instance-disjoint held-out games greedy (constrained decoding, as PPO validates), one
   episode a game, each game's win recorded (``<--run-dir>/paired/<model>/``).

Reported per seed and on the mean over seeds: the three success rates; the gap the flaw costs,
``clean - flawed``; ``gap_closed = (flawed_ppo - flawed) / (clean - flawed)``, null when the gap
is <= 0 (no flaw to close); and per seed McNemar's exact test of each pair on the same games
(the games one won and the other lost, and the two-sided binomial p of that split under "no
difference"): ``flawed_ppo`` against ``flawed`` (did PPO gain?) and ``flawed`` against
``clean`` (is the flaw real?). Over the seeds (``pooled``), as scripts/bench/ppo_gain.py: every
seed plays the same held-out games, so each game's difference is averaged over the seeds; their
mean and interval, and the sign test of the games the seeds favour one way against the other.
The pass mark (the issue's): the mean's ``gap_closed`` >= 0.5. JSON to ``--out``
(``gap_closed`` per seed and on the mean, each game's wins, the PPO run's health numbers as the
learning benchmark reports them), the plot beside it.

The clean warm start and its held-out wins are the same stages as scripts/bench/ppo_gain.py's
(``sft/`` and ``paired/sft/``): with the same ``--run-dir`` and overrides, the two benchmarks
share them, and the flawed run's PPO (``--steps``, the hardware preset's games a step) is
compared with the clean one's on the same games.

Stages resume as the learning benchmark's (``stage.json`` per folder; other settings refused);
the warm starts are not PPO's budget (uncapped). Checkpoints this process trained are deleted at
its end unless ``--keep-checkpoints``.

Expected time (embedded SmolLM2-135M, 2 CPU cores, load ~2): a warm start of 192
demonstrations x 1 epoch ~20-25 min, a PPO step of 32 episodes ~100 s, 128 greedy held-out
games ~4 min, so a seed is about 2 x 25 + 27 + 5 x 4 = 100 min (each warm start and the PPO run
evaluate too), less what ppo_gain's run left in ``--run-dir``; ``--only-seed`` splits the seeds
over processes sharing ``--run-dir``.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from agentrl.cli.bench import script_module, write_result
from agentrl.evaluation.stats import mcnemar, paired_over_seeds

LEARN = script_module(Path(__file__).parent / "learn.py")
"""The warm-start and PPO stages, their configs and stage records (scripts/bench/learn.py)."""
FLAWED = "sft.flawed_first_move=true"
MODELS = ("clean", "flawed", "flawed_ppo")
PAIRED = {"clean": "sft", "flawed": "flawed", "flawed_ppo": "flawed_ppo"}
"""Each model's folder and name under ``paired/``: the clean warm start's is ppo_gain's."""
PASS_MARK = 0.5
"""Share of the clean-flawed gap PPO must close, on the mean over seeds."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    LEARN.add_stage_arguments(parser, steps=16,
                              steps_help="PPO steps (default 16, as scripts/bench/ppo_gain.py's)",
                              val_groups=128, run_dir="bench_results/flawed_teacher_runs",
                              out="bench_results/flawed_teacher.json")
    args = parser.parse_args(argv)
    if any(o.split("=", 1)[0].strip() == "sft.flawed_first_move" for o in args.overrides):
        parser.error("sft.flawed_first_move is the benchmark's to set (the flawed stages "
                     "only); allowed: other overrides")
    return LEARN.check_stage_arguments(parser, args)


# -- statistics ----------------------------------------------------------------------------------
def gap_closed(clean: float, flawed: float, flawed_ppo: float) -> float | None:
    """``(flawed_ppo - flawed) / (clean - flawed)``: the share of the flaw's cost PPO won back;
    None when the gap is <= 0 (the flaw cost nothing to close)."""
    gap = clean - flawed
    return None if gap <= 0 else (flawed_ppo - flawed) / gap


# -- stages --------------------------------------------------------------------------------------
def stage_configs(args: argparse.Namespace) -> dict[str, Any]:
    """learn.py's configs of each stage: the warm starts uncapped (not PPO's budget), the flawed
    ones with ``sft.flawed_first_move=true`` in their own folder."""
    def configs(**changes: Any) -> Any:
        return LEARN.Configs(argparse.Namespace(**{**vars(args), **changes}))

    flawed = {"run_dir": args.run_dir / "flawed", "overrides": [*args.overrides, FLAWED]}
    return {"clean_sft": configs(minutes=None), "flawed_sft": configs(minutes=None, **flawed),
            "flawed_ppo": configs(**flawed), "paired": configs(run_dir=args.run_dir / "paired")}


def paired_folder(configs: dict[str, Any], name: str, seed: int) -> Path:
    return configs["paired"].args.run_dir / PAIRED[name] / f"seed_{seed}"


def paired_stage(configs: dict[str, Any], name: str, seed: int, trained: dict[str, Any]
                 ) -> dict[str, Any]:
    """The held-out wins of the checkpoint of ``trained`` (a stage record), per game."""
    owner = configs["flawed_ppo" if name == "flawed_ppo" else f"{name}_sft"].args
    return LEARN.paired_stage(configs["paired"], paired_folder(configs, name, seed),
                              PAIRED[name], seed, trained["checkpoint"], owner)


def run_seed(configs: dict[str, Any], seed: int) -> dict[str, Any]:
    """The three models of one training seed, their paired held-out wins and the comparison."""
    done = {name: (paired_folder(configs, name, seed) / LEARN.STAGE_FILE).is_file()
            for name in MODELS}
    clean = LEARN.sft_stage(configs["clean_sft"], seed, need_checkpoint=not done["clean"])
    paired = {"clean": paired_stage(configs, "clean", seed, clean)}
    ppo_folder = LEARN.stage_folder(configs["flawed_ppo"].args.run_dir, "sft_ppo", seed)
    ppo_done = (ppo_folder / LEARN.STAGE_FILE).is_file()
    flawed = LEARN.sft_stage(configs["flawed_sft"], seed,
                             need_checkpoint=not (done["flawed"] and ppo_done))
    paired["flawed"] = paired_stage(configs, "flawed", seed, flawed)
    # PPO's whole --minutes: the warm start is not its budget (as scripts/bench/pool.py)
    ppo = LEARN.ppo_stage(configs["flawed_ppo"], "sft_ppo", seed,
                          {**flawed, "train_minutes": 0.0})
    paired["flawed_ppo"] = paired_stage(configs, "flawed_ppo", seed, ppo)
    records = LEARN.read_metrics(ppo_folder / "metrics.jsonl")
    wins = {name: paired[name]["wins"] for name in MODELS}
    success = {name: paired[name]["success"] for name in MODELS}
    return {"seed": seed, **success, "gap": success["clean"] - success["flawed"],
            "gap_closed": gap_closed(*(success[name] for name in MODELS)),
            "mcnemar": {"flawed_ppo_vs_flawed": mcnemar(wins["flawed_ppo"], wins["flawed"]),
                        "flawed_vs_clean": mcnemar(wins["flawed"], wins["clean"])},
            "wins": wins, "games": len(wins["clean"]),
            "warm_start_demonstrations": {"clean": clean["demonstrations"],
                                          "flawed": flawed["demonstrations"]},
            "ppo_steps": ppo["steps"], "ppo_train_minutes": ppo["train_minutes"],
            "ppo_validation": ppo["after"], "health": LEARN.health_of(records),
            **LEARN.critic_marks(records),
            "val_curve": ppo["val_curve"], "train_curve": ppo["train_curve"]}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over seeds: success rates, gap, gap_closed of the means, and each pair compared
    game by game over the seeds (:func:`~agentrl.evaluation.stats.paired_over_seeds`)."""
    mean = {name: statistics.fmean(r[name] for r in runs) for name in MODELS}
    pairs = {"flawed_ppo_vs_flawed": ("flawed_ppo", "flawed"),
             "flawed_vs_clean": ("flawed", "clean")}
    pooled = {pair: paired_over_seeds([r["wins"][a] for r in runs], [r["wins"][b] for r in runs])
              for pair, (a, b) in pairs.items()}
    return {**mean, "gap": mean["clean"] - mean["flawed"],
            "gap_closed": gap_closed(*(mean[name] for name in MODELS)), "pooled": pooled}


# -- output --------------------------------------------------------------------------------------
def show(result: dict[str, Any]) -> None:
    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print(f"{'seed':>5} {'clean':>6} {'flawed':>7} {'+PPO':>6} {'gap':>6} {'closed':>7} "
          f"{'PPO won/lost':>12} {'p':>7} {'flaw p':>7} {'steps':>5}")
    for r in result["runs"]:
        test, flaw = r["mcnemar"]["flawed_ppo_vs_flawed"], r["mcnemar"]["flawed_vs_clean"]
        print(f"{r['seed']:>5} {r['clean']:>6.1%} {r['flawed']:>7.1%} {r['flawed_ppo']:>6.1%} "
              f"{r['gap']:>+6.1%} {cell(r['gap_closed'], '>7.2f'):>7} "
              f"{test['only_a']:>5}/{test['only_b']:<6} {test['p']:>7.3f} {flaw['p']:>7.3f} "
              f"{r['ppo_steps']:>5}")
    m = result["mean"]
    test, flaw = m["pooled"]["flawed_ppo_vs_flawed"], m["pooled"]["flawed_vs_clean"]
    print(f"{'mean':>5} {m['clean']:>6.1%} {m['flawed']:>7.1%} {m['flawed_ppo']:>6.1%} "
          f"{m['gap']:>+6.1%} {cell(m['gap_closed'], '>7.2f'):>7} "
          f"{test['better']:>5}/{test['worse']:<6} {test['p']:>7.3f} {flaw['p']:>7.3f}")
    verdict = ("no gap to close" if m["gap_closed"] is None else
               f"{'passes' if result['passed'] else 'misses'} the mark of {PASS_MARK}")
    print(f"gap_closed on the mean: {cell(m['gap_closed'], '.2f')} ({verdict}); "
          f"{result['val_games']} held-out games a model, greedy, paired. Per seed: PPO won/lost = "
          "games only flawed + PPO / only the flawed warm start won, McNemar's p; mean row: games "
          "the seeds favour PPO on / against, the sign test's p; PPO's gain over the flawed "
          f"start on the mean {test['gain']:+.1%} [{test['gain_ci95'][0]:+.1%}, "
          f"{test['gain_ci95'][1]:+.1%}]")


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*result["runs"], {"seed": "mean", **result["mean"]}]
    labels = {"clean": "clean warm start", "flawed": "flawed warm start",
              "flawed_ppo": "flawed + PPO"}
    fig, ax = plt.subplots(figsize=(6.5, 3.9))
    width = 0.8 / len(MODELS)
    for i, name in enumerate(MODELS):
        ax.bar([x + (i - 1) * width for x in range(len(rows))], [r[name] for r in rows], width,
               label=labels[name])
    for x, row in enumerate(rows):
        if row.get("gap_closed") is not None:
            ax.annotate(f"closed {row['gap_closed']:.2f}", (x, 1.0), ha="center", fontsize=7)
    ax.set_xticks(range(len(rows)), [f"seed {r['seed']}" if r["seed"] != "mean" else "mean"
                                     for r in rows])
    ax.set(ylabel="held-out greedy success", ylim=(0, 1.08),
           title=f"RL against a flawed teacher ({result['preset']}, "
                 f"{result['val_games']} games)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1),
              ncol=len(MODELS))  # under the axes: clear of the bars and the gap labels
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    LEARN.TRAINED_STAGES.clear()  # this call's stages only (tests call main more than once)
    configs = stage_configs(args)
    runs = [run_seed(configs, seed) for seed in (args.only_seed or range(args.seeds))]
    if not args.keep_checkpoints:
        LEARN.prune_checkpoints(LEARN.TRAINED_STAGES)
    mean = summarize(runs)
    result = {"preset": args.preset, "seeds": [r["seed"] for r in runs],
              "val_games": args.val_groups, "minutes": args.minutes, "steps": args.steps,
              "sft_episodes": args.sft_episodes, "sft_epochs": args.sft_epochs,
              "overrides": args.overrides, "pass_mark": PASS_MARK,
              "gap_closed": mean["gap_closed"],
              "gap_closed_per_seed": [r["gap_closed"] for r in runs],
              "passed": mean["gap_closed"] is not None and mean["gap_closed"] >= PASS_MARK,
              "mean": mean, "runs": runs, "run_dir": str(args.run_dir)}
    show(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = str(plot(result, out.with_suffix(".png")))
    write_result(out, result)
    return result


if __name__ == "__main__":
    main()
