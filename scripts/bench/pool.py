"""Can PPO master a pool of games? Greedy success on training games the warm start loses when
greedy but wins sometimes when sampled, before and after PPO trains on exactly those games.

    python scripts/bench/pool.py                                   # 3 seeds, 8 games, 30 PPO min
    python scripts/bench/pool.py --only-seed 0 --minutes 20 threads=2
    python scripts/bench/pool.py --seeds 1 --candidates 4 --pool-size 2 --steps 1 \\
        --sft-episodes 8 --val-groups 2 --min-wins 0 model=tiny    # a smoke run
    agentrl bench pool [the same options]

Per training seed:

1. **Warm start**: the learning benchmark's SFT stage (scripts/bench/learn.py: oracle
   demonstrations, ``--sft-episodes`` x ``--sft-epochs``), shared with it through ``--run-dir``.
2. **The pool**: ``--candidates`` training games (the seeds PPO's first steps would play, never
   demonstration games) played once greedy and ``--samples`` times sampled at the training
   temperature, both constrained; the pool is the first ``--pool-size`` games the greedy policy
   loses and the sampled one wins ``--min-wins``..``--max-wins`` times: PPO's samples hold wins
   to learn from, and greedy play has something to gain.
3. **PPO on the pool** (``train.pool``) from the warm start for ``--steps`` steps or
   ``--minutes``, ``--groups`` games x ``--group-size`` episodes a step, validated on the held-out
   games at its end.
4. **The pool again**, greedy, with PPO's last checkpoint: ``pool_after`` against
   ``pool_before``, held-out success beside it.

The pass mark (the issue's): greedy success on the pool >= 7/8 on every seed. A pool PPO cannot
master says the update itself is wrong, before any benchmark of held-out play.
JSON to ``--out`` (``pool_before``/``pool_after`` per seed, each game's sampled wins, the PPO
run's health numbers: explained variance, clip fraction, KL, entropy per real choice), the plot
beside it. Stages resume like the learning benchmark's (``stage.json`` per folder).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from agentrl.cli.bench import script_module, write_result
from agentrl.engines import SamplingParams
from agentrl.envs.splits import train_seeds
from agentrl.rollout.groups import run_groups

LEARN = script_module(Path(__file__).parent / "learn.py")
"""The warm start and PPO stages (scripts/bench/learn.py)."""
HEALTH = LEARN.HEALTH
"""The PPO run's health numbers, averaged over its steps."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    LEARN.add_stage_arguments(parser, steps=200, steps_help="most PPO steps (default 200)",
                              val_groups=64, run_dir="bench_results/pool_runs",
                              out="bench_results/pool.json", keep_checkpoints=False)
    parser.add_argument("--candidates", type=int, default=48,
                        help="training games tried for the pool (default 48)")
    parser.add_argument("--samples", type=int, default=8,
                        help="sampled episodes per candidate (default 8)")
    parser.add_argument("--min-wins", type=int, default=1,
                        help="fewest sampled wins of a pool game (default 1)")
    parser.add_argument("--max-wins", type=int, default=5,
                        help="most sampled wins of a pool game (default 5)")
    parser.add_argument("--pool-size", type=int, default=8, help="games in the pool (default 8)")
    parser.add_argument("--groups", type=int, default=4,
                        help="pool games a PPO step plays (default 4)")
    parser.add_argument("--group-size", type=int, default=8,
                        help="episodes per game and step (default 8)")
    args = parser.parse_args(argv)
    if not 0 <= args.min_wins <= args.max_wins <= args.samples:
        parser.error("allowed: 0 <= --min-wins <= --max-wins <= --samples, got "
                     f"{args.min_wins}, {args.max_wins}, {args.samples}")
    return LEARN.check_stage_arguments(
        parser, args, positive=("candidates", "samples", "pool_size", "groups", "group_size"))


def play(config: Any, seeds: list[int], episodes: int, greedy: bool) -> list[int]:
    """Wins of each game in ``seeds`` over ``episodes`` constrained episodes of
    ``config.model`` (greedy, or sampled as training samples)."""
    r = config.rollout
    sampling = SamplingParams(greedy=greedy, temperature=r.temperature, top_p=r.top_p,
                              top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                              constrained_actions=True)
    with LEARN.engine(config) as (llm, tokenizer):
        trajectories = asyncio.run(run_groups(
            config.playing_presets(config.train.presets[:1], r.max_new_tokens), llm, tokenizer,
            sampling, group_num=len(seeds), group_size=episodes, seeds=seeds,
            max_context_tokens=r.max_context_tokens))
    wins = {seed: 0 for seed in seeds}
    for trajectory in trajectories:
        wins[trajectory.seed] += bool(trajectory.success)
    return [wins[seed] for seed in seeds]


