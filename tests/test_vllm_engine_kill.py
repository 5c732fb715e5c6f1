"""A process that holds a vLLM engine and is killed outright (SIGKILL, no handler, no finaliser)
leaves none of the engine's processes behind: the engine's watcher stops them.  Runs where vLLM is
installed (marked ``vllm``; ``scripts/test.sh`` runs it in ``.venv-vllm``).  A file of its own, apart
from test_vllm_train.py's SIGTERM run, so that the vLLM tier's two processes run them side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_vllm_train import GENEROUS_S, REPO, require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from vllm_helpers import policy
from mas.agents.policy import build_policies

if __name__ == "__main__":
    from mas.rollout.backends.vllm import VLLMBackend
    backend = VLLMBackend(build_policies({"base": policy("frozen")}), max_model_len=512)
    print("PIDS", *backend.engine_pids(), flush=True)
    time.sleep(600)
"""


def test_a_process_killed_outright_leaves_no_engine_process(tmp_path):
    """SIGKILL runs no handler and no finaliser: the engine's watcher process stops its processes."""
    require_vllm()
    import psutil

    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"  # little on stdout; the pipe is read up to the PIDS line only
    proc = subprocess.Popen([sys.executable, str(script), str(REPO / "tests" / "backends")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while not line.startswith("PIDS "):  # vLLM logs to stdout too; blocks until the engine is up
            line = proc.stdout.readline()
            assert line, "the script ended without starting an engine"
        pids = [int(p) for p in line.split()[1:]]
        assert pids and all(psutil.pid_exists(p) for p in pids)
        proc.kill()
        proc.wait(timeout=GENEROUS_S)
        deadline = time.monotonic() + GENEROUS_S
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"engine processes outlived their killed parent: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
