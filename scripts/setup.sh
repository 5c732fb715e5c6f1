#!/usr/bin/env bash
# Create a virtual environment and install mas with its test extras.
# torch is installed first and pinned (override with TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0+cu124"),
# so that the package's own dependency on torch is already met and pip pulls nothing bigger.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-dev}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
