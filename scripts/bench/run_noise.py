"""How far do two PPO runs of one recipe land apart, and which lever differences stand out of
that? A reading of a ``ppo_gain.py`` result; it trains and plays nothing.

    python scripts/bench/run_noise.py docs/results/learn_ppo.json \\
        --null reseed:dropwon --null sibreseed:sibridge --out docs/results/run_noise.json
    python scripts/bench/run_noise.py RESULT.json --null A:B --compare sibridge:dropwon

``ppo_gain.py``'s intervals have the held-out games as the units: they say how sure the games
make the difference between two given runs, not how far another run of the same recipe would
land. A *null pair* ``A:B`` names two PPO arms of one recipe on different PPO seeds
(``--lever reseed=seed=1000,...`` beside the default), so their per-seed differences of
held-out success are run-to-run noise alone, expected 0. Over all null pairs' per-seed
differences ``d``: ``sigma = sqrt(mean(d^2))``. Null pairs on one seed share its warm start
(and, as ``reseed`` runs, one stream), so they are not independent: the degrees of freedom are
the seeds, not the differences.

Each compared pair (``--compare A:B``; by default every lever against ``sft_ppo``;
``A:B+C:D`` reads several pairs' per-seed differences as one) is read against sigma: the mean
of its ``n`` per-seed differences, the 95% interval ``mean +- t(df) se`` with ``se = sigma /
sqrt(n)`` (``sigma / sqrt(2)`` against the warm start ``sft``: one PPO run, not two; the warm
starts are held fixed), and Student's two-sided p. Beside it, the seeds as the units: Student's
t interval of the per-seed differences, a seed's pairs averaged first. Arms are ``sft``,
``sft_ppo`` or a lever's name. A lever run shares its seed's sampling stream with ``sft_ppo``
and starts alike, so for a lever against ``sft_ppo`` sigma is likely an upper bound on the
noise (not measurable: the same recipe on the same stream is the same run).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from agentrl.cli.bench import write_result
from agentrl.evaluation.stats import seed_interval, student_t_95, student_t_p

WARM_START = "sft"
ARMS = (WARM_START, "sft_ppo")
"""The arms every ``ppo_gain.py`` result has; the rest are its levers."""


def parse_pair(text: str) -> tuple[str, str]:
    """``A:B`` -> ``(A, B)``."""
    a, sep, b = text.partition(":")
    if not sep or not a or not b or ":" in b:
        raise argparse.ArgumentTypeError(f"expected ARM:ARM, got {text!r}")
    return a, b


def parse_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``A:B+C:D`` -> ``((A, B), (C, D))``: pairs read as one (their per-seed differences
    together), e.g. one comparison made on two PPO seeds."""
    return tuple(parse_pair(part) for part in text.split("+"))


def checked(result: dict[str, Any], arms: set[str]) -> None:
    """Every run holds every arm named, each on the same number of games."""
    for run in result["runs"]:
        known = set(ARMS) | set(run.get("levers", {}))
        if missing := sorted(arms - known):
            raise SystemExit(f"seed {run['seed']}: no arm {', '.join(map(repr, missing))}; "
                             f"arms: {', '.join(sorted(known))}")
        if len({len(arm_wins(run, arm)) for arm in arms}) > 1:
            raise SystemExit(f"seed {run['seed']}: the arms were played on different games")


def arm_wins(run: dict[str, Any], arm: str) -> list[bool]:
    """One seed's held-out wins of ``arm``, game by game."""
    return run["wins"][arm] if arm in ARMS else run["levers"][arm]["wins"]


def per_seed(result: dict[str, Any], a: str, b: str) -> list[float]:
    """``a``'s held-out success minus ``b``'s, per seed."""
    return [(sum(arm_wins(r, a)) - sum(arm_wins(r, b))) / len(arm_wins(r, a))
            for r in result["runs"]]


def run_noise(result: dict[str, Any], nulls: list[tuple[str, str]]) -> dict[str, Any]:
    """The run-to-run spread of one seed's difference between two PPO runs of a recipe."""
    if not nulls:
        raise SystemExit("no null pair: name at least one with --null A:B")
    for a, b in nulls:
        if WARM_START in (a, b) or a == b:
            raise SystemExit(f"--null {a}:{b}: a null pair is two different PPO arms")
    if len(set(nulls)) < len(nulls):
        raise SystemExit("a null pair is named twice")
    differences = [d for a, b in nulls for d in per_seed(result, a, b)]
    sigma = math.sqrt(sum(d * d for d in differences) / len(differences))
    if sigma == 0:
        raise SystemExit("the null pairs never differ: no run-to-run spread to read against")
    return {"sigma": sigma, "df": len(result["runs"]), "differences": differences}


