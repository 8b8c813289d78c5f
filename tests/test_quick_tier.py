"""The quick tier (``python -m pytest -q -m "not slow"``, docs/DEVELOPMENT.md) still tests every
module of the package: each ``agentrl/**/*.py`` module is imported by a test file that has a
test not marked slow, or is named in ``REACHED_THROUGH`` with the quick test file that runs it.
Marking a module's last quick test slow fails here. Read from the sources (no test is run)."""

from __future__ import annotations

import ast
from pathlib import Path

import agentrl

PACKAGE = Path(agentrl.__file__).parent
TESTS = Path(__file__).parent

REACHED_THROUGH = {
    "agentrl.cli.arguments": "tests/test_bad_inputs.py",  # every command's argument errors
    "agentrl.cli.interrupt": "tests/test_cli_train.py",  # Ctrl-C in a subprocess
    "agentrl.cli.run_settings": "tests/test_cli_eval.py",  # eval of a run as it validated
    "agentrl.cli.make_data": "tests/test_bad_inputs.py",  # `agentrl make-data` refusals
    "agentrl.cli.first_prompts": "tests/test_bad_inputs.py",  # a budget the first prompt overfills
    "agentrl.cli.sft_report": "tests/test_cli_report.py",  # `agentrl report` of an sft folder
    "agentrl.cli.play": "tests/test_cli_play.py",
    "agentrl.cli.report": "tests/report/test_report.py",
    "agentrl.cli.sft": "tests/test_bad_inputs.py",
    "agentrl.cli.train": "tests/test_cli_train.py",
    "agentrl.config.rules": "tests/config/test_config.py",  # TrainConfig's cross-key refusals
    "agentrl.config.verl_rules": "tests/verl/test_launch.py",  # TrainConfig's verl refusals
    "agentrl.verl.agent_loop_v1": "tests/verl/test_agent_loop.py",  # loaded by its FQN
    "agentrl.verl.rows": "tests/verl/test_agent_loop.py",  # the loop's rows, through verl's workers
    "agentrl.engines.replies": "tests/engines/test_jump_forward.py",  # BatchingLLM's replies
    "agentrl.envs.search": "tests/envs/test_sokoban.py",  # the oracles' search
    "agentrl.evaluation.references": "tests/test_evaluation.py",
    "agentrl.models.embedded": "tests/models/test_loading.py",  # through loading
    "agentrl.models.parts": "tests/engines/test_features.py",
    "agentrl.models.tiny": "tests/models/test_loading.py",  # load_model("tiny")
    "agentrl.trainers.best": "tests/trainers/test_best_checkpoint.py",  # through LocalTrainer
    "agentrl.trainers.device": "tests/trainers/test_gae_wiring.py",
    "agentrl.trainers.episodes": "tests/trainers/test_gae_wiring.py",
    "agentrl.trainers.reference": "tests/trainers/test_reference.py",
    "agentrl.trainers.update_loop": "tests/trainers/test_accumulation.py",
    "agentrl.verl.episode_task": "tests/verl/test_data.py",  # EpisodeTask via agent_loop
    "agentrl.verl.logits_processor": "tests/verl/test_constrained_decoding.py",
    "agentrl.verl.server_llm": "tests/verl/test_agent_loop.py",  # ServerLLM via agent_loop
}
"""Modules no quick test file imports by name (a command run through ``agentrl.cli.main``, a
helper of another module) -> the quick test file that runs them."""


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def package_modules() -> set[str]:
    return {dotted(path) for path in PACKAGE.rglob("*.py")
            if path.name not in ("__init__.py", "__main__.py")}


def reexported() -> dict[str, str]:
    """``agentrl.agents.Agent`` -> ``agentrl.agents.agent``: names a package's ``__init__``
    imports from its modules."""
    names = {}
    for init in PACKAGE.rglob("__init__.py"):
        package = dotted(init.parent / "__init__.py").removesuffix(".__init__")
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and node.module:
                source = node.module if node.level == 0 else f"{package}.{node.module}"
                names |= {f"{package}.{alias.asname or alias.name}": source
                          for alias in node.names}
    return names


def imported(tree: ast.AST, reexports: dict[str, str]) -> set[str]:
    """Dotted names a test file imports anywhere, or names in a string (``"agentrl.envs.x:Env"``,
    a monkeypatch target), with re-exported names resolved to their modules."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            full = {f"{node.module}.{alias.name}" for alias in node.names}
            names |= {node.module, *full, *(reexports[n] for n in full if n in reexports)}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value.split(":")[0])
    return names


def is_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def has_quick_test(tree: ast.Module) -> bool:
    """A test function or method without ``@pytest.mark.slow``, in a module whose
    ``pytestmark`` is not slow."""
    if any(isinstance(node, ast.Assign) and is_slow(node)
           and any(getattr(target, "id", "") == "pytestmark" for target in node.targets)
           for node in tree.body):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and node.name.startswith("test") and not any(map(is_slow, node.decorator_list))
               for node in ast.walk(tree))


def quick_test_files() -> dict[str, ast.Module]:
    trees = {f"tests/{path.relative_to(TESTS)}": ast.parse(path.read_text(encoding="utf-8"))
             for path in sorted(TESTS.rglob("test_*.py"))}
    return {name: tree for name, tree in trees.items() if has_quick_test(tree)}


def test_every_module_has_a_quick_test():
    reexports = reexported()
    covered = set().union(*(imported(tree, reexports) for tree in quick_test_files().values()))
    untested = sorted(package_modules() - covered - set(REACHED_THROUGH))
    assert untested == [], f"no quick test imports {untested}: add one, or name it in REACHED_THROUGH"


def test_reached_through_names_existing_modules_and_quick_test_files():
    quick = quick_test_files()
    assert sorted(set(REACHED_THROUGH) - package_modules()) == []
    assert sorted(set(REACHED_THROUGH.values()) - set(quick)) == []


def test_a_file_whose_tests_are_all_slow_is_not_quick():
    slow = ast.parse("import pytest\n@pytest.mark.slow\ndef test_a(): pass\n")
    marked = ast.parse("import pytest\npytestmark = pytest.mark.slow\ndef test_a(): pass\n")
    mixed = ast.parse("import pytest\n@pytest.mark.slow\ndef test_a(): pass\n"
                      "class TestB:\n    def test_b(self): pass\n")
    assert [has_quick_test(tree) for tree in (slow, marked, mixed)] == [False, False, True]
