"""The suite's command (scripts/test.sh: ``-n 2 --dist loadgroup``) runs every test that starts
verl on one xdist worker (tests/conftest.py: ``VERL_PROCESSES``): two verl runs side by side
need ~20 GB and each other's cores, and a V1 run beside another has hung past its timeout."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def suite_conftest():
    """``tests/conftest.py``, read from its file (``import conftest`` may find another folder's
    conftest first)."""
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests/conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VERL_FILES = ("tests/verl/test_child_run.py", "tests/verl/test_cluster.py")
"""Quick files under ``tests/verl/`` (no run starts, no verl import): the grouping goes by test
id, not by cost."""
OTHER_FILE = "tests/test_stats.py"
IN_PROCESS_FILE = "tests/verl/test_turn_discount.py"
"""A quick file under ``tests/verl/`` that starts no process: either worker may take it."""


@pytest.mark.slow  # two xdist workers started: ~30 s
def test_the_suite_runs_verls_tests_on_one_worker():
    pytest.importorskip("xdist")
    conftest = suite_conftest()
    assert all(conftest.runs_verl(name) for name in VERL_FILES)
    assert IN_PROCESS_FILE.startswith(conftest.VERL_PROCESSES)
    assert not conftest.runs_verl(IN_PROCESS_FILE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "-p", "no:randomly", *VERL_FILES, OTHER_FILE,
                           IN_PROCESS_FILE],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"\[(gw\d+)\].*?(?:PASSED|SKIPPED|XFAIL|XPASS) (tests/\S+?)::", done.stdout)
    workers = {path: {worker for worker, p in ran if p == path} for _, path in ran}
    assert set(workers) >= {*VERL_FILES, OTHER_FILE, IN_PROCESS_FILE}, done.stdout[-3000:]
    assert len(set().union(*(workers[f] for f in VERL_FILES))) == 1, workers
    # xdist names a grouped test ``<id>@<group>``: the verl files' ids carry it, the others' not
    grouped = set(re.findall(r"(tests/\S+?)::\S+@verl", done.stdout))
    assert grouped == set(VERL_FILES), grouped


def test_the_files_said_to_start_no_process_start_none():
    """A file listed in ``IN_PROCESS`` may run beside a verl training: it must not start one."""
    starts = re.compile(r"subprocess|ray\.init|verl_cpu_python|v1_python|launch\.launch\("
                        r"|verl_sft_folder|sys\.executable")
    conftest = suite_conftest()
    for name in conftest.IN_PROCESS:
        found = starts.findall((ROOT / name).read_text())
        assert not found, (name, found)
