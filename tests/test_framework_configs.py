"""The shipped framework configs train with the embedded model, from a fresh process at the
repository root: `mas train configs/...` finds the examples package (the current directory comes
first when a config's `factory`/`builder`/`reward` is imported, as with `python -m`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]


@pytest.mark.parametrize("name,agents", [
    ("autogen_selector", {"router", "add", "sub"}),
    ("langgraph_custom", {"solve", "check"}),
])
def test_a_framework_config_trains_from_the_repository_root(name, agents, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ""}  # nothing but the current directory makes `examples` importable
    cmd = [sys.executable, "-m", "mas.cli", "train", f"configs/{name}.yaml", "trainer.steps=1", "trainer.batch_size=2",
           "trainer.eval_size=4", "logging.progress=false", "--run-dir", str(run)]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out team accuracy: before" in out.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    row = [r for r in rows if "eval" not in r][-1]  # the last step (evaluation rows come before and after it)
    assert row["step"] == 0 and row["episodes"]["errors"] == 0
    assert set(row["policies"]) == agents  # every agent's own policy was updated
    assert all(math.isfinite(p["loss"]) for p in row["policies"].values())
    assert (run / "checkpoints" / "latest").read_text() == "step_000000"
