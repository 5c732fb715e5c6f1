"""Crashes lose at most the current step: SIGKILL a real ``mas train`` at 10 points, resume each time.

A quickstart-sized run (the embedded warm-started team, so rewards and gradients are real; 4
steps of 2 tasks x 4 episodes, a checkpoint after every step) is started as a subprocess and
stopped with SIGKILL at the points below, each one named through ``mas.fault_points`` so the
kill lands exactly there, including inside a checkpoint that is half written.  After each kill:

* ``checkpoints/latest`` names a complete checkpoint, of a step before the one that was
  killed (or of that step, when the kill came after ``latest`` moved), and its weights load
  with ``transformers``;
* ``mas train --resume`` goes on from there, until the next kill point or the end.

The run that was killed ten times then equals a straight run of the same config bit for bit
on CPU: every metrics row (timings aside), every episode record, every policy's weights and
every optimizer state.  Torch runs one thread in both (``runtime.num_threads=1``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mas.checkpoint import latest_checkpoint
from mas.embedded import embedded_path

ROOT = Path(__file__).parents[1]
OVERRIDES = ["trainer.steps=4", "trainer.batch_size=2", "trainer.group_size=4", "trainer.eval_size=0",
             "trainer.save_every=1", "trainer.sample_episodes=2", "logging.progress=false", "runtime.num_threads=1",
             "runtime.deterministic=true"]
# (point, step): in the order a run passes them; each resume runs up to the next one
KILLS = [
    ("after_rollout", 1),        # mid-step
    ("after_update", 1),         # the weights moved in memory, nothing saved
    ("after_log", 1),            # metrics of step 1 written, its checkpoint not started
    ("checkpoint_written", 1),   # the checkpoint is complete in step_000001.tmp, not renamed
    ("checkpoint_renamed", 1),   # step_000001 in place, `latest` still names step 0
    ("step_start", 2),           # between steps
    ("after_update", 2),
    ("checkpoint_written", 2),
    ("after_log", 3),            # the last step's metrics written
    ("checkpoint_renamed", 3),   # the last checkpoint in place, `latest` not yet moved
]
WAIT_S = 600  # for a subprocess to reach its pause point: an event we wait for, not a timing we assert


def mas_train(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mas.cli", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_at(args: list[str], point: str, step: int, tmp_path: Path) -> None:
    """Run ``mas train args`` until it pauses at ``point`` of ``step``, then SIGKILL it."""
    flag = tmp_path / f"paused-{point}-{step}"
    env = {**os.environ, "MAS_PAUSE_AT": f"{point}:{step}", "MAS_PAUSE_FILE": str(flag)}
    proc = mas_train(args, env)
    deadline = time.monotonic() + WAIT_S
    while not flag.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"mas train ended (exit {proc.returncode}) before pausing at {point}:{step}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mas train never reached {point}:{step}")
        time.sleep(0.02)
    assert int(flag.read_text()) == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def finish(args: list[str]) -> None:
    proc = mas_train(args, {k: v for k, v in os.environ.items() if k not in ("MAS_PAUSE_AT", "MAS_PAUSE_FILE")})
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err[-3000:]


def check_latest(run: Path, killed_step: int) -> int:
    """``latest`` names a complete checkpoint no later than the killed step; its weights load. Its step."""
    from transformers import AutoModelForCausalLM

    ckpt = latest_checkpoint(run)
    assert ckpt is not None and not ckpt.name.endswith((".tmp", ".old"))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] <= killed_step and (ckpt / "random_states_0.pkl").is_file()
    for name in ("planner", "workers"):
        assert (ckpt / "learners" / name / "optimizer.bin").is_file()
        AutoModelForCausalLM.from_pretrained(ckpt / "policies" / name)
    return state["step"]


def records(path: Path, drop: tuple[str, ...] = ()) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


def test_ten_sigkills_lose_at_most_the_current_step_and_resume_bit_for_bit(tmp_path):
    embedded_path(log=lambda *_: None)  # build the embedded model once (cached), before any timing-free waits
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    config = str(ROOT / "configs" / "quickstart.yaml")
    finish([config, *OVERRIDES, "--run-dir", str(straight)])

    resumed_from = []
    for i, (point, step) in enumerate(KILLS):
        args = [config, *OVERRIDES, "--run-dir", str(killed)] if i == 0 else ["--resume", str(killed)]
        kill_at(args, point, step, tmp_path)
        resumed_from.append(check_latest(killed, step))
    finish(["--resume", str(killed)])
    # where each resume started: a kill before `latest` moves loses the step in progress, no more
    assert resumed_from == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]

    assert records(killed / "metrics.jsonl", drop=("time",)) == records(straight / "metrics.jsonl", drop=("time",))
    assert records(killed / "episodes.jsonl") == records(straight / "episodes.jsonl")
    a, b = latest_checkpoint(straight), latest_checkpoint(killed)
    assert a.name == b.name == "step_000003"
    max_diff = 0.0
    for name in ("planner", "workers"):
        from safetensors.torch import load_file

        wa, wb = load_file(a / "policies" / name / "model.safetensors"), load_file(b / "policies" / name / "model.safetensors")
        assert wa.keys() == wb.keys()
        max_diff = max([max_diff] + [float((wa[k] - wb[k]).abs().max()) for k in wa])
        for part in ("optimizer.bin", "scheduler.bin"):  # accelerate's files of the learner's state
            oa = torch.load(a / "learners" / name / part, weights_only=False)
            ob = torch.load(b / "learners" / name / part, weights_only=False)
            assert_same(oa, ob, part)
    assert max_diff == 0.0
    print(f"{len(KILLS)}/{len(KILLS)} kills recovered, max abs weight diff {max_diff}")


def assert_same(a, b, path: str = "") -> None:
    """Equal nested optimizer / scheduler states, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path
