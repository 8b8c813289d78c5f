"""How far do two PPO runs of one recipe land apart, and which lever differences stand out of
that? A reading of a ``ppo_gain.py`` result; it trains and plays nothing.

    python scripts/bench/run_noise.py docs/results/learn_ppo.json \\
        --null reseed:dropwon --null sibreseed:sibridge --out docs/results/run_noise.json
    python scripts/bench/run_noise.py RESULT.json --null A:B --compare sibridge:dropwon

``ppo_gain.py``'s intervals have the held-out games as the units: they say how sure the games
make the difference between two given runs, not how far another run of the same recipe would
land. A *null pair* ``A:B`` names two arms of one recipe on different PPO seeds (``--lever
reseed=seed=1000,...`` beside the default), so their per-seed differences of held-out success
are run-to-run noise alone, expected 0. Over all null pairs' per-seed differences ``d``:
``sigma = sqrt(mean(d^2))``, with one degree of freedom a difference.

Each compared pair (``--compare A:B``; by default every lever against ``sft_ppo``, and the
null pairs themselves; ``A:B+C:D`` reads several pairs' per-seed differences as one) is read
against it: the mean of its per-seed differences, the 95%
interval ``mean +- t(df) sigma / sqrt(seeds)`` (``sigma / sqrt(2)`` against the warm start
``sft``: one PPO run, not two), and Student's two-sided p. Arms are ``sft``,
``sft_ppo`` or a lever's name. A lever run shares its seed's sampling stream with ``sft_ppo``
and starts alike, so for a lever against ``sft_ppo`` sigma is an upper bound on the noise.
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

ARMS = ("sft", "sft_ppo")
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


def wins(run: dict[str, Any], arm: str) -> list[bool]:
    """One seed's held-out wins of ``arm``, game by game."""
    return run["wins"][arm] if arm in ARMS else run["levers"][arm]["wins"]


def per_seed(result: dict[str, Any], a: str, b: str) -> list[float]:
    """``a``'s held-out success minus ``b``'s, per seed."""
    known = set(ARMS) | set(result["runs"][0].get("levers", {}))
    for arm in (a, b):
        if arm not in known:
            raise SystemExit(f"no arm {arm!r} in this result; arms: {', '.join(sorted(known))}")
    return [(sum(wins(r, a)) - sum(wins(r, b))) / len(wins(r, a)) for r in result["runs"]]


def run_noise(null_differences: list[float]) -> dict[str, Any]:
    """The run-to-run spread of one seed's difference between two runs of a recipe."""
    if not null_differences:
        raise SystemExit("no null pair: name at least one with --null A:B")
    sigma = math.sqrt(sum(d * d for d in null_differences) / len(null_differences))
    return {"sigma": sigma, "df": len(null_differences), "differences": null_differences}


def read(differences: list[float], noise: dict[str, Any], ppo_arms: int = 2) -> dict[str, Any]:
    """A pair's per-seed ``differences`` against the run noise, and with the seeds as units.
    ``sigma`` is the spread between two PPO runs; a pair with one (a PPO arm against the warm
    start ``sft``, which every seed plays once) has ``sigma / sqrt(2)``."""
    mean = statistics.fmean(differences)
    se = noise["sigma"] * math.sqrt(ppo_arms / 2) / math.sqrt(len(differences))
    half = student_t_95(noise["df"]) * se
    return {"per_seed": differences, "mean": mean, "ci95": [mean - half, mean + half],
            "p": student_t_p(mean / se, noise["df"]) if se > 0 else None,
            "seed_ci95": seed_interval(differences)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path, help="a scripts/bench/ppo_gain.py JSON")
    parser.add_argument("--null", type=parse_pair, action="append", default=[],
                        metavar="A:B", help="two arms of one recipe on different PPO seeds")
    parser.add_argument("--compare", type=parse_pairs, action="append", default=[],
                        metavar="A:B[+C:D]", help="a pair to read, or pairs read as one "
                                                  "(default: every lever against sft_ppo, "
                                                  "and the null pairs)")
    parser.add_argument("--out", default="bench_results/run_noise.json")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    noise = run_noise([d for a, b in args.null for d in per_seed(result, a, b)])
    levers = list(result["runs"][0].get("levers", {}))
    compared = args.compare or [((lever, "sft_ppo"),) for lever in levers] + [
        (pair,) for pair in args.null]
    rows = {}
    for pairs in compared:
        ppo_arms = {(a != "sft") + (b != "sft") for a, b in pairs}
        if len(ppo_arms) > 1:
            raise SystemExit(f"{'+'.join(f'{a}:{b}' for a, b in pairs)}: pairs read as one "
                             "must all be against the warm start sft or all between PPO runs")
        rows["+".join(f"{a}:{b}" for a, b in pairs)] = read(
            [d for a, b in pairs for d in per_seed(result, a, b)], noise, ppo_arms.pop())
    show(noise, rows, len(result["runs"]))
    record = {"result": str(args.result), "nulls": [f"{a}:{b}" for a, b in args.null],
              "seeds": result["seeds"], "games": result["val_games"], "noise": noise,
              "pairs": rows}
    write_result(args.out, record)
    return record


def show(noise: dict[str, Any], rows: dict[str, dict[str, Any]], seeds: int) -> None:
    half = student_t_95(noise["df"]) * noise["sigma"] / math.sqrt(seeds)
    print(f"run-to-run spread of one seed's difference: sigma {noise['sigma']:.1%} "
          f"({noise['df']} null differences); a {seeds}-seed mean difference: +-{half:.1%}")
    print(f"{'pair':<34} {'per seed':<42} {'mean':>7} {'95% (run noise)':>18} {'p':>6} "
          f"{'95% (seeds as units)':>20}")
    for name, row in rows.items():
        seeds_text = " ".join(f"{d:+.1%}" for d in row["per_seed"])
        low, high = row["ci95"]
        units = row["seed_ci95"]
        units_text = "-" if units is None else f"[{units[0]:+.1%}, {units[1]:+.1%}]"
        p = "-" if row["p"] is None else f"{row['p']:.2f}"
        print(f"{name:<34} {seeds_text:<42} {row['mean']:>+7.1%} "
              f"{f'[{low:+.1%}, {high:+.1%}]':>18} {p:>6} {units_text:>20}")


if __name__ == "__main__":
    main()
