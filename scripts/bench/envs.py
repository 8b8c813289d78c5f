"""Environment speed: resets/s and steps/s per game and preset (TextWorld: pool generation too).

    python scripts/bench/envs.py                       # all games, table + bench_results/envs.json
    python scripts/bench/envs.py --games Sokoban --resets 500 --steps 20000

Steps take uniformly random valid actions (seeded), resetting when an episode ends; reset time
is not counted in steps/s. TextWorld games are generated into a fresh pool first (one process,
so the time per game is the generator's own), then reset from the pool.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time

import gymnasium
import numpy as np
from rich.console import Console
from rich.table import Table

import agentrl
from agentrl.cli.bench import write_result
from agentrl.envs import GAMES, env_id


def presets_of(game: str) -> list[str]:
    module = importlib.import_module(GAMES[game].split(":")[0])
    return list(module.PRESETS)


def time_resets(env, seeds: list[int]) -> list[float]:
    times = []
    for seed in seeds:
        start = time.perf_counter()
        env.reset(seed=seed)
        times.append(time.perf_counter() - start)
    return times


def time_steps(env, num_steps: int, rng: np.random.Generator) -> float:
    """Seconds spent in ``step`` over ``num_steps`` random valid actions."""
    game = env.unwrapped
    env.reset(seed=int(rng.integers(1 << 30)))
    spent = 0.0
    for _ in range(num_steps):
        actions = game.valid_actions()
        action = actions[int(rng.integers(len(actions)))] if actions else "noop"
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        spent += time.perf_counter() - start
        if terminated or truncated:
            env.reset(seed=int(rng.integers(1 << 30)))
    return spent


def bench_preset(game: str, preset: str, args) -> dict:
    env = gymnasium.make(env_id(game), preset=preset)
    row = {"game": game, "preset": preset}
    num_resets, num_steps = args.resets, args.steps
    if game == "TextWorld":
        num_resets, num_steps = args.textworld_games, args.textworld_steps
        seeds = list(range(num_resets))
        start = time.perf_counter()
        env.unwrapped.pregenerate(seeds, workers=1, progress=False)
        row["generate_s_per_game"] = (time.perf_counter() - start) / num_resets
    else:
        seeds = list(range(num_resets))
    resets = time_resets(env, seeds)
    row.update(
        resets_per_s=len(resets) / sum(resets),
        reset_ms_median=1000 * float(np.median(resets)),
        reset_ms_max=1000 * max(resets),
        steps_per_s=num_steps / time_steps(env, num_steps, np.random.default_rng(0)),
    )
    env.close()
    return row


def print_table(rows: list[dict]) -> None:
    table = Table(title=f"agentrl {agentrl.__version__} environment speed (one process)")
    for column in ("game", "preset", "resets/s", "reset ms (median / max)", "steps/s",
                   "generate s/game"):
        table.add_column(column, justify="left" if column in ("game", "preset") else "right")
    for row in rows:
        generate = row.get("generate_s_per_game")
        table.add_row(
            row["game"], row["preset"], f"{row['resets_per_s']:,.0f}",
            f"{row['reset_ms_median']:.2f} / {row['reset_ms_max']:.2f}",
            f"{row['steps_per_s']:,.0f}", "-" if generate is None else f"{generate:.2f}",
        )
    Console(width=120).print(table)
    slowest = min(rows, key=lambda row: row["resets_per_s"])
    print(f"slowest reset: {slowest['game']} {slowest['preset']} "
          f"({slowest['reset_ms_median']:.2f} ms median)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    parser.add_argument("--resets", type=int, default=200, help="seeds reset per preset")
    parser.add_argument("--steps", type=int, default=5000, help="random steps per preset")
    parser.add_argument("--textworld-games", type=int, default=6, help="games generated per preset")
    parser.add_argument("--textworld-steps", type=int, default=300)
    parser.add_argument("--out", default="bench_results/envs.json")
    args = parser.parse_args(argv)
    if "TextWorld" in args.games and "AGENTRL_CACHE" not in os.environ:
        os.environ["AGENTRL_CACHE"] = tempfile.mkdtemp(prefix="agentrl-bench-")  # a fresh pool
    rows = [bench_preset(game, preset, args) for game in args.games for preset in presets_of(game)]
    print_table(rows)
    write_result(args.out, {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
