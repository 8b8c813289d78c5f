"""OpenMP's wait policy: ``import agentrl`` makes idle threads sleep, and a program that loaded
torch first (too late for OpenMP to read it) is told, not silently left spinning."""

from __future__ import annotations

import os
import subprocess
import sys


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, check=True, timeout=300)


def test_importing_agentrl_first_sets_passive_waiting_quietly():
    done = run("import os, agentrl, torch; print(os.environ['OMP_WAIT_POLICY'])")
    assert done.stdout.strip() == "PASSIVE" and "spin" not in done.stderr


def test_torch_imported_first_is_warned_about():
    done = run("import torch, agentrl")
    assert "torch was imported before agentrl" in done.stderr
    assert "OMP_WAIT_POLICY=PASSIVE" in done.stderr


def test_a_policy_the_user_set_is_kept_and_not_warned_about():
    done = run("import os, torch, agentrl; print(os.environ['OMP_WAIT_POLICY'])",
               OMP_WAIT_POLICY="ACTIVE")
    assert done.stdout.strip() == "ACTIVE" and "imported before" not in done.stderr
