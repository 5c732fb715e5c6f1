#!/usr/bin/env bash
# Set up (if needed), train the embedded quickstart team offline on CPU, and write its report.
# Safe to run again: an earlier run in $RUN_DIR is moved aside (to runs/quickstart.old-N), not mixed in.
# Extra arguments are key.sub=value overrides (e.g. trainer.steps=10); MAS_SKIP_SETUP=1 skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${MAS_SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN_DIR=${RUN_DIR:-runs/quickstart}
.venv/bin/mas train configs/quickstart.yaml "$@" --run-dir "$RUN_DIR" --overwrite
.venv/bin/mas report "$RUN_DIR"
