"""The `agentrl` command: one sub-command per job.

    agentrl play sokoban --seed 3          # play a game in the terminal
    agentrl play tetris --oracle           # watch the oracle solve one
    agentrl report runs/agentrl/quick      # one HTML page: curves, table, episodes
"""

from __future__ import annotations

import argparse

from agentrl import __version__
from agentrl.cli import bench, doctor, make_data, play, report, sft, train
from agentrl.cli import eval as eval_command  # the module; the name keeps the builtin

COMMANDS = {
    "play": (play, "play a game in the terminal, or watch the oracle solve it"),
    "eval": (eval_command, "play held-out games and report success, return, turns per preset"),
    "train": (train, "train with PPO (hydra key=value overrides of configs/base.yaml)"),
    "sft": (sft, "supervised warm start on the oracle's play (same overrides as train)"),
    "make-data": (make_data, "write the verl backend's task files (preset, seed, split)"),
    "report": (report, "write one self-contained HTML page of a run or an eval file"),
    "bench": (bench, "run a benchmark of scripts/bench/ (none named: list them)"),
    "doctor": (doctor, "check the verl backend on this node in minutes: a pass/fail table"),
}


OVERRIDE_COMMANDS = ("train", "sft", "make-data", "doctor")
"""The commands whose ``key=value`` overrides may stand on either side of a flag."""


class Parser(argparse.ArgumentParser):
    """A bad option is one line, ``agentrl <command>: error: <message>``, not the usage dump
    above it (``--help`` prints the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="agentrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"agentrl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=Parser)
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, error=sub.error)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; a bad input (a ``ValueError`` naming it) exits 2 with its message."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # `train model=tiny --print-config train.total_steps=3`: the last is one too
        if args.command in OVERRIDE_COMMANDS and not any(e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            args.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.run(args)
    except ValueError as error:  # bad options (unknown preset, bad setting): say which, no traceback
        args.error(str(error))
