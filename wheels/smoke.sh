#!/usr/bin/env bash
# Install a bubo wheel into a fresh virtual environment (no system site-packages) and run the
# smoke test there, from a directory outside the source tree so the installed package is used.
set -euo pipefail
wheel="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
venv="$(mktemp -d)/venv"
python -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
cd "$(dirname "$venv")"
"$venv/bin/python" "$here/smoke.py"