def pool_stage(configs: Any, seed: int, warm: dict[str, Any]) -> dict[str, Any]:
    """The pool of ``seed``'s warm start: greedy losses with some sampled wins."""
    args = configs.args
    folder = args.run_dir / "pool" / f"seed_{seed}"
    settings = configs.settings(candidates=args.candidates, samples=args.samples,
                                wins=[args.min_wins, args.max_wins], size=args.pool_size,
                                warm=warm["checkpoint"])
    if (record := LEARN.cached_stage(folder, settings)) is not None:
        return record
    config = configs.build(constrained=True, seed=seed,
                           model=str(LEARN.located(args, warm["checkpoint"])))
    start = time.perf_counter()
    candidates = train_seeds(1, args.candidates, seed)
    greedy = play(config, candidates, 1, greedy=True)
    sampled = play(config, candidates, args.samples, greedy=False)
    pool = [game for game, g, s in zip(candidates, greedy, sampled)
            if g == 0 and args.min_wins <= s <= args.max_wins][:args.pool_size]
    return LEARN.save_stage(folder, settings, {
        "candidates": candidates, "greedy_wins": greedy, "sampled_wins": sampled,
        "pool": pool, "pool_sampled_wins": [sampled[candidates.index(g)] for g in pool],
        "wall_minutes": (time.perf_counter() - start) / 60})


def run_seed(configs: Any, seed: int) -> dict[str, Any]:
    args = configs.args
    # the warm start is not PPO's budget: uncapped, shared with the learning benchmark's
    warm = LEARN.sft_stage(LEARN.Configs(argparse.Namespace(**{**vars(args), "minutes": None})),
                           seed, need_checkpoint=True)
    chosen = pool_stage(configs, seed, warm)
    pool = chosen["pool"]
    if not pool:
        return {"seed": seed, "pool": [], "warm_start": warm["after"],
                "note": "no candidate game fits the pool's rule"}
    lever = ("pool", [f"train.pool=[{','.join(map(str, pool))}]",
                      f"train.group_num={min(args.groups, len(pool))}",
                      f"train.group_size={args.group_size}"])
    ppo = LEARN.ppo_stage(configs, "sft_ppo", seed, {**warm, "train_minutes": 0.0}, lever)
    checkpoint = str(LEARN.located(args, ppo["checkpoint"]))
    config = configs.build(constrained=True, seed=seed, model=checkpoint)
    before = play(configs.build(constrained=True, seed=seed,
                                model=str(LEARN.located(args, warm["checkpoint"]))),
                  pool, 1, greedy=True)
    after = play(config, pool, 1, greedy=True)
    folder = LEARN.stage_folder(args.run_dir, "sft_ppo", seed, lever[0])
    records = LEARN.read_metrics(folder / "metrics.jsonl")
    return {"seed": seed, "pool": pool, "pool_sampled_wins": chosen["pool_sampled_wins"],
            "pool_before": sum(before) / len(pool), "pool_after": sum(after) / len(pool),
            "pool_after_wins": after, "held_out_warm_start": warm["after"],
            "held_out_after": ppo["after"], "ppo_steps": ppo["steps"],
            "ppo_train_minutes": ppo["train_minutes"], "health": LEARN.health_of(records),
            **LEARN.critic_marks(records),
            "val_curve": ppo["val_curve"], "train_curve": ppo["train_curve"]}


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if r.get("pool")]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for run in runs:
        steps = [s for s, v in run["train_curve"] if v is not None]
        values = [v for _, v in run["train_curve"] if v is not None]
        ax.plot(steps, values, marker=".", label=f"seed {run['seed']}: greedy pool "
                f"{run['pool_before']:.0%} -> {run['pool_after']:.0%}")
    ax.axhline(7 / 8, color="grey", linestyle="--", label="pass mark 7/8")
    ax.set(xlabel="PPO step", ylabel="sampled success on the pool", ylim=(0, 1.05),
           title=f"PPO on a pool of {result['pool_size']} games ({result['preset']})")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    configs = LEARN.Configs(args)
    runs = [run_seed(configs, seed) for seed in (args.only_seed or range(args.seeds))]
    mastered = [r for r in runs if r.get("pool") and r["pool_after"] >= 7 / 8]
    result = {"preset": args.preset, "seeds": [r["seed"] for r in runs],
              "pool_size": args.pool_size, "groups": args.groups, "group_size": args.group_size,
              "minutes": args.minutes, "steps": args.steps, "overrides": args.overrides,
              "mastered": len(mastered), "runs": runs}
    print(f"{'seed':>4} {'pool':>5} {'before':>7} {'after':>6} {'held-out':>9} "
          f"{'EV':>6} {'clip':>6} {'KL':>8} {'entropy':>8} {'steps':>5}")
    for r in runs:
        if not r.get("pool"):
            print(f"{r['seed']:>4} {r['note']}")
            continue
        h = {k: (v if v is not None else float("nan")) for k, v in r["health"].items()}
        print(f"{r['seed']:>4} {len(r['pool']):>5} {r['pool_before']:>7.0%} "
              f"{r['pool_after']:>6.0%} {r['held_out_after']['success']:>9.1%} "
              f"{h[HEALTH[0]]:>6.2f} {h[HEALTH[1]]:>6.3f} {h[HEALTH[2]]:>8.4f} "
              f"{h[HEALTH[3]]:>8.3f} {r['ppo_steps']:>5}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = str(plot(result, out.with_suffix(".png")))
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
