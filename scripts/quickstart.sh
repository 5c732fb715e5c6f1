#!/usr/bin/env bash
# Set up (if needed), train the embedded quickstart team offline on CPU, and write its report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN_DIR=${RUN_DIR:-runs/quickstart}
.venv/bin/mas train configs/quickstart.yaml "$@" --run-dir "$RUN_DIR"
.venv/bin/mas report "$RUN_DIR"