def against_noise(pairs: tuple[tuple[str, str], ...], result: dict[str, Any],
                  noise: dict[str, Any]) -> dict[str, Any]:
    """``pairs`` (read as one) against the run noise, and with the seeds as units. ``sigma``
    is the spread between two PPO runs; a pair with one (a PPO arm against the warm start, which
    every seed plays once) has ``sigma / sqrt(2)``."""
    ppo_arms = {(a != WARM_START) + (b != WARM_START) for a, b in pairs}
    if len(ppo_arms) > 1:
        raise SystemExit(f"{'+'.join(f'{a}:{b}' for a, b in pairs)}: pairs read as one must "
                         f"all be against the warm start {WARM_START} or all between PPO runs")
    by_pair = [per_seed(result, a, b) for a, b in pairs]
    differences = [d for pair in by_pair for d in pair]
    mean = statistics.fmean(differences)
    arms = ppo_arms.pop()
    se = noise["sigma"] * math.sqrt(arms / 2) / math.sqrt(len(differences))
    half = student_t_95(noise["df"]) * se
    seed_means = [statistics.fmean(seed) for seed in zip(*by_pair)]
    return {"per_seed": differences, "ppo_arms": arms, "mean": mean, "se": se,
            "ci95": [mean - half, mean + half], "p": student_t_p(mean / se, noise["df"]),
            "seed_ci95": seed_interval(seed_means),
            "seed_p": seed_p(seed_means)}


def seed_p(seed_means: list[float]) -> float | None:
    """Student's two-sided p of the per-seed means against 0 (None for one seed or no spread)."""
    if len(seed_means) < 2 or (sd := statistics.stdev(seed_means)) == 0:
        return None
    return student_t_p(statistics.fmean(seed_means) / (sd / math.sqrt(len(seed_means))),
                       len(seed_means) - 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path, help="a scripts/bench/ppo_gain.py JSON")
    parser.add_argument("--null", type=parse_pair, action="append", default=[],
                        metavar="A:B", help="two PPO arms of one recipe on different PPO seeds")
    parser.add_argument("--compare", type=parse_pairs, action="append", default=[],
                        metavar="A:B[+C:D]", help="a pair to read, or pairs read as one "
                                                  "(default: every lever against sft_ppo)")
    parser.add_argument("--out", default="bench_results/run_noise.json")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    if not result.get("runs"):
        raise SystemExit("this result has no runs")
    levers = result["runs"][0].get("levers", {})
    compared = args.compare or [((lever, "sft_ppo"),) for lever in levers]
    checked(result, {arm for pair in (*args.null, *(p for c in compared for p in c))
                     for arm in pair})
    noise = run_noise(result, args.null)
    rows = {"+".join(f"{a}:{b}" for a, b in pairs): against_noise(pairs, result, noise)
            for pairs in compared}
    show(noise, rows, len(result["runs"]))
    record = {"result": str(args.result), "nulls": [f"{a}:{b}" for a, b in args.null],
              "seeds": result["seeds"], "games": result["val_games"], "noise": noise,
              "pairs": rows}
    write_result(args.out, record)
    return record


def show(noise: dict[str, Any], rows: dict[str, dict[str, Any]], seeds: int) -> None:
    """The spread, then a row a pair: its differences, both intervals and both p values."""
    half = student_t_95(noise["df"]) * noise["sigma"] / math.sqrt(seeds)
    print(f"run-to-run spread of one seed's difference: sigma {noise['sigma']:.1%} "
          f"({len(noise['differences'])} null differences, {noise['df']} degrees of freedom: "
          f"the seeds); a {seeds}-seed mean difference: +-{half:.1%}")
    print(f"{'pair':<34} {'per seed':<42} {'mean':>7} {'95% (run noise)':>18} {'p':>5} "
          f"{'95% (seeds as units)':>20} {'p':>5}")

    def p_text(p: float | None) -> str:
        return "-" if p is None else f"{p:.2f}"

    for name, row in rows.items():
        seeds_text = " ".join(f"{d:+.1%}" for d in row["per_seed"])
        low, high = row["ci95"]
        units = row["seed_ci95"]
        units_text = "-" if units is None else f"[{units[0]:+.1%}, {units[1]:+.1%}]"
        print(f"{name:<34} {seeds_text:<42} {row['mean']:>+7.1%} "
              f"{f'[{low:+.1%}, {high:+.1%}]':>18} {p_text(row['p']):>5} {units_text:>20} "
              f"{p_text(row['seed_p']):>5}")


if __name__ == "__main__":
    main()
