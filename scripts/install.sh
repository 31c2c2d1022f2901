#!/usr/bin/env bash
# Install everything TreeGraft needs into ./.venv (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
# The app's browser test drives Debian's chromium (playwright itself comes from requirements.txt;
# never `playwright install`). Optional: without it tests/test_browser.py skips, so never fatal.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; } \
        || echo "install.sh: chromium not installed; tests/test_browser.py will skip" >&2
fi
