"""``dtype: auto`` against bfloat16 (and float32): one training step of each shipped SmolLM2
config, side by side in one run.

For every config, each dtype runs ``mas train`` for ``--steps`` steps in a fresh process, the
arms of one config one after another (so they share the machine's load), with the same small
overrides: one task, two episodes (``trainer.batch_size=1 trainer.group_size=2``), every agent's
``max_new_tokens`` capped (``--max-new-tokens``), no warm-up, no evaluation, no checkpoint.
From each run's ``metrics.jsonl`` and ``run_info.json`` it reads the mean step time (rollout,
credit, update), its rollout and update parts, the peak resident memory, and the dtype the
policies loaded in (``auto`` resolved by ``mas.models.devices.resolve_dtype``), and prints
auto's step time over bfloat16's.

    python bench/dtype_speed.py [--configs configs/smol_debate.yaml ...] [--dtypes auto,bfloat16,float32]
                                [--isa onednn-avx2] [--steps 1] [--max-new-tokens 16] [--json out.json]

``--isa onednn-avx2`` runs every arm with oneDNN, the library torch's bfloat16 CPU matrix
products go through, held to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``): a CPU without bfloat16
instructions, like most laptops, on a machine that has them, float32 (MKL) keeping this CPU's
speed; ``dtype: auto`` reads the cap and resolves to float32 there.  ``--isa avx2`` also holds
MKL and torch's own kernels to AVX2 (``MKL_ENABLE_INSTRUCTIONS``, ``ATEN_CPU_CAPABILITY``), which
on this AMD CPU slows float32 far more than an AVX2 CPU's own float32 would be.  Nothing is asserted: the figures go to
docs/benchmarks/real_models.md with the command and the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SMALL = ["trainer.batch_size=1", "trainer.group_size=2", "trainer.eval_size=0", "trainer.save_every=0",
         "trainer.warmup.steps=0", "logging.progress=false"]
ISAS = {  # what --isa sets for every arm
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},  # bfloat16 instructions withheld; float32 (MKL) at full speed
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},  # all of torch
}


def overrides(config: Path, dtype: str, max_new_tokens: int) -> list[str]:
    """The arm's overrides: every policy that loads a real model in ``dtype``; agents capped."""
    data = yaml.safe_load(config.read_text())
    out = list(SMALL)
    for name, p in data["policies"].items():
        if p.get("model") != "embedded" and p.get("backend") != "openai":
            out.append(f"policies.{name}.dtype={dtype}")
    for a in data["agents"]:
        cap = min(max_new_tokens, (a.get("sampling") or {}).get("max_new_tokens", max_new_tokens))
        out.append(f"agents.{a['name']}.sampling.max_new_tokens={cap}")
    return out


def run_arm(config: Path, dtype: str, steps: int, max_new_tokens: int, env: dict) -> dict:
    """One ``mas train`` of ``steps`` steps; its step times, peak RSS and resolved dtypes."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "mas.cli", "train", str(config), f"trainer.steps={steps}",
               *overrides(config, dtype, max_new_tokens), "--run-dir", str(run)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"dtype": dtype, "error": proc.stderr[-1500:], "wall_s": round(wall, 1)}
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if "step" in r and "time" in r and "eval" not in r]
        info = json.loads((run / "run_info.json").read_text())
        loaded = sorted({p["dtype"] for p in info["policies"].values() if p["model"] != "embedded"})
        return {
            "dtype": dtype,
            "loaded": "+".join(loaded),
            "step_s": [round(r["time"]["step"], 1) for r in rows],
            "rollout_s": [round(r["time"]["rollout"], 1) for r in rows],
            "update_s": [round(r["time"]["update"], 1) for r in rows],
            "peak_rss_mb": max(r["memory"]["peak_rss_mb"] for r in rows),
            "episodes": sum(r["episodes"]["count"] for r in rows),
            "episode_errors": sum(r["episodes"]["errors"] for r in rows),
            "completion_tokens": sum(a["completion_tokens"] for r in rows for a in r["agents"].values()),
            "wall_s": round(wall, 1),
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("smol_*.yaml")))
    ap.add_argument("--dtypes", default="auto,bfloat16", help="comma-separated arms, the first compared with 'bfloat16'")
    ap.add_argument("--isa", choices=sorted(ISAS), default=None, help="hold torch's CPU kernels to this instruction set")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=16, help="cap on every agent's completion length")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **ISAS.get(args.isa, {})}
    dtypes = args.dtypes.split(",")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    out = {"commit": commit, "isa": args.isa, "steps": args.steps, "max_new_tokens": args.max_new_tokens,
           "overrides": SMALL, "cpu_count": os.cpu_count(), "configs": {}}
    for config in args.configs:
        arms = {}
        for dtype in dtypes:
            arm = run_arm(REPO / config, dtype, args.steps, args.max_new_tokens, env)
            arms[dtype] = arm
            print(f"{config} {dtype}: {json.dumps(arm)}", flush=True)
        first, bf16 = arms[dtypes[0]], arms.get("bfloat16")
        if bf16 and "step_s" in first and "step_s" in bf16:
            arms["ratio"] = round(statistics.mean(first["step_s"]) / statistics.mean(bf16["step_s"]), 3)
            print(f"{config}: {dtypes[0]} ({first['loaded']}) step / bfloat16 step = {arms['ratio']}", flush=True)
        out["configs"][config] = arms
        if args.json:  # after every config: a stopped run keeps what it measured
            Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
