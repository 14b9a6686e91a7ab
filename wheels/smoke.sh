#!/usr/bin/env bash
# Install a bubo wheel into a fresh virtual environment (no system site-packages) and run the
# smoke test there, from a directory outside the source tree so the installed package is used.
set -euo pipefail
wheel="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
venv="$(mktemp -d)/venv"
# no pip of its own (ensurepip costs seconds): this Python's pip installs into it
python -m venv --without-pip "$venv"
python -m pip --python "$venv/bin/python" install -q --disable-pip-version-check "$wheel"
cd "$(dirname "$venv")"
"$venv/bin/python" "$here/smoke.py"
