#!/usr/bin/env bash
# Run the test suite (the README's test command; .ci/run calls it too).
#   bash scripts/test.sh              # everything: ~10 min on 2 CPU cores (3 of them make TextWorld games)
#   bash scripts/test.sh -k sokoban   # extra arguments go to pytest
# Sets the machine up first (no-ops when already done): env_setup.sh, with --verl-cpu on a
# machine without an NVIDIA GPU (vLLM's CPU build, so verl's real trainer runs in the suite:
# tests/verl/test_cpu_trainer.py: the legacy and the V1 trainer, each killed and resumed), and
# Chromium for the report's browser test (scripts/install_chromium.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if nvidia-smi -L >/dev/null 2>&1; then bash env_setup.sh; else bash env_setup.sh --verl-cpu; fi
bash scripts/install_chromium.sh
exec python -m pytest -q "$@"
