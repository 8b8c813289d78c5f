#!/usr/bin/env bash
# Run the test suite (the README's test command; .ci/run calls it too).
#   bash scripts/test.sh              # everything: ~10 min on 2 CPU cores (3 of them make TextWorld games)
#   bash scripts/test.sh -k sokoban   # extra arguments go to pytest
# Sets the machine up first with env_setup.sh and, for the report's browser test, Chromium
# (scripts/install_chromium.sh); both are no-ops when already set up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash env_setup.sh
bash scripts/install_chromium.sh
exec python -m pytest -q "$@"
