#!/usr/bin/env bash
# Run the test suite (the README's test command; .ci/run calls it too).
#   bash scripts/test.sh              # everything, on two workers (the slow tier and verl's CPU runs: most of it)
#   bash scripts/test.sh -k sokoban   # extra arguments go to pytest
# Sets the machine up first (no-ops when already done): env_setup.sh, with --verl-cpu on a
# machine without an NVIDIA GPU (vLLM's CPU build, so verl's real trainer runs in the suite:
# tests/verl/test_cpu_trainer.py: the legacy and the V1 trainer, each killed and resumed), and
# Chromium for the report's browser test (scripts/install_chromium.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if nvidia-smi -L >/dev/null 2>&1; then bash env_setup.sh; else bash env_setup.sh --verl-cpu; fi
bash scripts/install_chromium.sh
# two workers (2 cores); the tests that start verl run one after another on one of them
# (tests/conftest.py: VERL_PROCESSES), so two verl runs never share the memory
exec python -m pytest -q -n 2 --dist loadgroup "$@"
