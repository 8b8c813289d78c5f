"""Run one of the benchmarks of the source checkout (``scripts/bench/<name>.py``).

    agentrl bench                                   # list them
    agentrl bench generate --model tiny --batch-sizes 1 4
    agentrl bench prefix_cache --help               # a benchmark's own options

Each prints a table and writes JSON under ``bench_results/`` (docs/DEVELOPMENT.md). The scripts
live in the source tree, beside the package; an installed wheel does not carry them.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import platform
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import agentrl

BENCH_DIR = Path(agentrl.__file__).resolve().parents[1] / "scripts" / "bench"


def write_result(out: str | Path, result: Any) -> Path:
    """A benchmark's result as JSON at ``out`` (its folder made), and a line saying where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return path


def script_module(path: str | Path) -> ModuleType:
    """The Python file at ``path`` imported as a module, once a process: how a benchmark loads a
    part of its own (``scripts/bench/output/``), since scripts/bench is no package and its
    scripts run by path (``agentrl bench``'s runpy, the tests)."""
    path = Path(path).resolve()
    name = "agentrl_bench_" + "_".join(path.with_suffix("").parts[-2:])
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="the benchmark (none: list them)")
    parser.add_argument("options", nargs=argparse.REMAINDER,
                        help="the benchmark's own options (see agentrl bench NAME --help)")


def benchmarks(folder: Path = BENCH_DIR, parts: bool = False) -> dict[str, str]:
    """Name -> the first line of its docstring (read, not run): the scripts that run (an
    ``if __name__ == "__main__"`` block); ``parts``: the modules a benchmark imports instead."""
    found = {}
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        tree = ast.parse(path.read_text())
        if _runs(tree) != parts:
            doc = ast.get_docstring(tree) or ""
            found[path.stem] = doc.splitlines()[0] if doc else ""
    return found


def _runs(tree: ast.Module) -> bool:
    """Whether a module has a top-level ``if __name__ == "__main__":``."""
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body)


def run(args: argparse.Namespace) -> int:
    available = benchmarks()
    if not available:
        raise ValueError(f"no benchmarks in {BENCH_DIR}: they live in the source checkout's "
                         "scripts/bench/ (clone the repository and install it with pip -e)")
    if args.name is None:
        width = max(map(len, available))
        for name, summary in available.items():
            print(f"{name:<{width}}  {summary}")
        return 0
    if args.name not in available:
        part = benchmarks(parts=True).get(args.name)
        if part is not None:
            raise ValueError(f"{args.name} is a part of another benchmark, not one to run "
                             f"({part}); allowed: {', '.join(available)}")
        raise ValueError(f"unknown benchmark {args.name!r}; allowed: {', '.join(available)}")
    from agentrl.models.common import ModelNotFoundError

    path = BENCH_DIR / f"{args.name}.py"
    argv = sys.argv
    sys.argv = [str(path), *args.options]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as stop:  # `raise SystemExit("<what was wrong>")`: a bad input too
        if isinstance(stop.code, str):
            raise ValueError(stop.code) from None
        raise
    except ModelNotFoundError as error:  # --model names nothing that loads
        raise ValueError("--model: " + " ".join(str(error).split())) from None
    finally:
        sys.argv = argv
    return 0
