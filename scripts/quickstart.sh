#!/usr/bin/env bash
# Set up (if needed) and train the embedded quickstart team offline on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/mas train configs/quickstart.yaml "$@"
