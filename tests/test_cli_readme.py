"""The README's commands are commands that work: each `agentrl` line of its bash blocks parses
with the CLI's own parser, names presets that exist, and its config overrides compose and
validate (`--print-config`, or verl's `--dry-run`); each script and benchmark it names exists
and runs as a script. The long ones (training, a run folder's eval) are checked, not run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agentrl import cli

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


AGENTRL = [line for line in readme_commands() if line.startswith("agentrl ")]


def test_the_readme_has_commands():
    assert len(AGENTRL) >= 15


@pytest.mark.parametrize("line", AGENTRL, ids=[line[:70] for line in AGENTRL])
def test_each_agentrl_line_parses_and_its_settings_validate(line, capsys, monkeypatch, tmp_path):
    from agentrl.agents import load_agent_presets
    from agentrl.config import compose_config

    monkeypatch.chdir(tmp_path)
    argv = words(line)[1:]
    args = cli.build_parser().parse_args(argv)  # a flag it lacks, a bad value: exit 2
    known = set(load_agent_presets())
    for preset in getattr(args, "presets", None) or []:
        assert preset in known, (line, preset)
    if args.command in cli.OVERRIDE_COMMANDS:
        config = compose_config(args.overrides)  # a bad key or value: ValueError naming it
        named = [*config.train.presets, *config.val.presets, *config.sft.presets]
        assert set(named) <= known, (line, named)
        if args.command != "make-data" and config.backend == "verl" and "--dry-run" in argv:
            assert cli.main(argv) == 0  # verl's own config classes check it
            assert "verl" in capsys.readouterr().out


OTHERS = [line for line in readme_commands() if line.startswith(("python ", "bash "))]


@pytest.mark.parametrize("line", OTHERS, ids=[line[:60] for line in OTHERS])
def test_each_script_it_names_exists_and_runs_as_a_script(line):
    from agentrl.cli.bench import benchmarks

    path = ROOT / words(line)[1]
    assert path.is_file(), line
    if path.parent == ROOT / "scripts" / "bench":
        assert path.stem in benchmarks(), line  # `agentrl bench <name>` runs it


def test_the_reference_rows_example_plays_what_its_comment_says():
    line = next(line for line in AGENTRL if "--policy oracle" in line)
    comment = line.split("#", 1)[1]
    assert "random" not in comment or "--policy random" in comment, line
