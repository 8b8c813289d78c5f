#!/usr/bin/env bash
# Run the test suite (the README's test command; .ci/run calls it too).
#   bash scripts/test.sh              # everything: ~10 min on 2 CPU cores (3 of them make TextWorld games)
#   bash scripts/test.sh -k sokoban   # extra arguments go to pytest
# Sets the machine up first with env_setup.sh (a no-op when already set up), with --verl-cpu on
# a machine without an NVIDIA GPU: vLLM's CPU build, so verl's real trainer runs in the suite
# (tests/verl/test_cpu_trainer.py: 13-16 min on a loaded 2-core machine, two verl runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if nvidia-smi -L >/dev/null 2>&1; then bash env_setup.sh; else bash env_setup.sh --verl-cpu; fi
exec python -m pytest -q "$@"
