"""Crashes lose at most the current step: SIGKILL a real ``mas train`` at 10 points, resume each time.

A quickstart-sized run (the embedded warm-started team, so rewards and gradients are real; 4
steps of 2 tasks x 4 episodes, a checkpoint after every step) is started as a subprocess and
stopped with SIGKILL at the points below, each one named through ``mas.process.fault_points`` so the
kill lands exactly there, including inside a checkpoint that is half written.  After each kill:

* ``checkpoints/latest`` names a complete checkpoint, of a step before the one that was
  killed (or of that step, when the kill came after ``latest`` moved), and its weights load
  with ``transformers``;
* ``mas train --resume`` goes on from there, until the next kill point or the end.

The run that was killed ten times then equals a straight run of the same config bit for bit
on CPU: every metrics row (timings aside), every episode record, every policy's weights and
every optimizer state.  Torch runs one thread in both (``runtime.num_threads=1``).

The straight run is a fresh ``python -m mas.cli train``; the killed and resumed runs are forked
from one pre-imported interpreter (tests/forked_cli.py): each is still its own process, killed
for real, that starts with no run in memory, but none pays for the imports again.  A
forked run equals the fresh straight one, so nothing here depends on which start-up it had.
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
from forked_cli import Zygote

from mas.training.checkpoint import latest_checkpoint
from mas.embedded.build import ensure_embedded

ROOT = Path(__file__).parents[1]
OVERRIDES = ["trainer.steps=4", "trainer.batch_size=2", "trainer.group_size=4", "trainer.eval_size=0",
             "policies.planner.optim.micro_batch_tokens=64", "policies.workers.optim.micro_batch_tokens=64",
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


def plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("MAS_PAUSE_AT", "MAS_PAUSE_FILE")}


@pytest.fixture(scope="module")
def zygote():
    """Forks the killed and resumed ``mas train`` processes (see the module docstring)."""
    z = Zygote(plain_env())
    yield z
    z.close()


def mas_train(args: list[str], env: dict, zygote: Zygote, tmp_path: Path):
    """``mas train args``, a process forked by ``zygote`` (its stdout and stderr in files under ``tmp_path``)."""
    return zygote.mas(["train", *args], tmp_path, env)


def kill_at(args: list[str], point: str, step: int, tmp_path: Path, zygote: Zygote) -> None:
    """Run ``mas train args`` until it pauses at ``point`` of ``step``, then SIGKILL it."""
    flag = tmp_path / f"paused-{point}-{step}"
    env = {**plain_env(), "MAS_PAUSE_AT": f"{point}:{step}", "MAS_PAUSE_FILE": str(flag)}
    proc = mas_train(args, env, zygote, tmp_path)
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


def finish(args: list[str], zygote: Zygote, tmp_path: Path) -> None:
    proc = mas_train(args, plain_env(), zygote, tmp_path)
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


CONFIG = str(ROOT / "configs" / "quickstart.yaml")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The run every interrupted one must equal: the same config, never stopped."""
    ensure_embedded(log=lambda *_: None)  # build the embedded model once (cached), before any timing-free waits
    run = tmp_path_factory.mktemp("straight") / "run"
    # a fresh interpreter (not forked): the forked runs must equal a plain `mas train`
    proc = subprocess.run([sys.executable, "-m", "mas.cli", "train", CONFIG, *OVERRIDES, "--run-dir", str(run)],
                          cwd=ROOT, env=plain_env(), capture_output=True, text=True, timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def assert_same_run(a: Path, b: Path) -> float:
    """Two runs of the quickstart equal bit for bit: metrics (timings and memory aside), episodes,
    the final weights and optimizer states.  Returns the largest weight difference (0.0)."""
    drop = ("time", "memory")
    assert records(a / "metrics.jsonl", drop=drop) == records(b / "metrics.jsonl", drop=drop)
    assert records(a / "episodes.jsonl") == records(b / "episodes.jsonl")
    ca, cb = latest_checkpoint(a), latest_checkpoint(b)
    assert ca.name == cb.name == "step_000003"
    max_diff = 0.0
    for name in ("planner", "workers"):
        from safetensors.torch import load_file

        wa, wb = load_file(ca / "policies" / name / "model.safetensors"), load_file(cb / "policies" / name / "model.safetensors")
        assert wa.keys() == wb.keys()
        max_diff = max([max_diff] + [float((wa[k] - wb[k]).abs().max()) for k in wa])
        for part in ("optimizer.bin", "scheduler.bin"):  # accelerate's files of the learner's state
            oa = torch.load(ca / "learners" / name / part, weights_only=False)
            ob = torch.load(cb / "learners" / name / part, weights_only=False)
            assert_same(oa, ob, part)
    assert max_diff == 0.0
    return max_diff


def test_ten_sigkills_lose_at_most_the_current_step_and_resume_bit_for_bit(tmp_path, straight, zygote):
    killed = tmp_path / "killed"
    config = CONFIG

    resumed_from = []
    for i, (point, step) in enumerate(KILLS):
        args = [config, *OVERRIDES, "--run-dir", str(killed)] if i == 0 else ["--resume", str(killed)]
        kill_at(args, point, step, tmp_path, zygote)
        resumed_from.append(check_latest(killed, step))
    finish(["--resume", str(killed)], zygote, tmp_path)
    # where each resume started: a kill before `latest` moves loses the step in progress, no more
    assert resumed_from == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]

    max_diff = assert_same_run(killed, straight)
    print(f"{len(KILLS)}/{len(KILLS)} kills recovered, max abs weight diff {max_diff}")


@pytest.mark.parametrize("point, step, kept", [("mid_update", 2, 1), ("mid_rollout", 0, -1)],
                         ids=["mid-update-of-step-2", "mid-rollout-of-step-0"])
def test_a_sigterm_inside_a_step_drops_it_checkpoints_the_state_before_it_and_resumes_bit_for_bit(
        tmp_path, straight, zygote, point, step, kept):
    """A real SIGTERM to a real ``mas train`` paused inside a step's work (between two
    micro-batches of an update's gradients, or two generation batches of a rollout): the run
    stops at that safe point without finishing the step, its checkpoint is the state before
    the step, and ``--resume`` then gives the straight run bit for bit."""
    run, flag = tmp_path / "run", tmp_path / "paused"
    env = {**plain_env(), "MAS_PAUSE_AT": f"{point}:{step}", "MAS_PAUSE_FILE": str(flag)}
    proc = mas_train([CONFIG, *OVERRIDES, "--run-dir", str(run)], env, zygote, tmp_path)
    deadline = time.monotonic() + WAIT_S
    while not flag.exists():  # the event: the run is inside the step's work
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"mas train ended (exit {proc.returncode}) before pausing at {point}:{step}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"mas train never reached {point}:{step}"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert f"stopped in step {step}, which was dropped" in out
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and json.loads((ckpt / "trainer_state.json").read_text())["step"] == kept
    metrics = run / "metrics.jsonl"
    logged = [r["step"] for r in records(metrics) if "step" in r and "eval" not in r] if metrics.exists() else []
    assert logged == list(range(kept + 1))  # the dropped step left no record
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == {"reason": "SIGTERM", "after_step": kept}
    finish(["--resume", str(run)], zygote, tmp_path)
    assert_same_run(run, straight)


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
