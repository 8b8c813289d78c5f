"""Test-wide settings: a private cache so tests never read or write the user's game pool."""

import os
import tempfile

import pytest

# Before any test module loads torch: OpenMP reads its wait policy then (agentrl/__init__.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config):
    # Set at start-up (not in a fixture) so subprocesses started by tests inherit it.
    # AGENTRL_TEST_CACHE keeps generated games between local runs; CI starts empty.
    os.environ["AGENTRL_CACHE"] = os.environ.get("AGENTRL_TEST_CACHE") or tempfile.mkdtemp(
        prefix="agentrl-test-cache-"
    )


VERL_PROCESSES = ("tests/verl/", "tests/bench/test_learn_verl.py",
                  "tests/bench/test_verl_startup_bench.py")
"""Tests that start verl, Ray or vLLM's CPU build (a trainer run takes up to ~10 GB)."""
IN_PROCESS = ("tests/verl/test_agent_loop.py", "tests/verl/test_cpu_platform.py",
              "tests/verl/test_data.py", "tests/verl/test_data_new_games.py",
              "tests/verl/test_doctor_probe.py", "tests/verl/test_preflight.py",
              "tests/verl/test_returns.py", "tests/verl/test_turn_discount.py")
"""Files under :data:`VERL_PROCESSES` that start no process (verl's code on fakes, its config
checks, its dispatch replayed in memory): either worker takes them. The preflight's replays alone
are ~8 minutes of one core; a new file under ``tests/verl/`` is serial until listed here."""


def runs_verl(nodeid: str) -> bool:
    """Whether the test starts verl, Ray or vLLM (so it waits for the others that do)."""
    return nodeid.startswith(VERL_PROCESSES) and not nodeid.startswith(IN_PROCESS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist (``-n 2 --dist loadgroup``, scripts/test.sh) the tests that start verl
    (:func:`runs_verl`) run one after another on one worker, so two verl runs never share the
    machine's memory, while the other worker takes the rest; without xdist the mark does
    nothing. First among the hooks: xdist reads the marks into the worker's test ids in its own
    hook, and this conftest registers before it (pytest loads ``tests/conftest.py`` at
    start-up), so it would run after."""
    for item in items:
        if runs_verl(item.nodeid):
            item.add_marker(pytest.mark.xdist_group("verl"))


@pytest.fixture(scope="session")
def cache_dir() -> str:
    return os.environ["AGENTRL_CACHE"]


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: a tiny model gains nothing from two, and on a busy 2-core machine
    OpenMP's spinning threads make small batched matmuls ~10x slower (50 s vs 15 s measured)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    """The tiny random-initialised model and its tokenizer."""
    from agentrl.models import load_model

    return load_model("tiny")


@pytest.fixture(scope="module")
def load_script():
    """``load_script("scripts/bench/rollout.py")``: a script of the repository imported as a
    module (registered by name while the test module runs: dataclasses look their module up)."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = []

    def load(relative: str):
        name = "agentrl_script_" + Path(relative).stem
        spec = importlib.util.spec_from_file_location(name, root / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        names.append(name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in names:
        sys.modules.pop(name, None)
