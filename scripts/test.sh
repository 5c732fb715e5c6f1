#!/usr/bin/env bash
# Set up (if needed) and run the test suite on CPU. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MAS_CACHE_DIR=${MAS_CACHE_DIR:-$PWD/.mas_tmp/cache}
.venv/bin/python -m pytest -q "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$status"
