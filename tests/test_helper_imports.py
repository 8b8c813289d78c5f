"""Tests import helpers from each other's modules (``from test_local import chat_prompts``),
often inside a slow test's body, where a renamed helper fails only when that test runs: this
checks every such name against the module's top level, in a second."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def top_level_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level: functions, classes, assignments, imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_every_name_imported_from_a_test_module_is_defined_there():
    trees = {path: ast.parse(path.read_text()) for path in TESTS.rglob("*.py")}
    defined = {path.stem: top_level_names(tree) for path, tree in trees.items()}
    missing = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in defined:
                missing += [f"{path.relative_to(TESTS)}:{node.lineno}: {node.module}.{a.name}"
                            for a in node.names if a.name not in defined[node.module]]
    assert not missing, "imported but not defined:\n" + "\n".join(missing)
