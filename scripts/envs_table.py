"""The presets table of docs/ENVS.md: oracle and random-legal success of every agent preset.

    python scripts/envs_table.py                    # measure, rewrite the table in docs/ENVS.md
    python scripts/envs_table.py --check --seeds 20 # compare the table with a smaller re-measure
    python scripts/envs_table.py --print            # only print the table

Hardware: CPU, one core; about 2 minutes for the 200 seeds (TextWorld games come from the game
pool: generate them first, `python -m agentrl.envs.textworld --preset easy medium hard --seeds
1000000 1000040`, or the first run makes them at ~1 s each).

Every preset of configs/agents.yaml plays the first SEEDS held-out `val` seeds (TextWorld:
TEXTWORLD_SEEDS) through `agentrl.evaluation.evaluate`, i.e. through the same Agent as a model,
so the preset's turn and action budgets apply. The oracle plays the game's known solution; the
random policy plays 1..max_actions_per_turn legal actions a turn, drawn uniformly. A preset
where the random policy often wins cannot tell skill from luck; one where the oracle loses has a
budget too small for some seeds. The table sits between the MARKERS in docs/ENVS.md; `--check`
(and tests/test_envs_table.py) re-measures on fewer seeds: presets, budgets and format
penalties must match exactly, the oracle's and random policy's success within the 99.9% Wilson
interval of the smaller measure.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from agentrl.agents import Agent, AgentConfig, load_agent_presets
from agentrl.evaluation import evaluate
from agentrl.evaluation.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ENVS.md"
MARKERS = ("<!-- presets-table:begin (scripts/envs_table.py writes it) -->",
           "<!-- presets-table:end -->")
SEEDS = 200
TEXTWORLD_SEEDS = 40
"""TextWorld games take ~1 s each to generate (and the pool keeps them): fewer seeds."""
CHECK_Z = 3.29
"""A 99.9% interval for ``--check``: a preset that changed fails, sampling noise does not."""
HEADER = ("| preset | game | held out of | turns | actions a turn / in all | format penalty "
          "| seeds | oracle success % | random success % (95% interval) | random mean return |")


@dataclass(frozen=True)
class Row:
    preset: str
    game: str
    held_out_of: str
    turns: int
    actions_per_turn: int
    actions_all: int
    format_penalty: float
    seeds: int
    oracle: float
    random: float
    random_return: float

    def markdown(self) -> str:
        low, high = wilson_interval(self.random * self.seeds, self.seeds)
        return (f"| `{self.preset}` | {self.game} | {self.held_out_of} | {self.turns} "
                f"| {self.actions_per_turn} / {self.actions_all} | {self.format_penalty:+.2f} "
                f"| {self.seeds} | {100 * self.oracle:.1f} | {100 * self.random:.1f} "
                f"({100 * low:.1f}-{100 * high:.1f}) | {self.random_return:+.2f} |")


def seeds_for(config: AgentConfig, seeds: int, textworld_seeds: int) -> int:
    return textworld_seeds if config.game == "TextWorld" else seeds


def measure(presets: dict[str, AgentConfig], seeds: int = SEEDS,
            textworld_seeds: int = TEXTWORLD_SEEDS) -> list[Row]:
    """One row per preset, in the file's order."""
    rows = []
    for name, config in presets.items():
        count = seeds_for(config, seeds, textworld_seeds)
        oracle, random = (asyncio.run(evaluate({name: config}, policy, groups=count, seed=0,
                                               progress=False)).preset_metrics(name)
                          for policy in ("oracle", "random"))
        with Agent(config) as agent:
            penalty = agent.format_penalty
        game = f"{config.game} `{config.env_kwargs.get('preset', 'default')}`"
        rows.append(Row(name, game, f"`{config.held_out_of}`" if config.held_out_of else "-",
                        config.max_turns, config.max_actions_per_turn,
                        config.max_actions_all_turns, penalty, count, oracle["success"],
                        random["success"], random["return"]))
    return rows


def render(rows: list[Row]) -> str:
    separator = "|" + "---|" * HEADER.count(" | ") + "---|"
    return "\n".join([HEADER, separator, *(row.markdown() for row in rows)])


def read_table(doc: Path = DOC) -> str:
    text = doc.read_text()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    return text[start:end].strip()


def write_table(table: str, doc: Path = DOC) -> None:
    text = doc.read_text()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    doc.write_text(text[:start] + "\n" + table + "\n" + text[end:])


def parse_table(table: str) -> dict[str, list[str]]:
    """Preset -> its row's cells, from the markdown table."""
    cells = {}
    for line in table.splitlines()[2:]:
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        cells[row[0].strip("`")] = row
    return cells


def differences(table: str, rows: list[Row], z: float = CHECK_Z) -> list[str]:
    """What in ``table`` a fresh measure ``rows`` (possibly on fewer seeds) contradicts."""
    written, problems = parse_table(table), []
    if list(written) != [row.preset for row in rows]:
        return [f"presets differ: the table has {list(written)}, configs/agents.yaml "
                f"{[row.preset for row in rows]}"]
    for row in rows:
        cells, fresh = written[row.preset], parse_table(render([row]))[row.preset]
        if cells[:6] != fresh[:6]:
            problems.append(f"{row.preset}: settings {cells[:6]} != {fresh[:6]}")
        for column, rate in ((7, row.oracle), (8, row.random)):
            value = float(re.match(r"[0-9.]+", cells[column]).group()) / 100
            low, high = wilson_interval(rate * row.seeds, row.seeds, z=z)
            if not low - 1e-9 <= value <= high + 1e-9:
                problems.append(f"{row.preset}: column {HEADER.split('|')[column + 1].strip()!r} "
                                f"says {value:.3f}, {row.seeds} seeds give {rate:.3f} "
                                f"(interval {low:.3f}-{high:.3f})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=SEEDS, help=f"val seeds (default {SEEDS})")
    parser.add_argument("--textworld-seeds", type=int, default=None,
                        help=f"val seeds of TextWorld presets (default {TEXTWORLD_SEEDS}, at "
                             "most --seeds)")
    parser.add_argument("--presets", nargs="+", default=None, help="default: every preset")
    parser.add_argument("--check", action="store_true",
                        help="compare docs/ENVS.md's table with this measure; exit 1 if it is stale")
    parser.add_argument("--print", action="store_true", help="print the table, write nothing")
    args = parser.parse_args(argv)
    presets = load_agent_presets()
    if args.presets:
        presets = {name: presets[name] for name in args.presets}
    textworld = min(args.seeds, args.textworld_seeds or TEXTWORLD_SEEDS)
    rows = measure(presets, args.seeds, textworld)
    table = render(rows)
    if args.check:
        problems = differences(read_table(), rows)
        print("\n".join(problems) or f"docs/ENVS.md's table agrees with {args.seeds} seeds")
        return 1 if problems else 0
    print(table)
    if not args.print:
        write_table(table)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
