"""Imports point one way (docs/SYSTEMDESIGN.md, Layers): a sub-package imports only lower ones,
function-level imports included, so the library never reaches up into a trainer, the report or
a command."""

import ast
from pathlib import Path

import agentrl

PACKAGE = Path(agentrl.__file__).parent
LAYERS = {
    "envs": 0,
    "agents": 1, "models": 1,
    "engines": 2,
    "rollout": 3,
    "evaluation": 4,
    "trainers": 5,
    "config": 6, "report": 6,
    "verl": 7,
    "cli": 8,
}
"""Each sub-package's floor: it may import its own floor's packages and those below."""


def imported_packages(path: Path) -> set[str]:
    """The ``agentrl.<package>`` names that ``path`` imports anywhere in its body."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= ({f"agentrl.{alias.name}" for alias in node.names}
                      if node.module == "agentrl" else {node.module})
    return {name.split(".")[1] for name in names if name.startswith("agentrl.")}


def test_every_sub_package_has_a_floor():
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == set(LAYERS)


def test_no_import_runs_upward():
    upward = []
    for path in sorted(PACKAGE.glob("*/**/*.py")):
        package = path.relative_to(PACKAGE).parts[0]
        upward += [f"{path.relative_to(PACKAGE.parent)} imports agentrl.{target}"
                   for target in sorted(imported_packages(path))
                   if LAYERS.get(target, -1) > LAYERS[package]]
    assert upward == []
