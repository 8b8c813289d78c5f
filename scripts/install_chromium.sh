#!/usr/bin/env bash
# Headless Chromium for the report's browser test (tests/report): Debian's `chromium` package.
#   bash scripts/install_chromium.sh     # ~1 min once (apt), then a no-op (< 0.1 s)
# Installs only where it can (root, or passwordless sudo, and apt-get); otherwise it says so
# and the browser tests skip with that message. scripts/test.sh runs it.
set -euo pipefail
for name in chromium chromium-browser google-chrome; do
  if command -v "$name" >/dev/null 2>&1; then exit 0; fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium.sh: no apt-get here; install Chromium yourself for the browser tests" >&2
  exit 0
fi
sudo=""
if [[ $(id -u) != 0 ]]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
    echo "install_chromium.sh: not root and no passwordless sudo; browser tests will skip" >&2
    exit 0
  fi
fi
echo "install_chromium.sh: installing Debian's chromium (for tests/report)"
$sudo apt-get install -y -q chromium >/dev/null 2>&1 \
  || { $sudo apt-get update -q >/dev/null 2>&1 && $sudo apt-get install -y -q chromium >/dev/null; } \
  || echo "install_chromium.sh: could not install chromium; browser tests will skip" >&2
