"""Ctrl-C and SIGTERM: real signals to a real `mas train` process.

The tests wait for events, never for time: the first line of metrics.jsonl (a step has been
logged, so training is under way and the handlers are installed), for the second Ctrl-C the
first checkpoint and the line the first Ctrl-C prints.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from team_helpers import team_config

from mas.training.checkpoint import latest_checkpoint
from mas.cli import main

DEADLINE_S = 600  # generous: only a hung process gets near it (the CI machine may be busy)


@pytest.fixture()
def spawned():
    """Processes a test started; any still running at its end (a failed test) are killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_training(tmp_path: Path, model_dir: Path, spawned: list, *overrides: str) -> tuple[subprocess.Popen, Path]:
    cfg = team_config(model_dir, "chain")
    cfg["trainer"] = {**cfg["trainer"], "steps": 1000, "save_every": 0}  # far more steps than will run
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mas.cli", "train", str(path), "--run-dir", str(run), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    spawned.append(proc)
    return proc, run


def wait_for_first_step(proc: subprocess.Popen, run: Path, checkpointed: bool = False) -> None:
    """Block until metrics.jsonl holds a complete line, and with ``checkpointed`` until a
    checkpoint is complete too (or fail if the process ends first)."""
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + DEADLINE_S

    def ready() -> bool:
        logged = metrics.exists() and metrics.read_text().endswith("\n")
        return logged and (not checkpointed or latest_checkpoint(run) is not None)

    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"mas train ended (rc {proc.returncode}) before its first step:\n{err[-3000:]}")
        assert time.monotonic() < deadline, "no step was logged"
        time.sleep(0.05)  # polling a file for an event; the outcome does not depend on this interval


def logged_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_checkpoints_the_last_completed_step_and_exits_cleanly(tmp_path, tiny_model_dir, sig, code, spawned):
    proc, run = start_training(tmp_path, tiny_model_dir, spawned)
    wait_for_first_step(proc, run)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out
    steps = logged_steps(run)
    last = steps[-1]
    assert steps == list(range(last + 1))  # the step under way when the signal came was dropped, not logged
    assert latest_checkpoint(run).name == f"step_{last:06d}"  # the state before it is checkpointed (save_every is 0)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == {"reason": sig.name, "after_step": last}
    resume = f"resume with: {sys.executable} -m mas.cli train --resume {run}"
    assert resume in err
    if sig == signal.SIGINT:  # the printed command continues the run exactly where it stopped
        assert main(["train", "--resume", str(run), f"trainer.steps={last + 2}"]) == 0
        assert logged_steps(run) == list(range(last + 2))
        assert "stopped" not in json.loads((run / "summary.json").read_text())


def test_a_second_ctrl_c_abandons_the_step_and_keeps_the_last_checkpoint(tmp_path, tiny_model_dir, spawned):
    proc, run = start_training(tmp_path, tiny_model_dir, spawned, "trainer.save_every=1", "trainer.batch_size=4")
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    wait_for_first_step(proc, run, checkpointed=True)  # so there is a checkpoint to keep
    proc.send_signal(signal.SIGINT)
    while "stopping at the next safe point" not in lines.get(timeout=DEADLINE_S):  # the first one was heard
        pass
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=DEADLINE_S)
    reader.join(timeout=DEADLINE_S)
    err = "".join(iter_queue(lines))
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    # usually the second signal lands mid-step ("abandoned"); if the first had already dropped the
    # step, the run stopped normally: either way the last checkpoint is complete and the run resumes from it
    assert "abandoned the current step" in err or "resume with:" in err
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and (ckpt / "trainer_state.json").exists()
    done = int(ckpt.name.removeprefix("step_"))
    assert main(["train", "--resume", str(run), f"trainer.steps={done + 2}"]) == 0
    assert logged_steps(run) == list(range(done + 2))


def iter_queue(q: queue.Queue):
    while not q.empty():
        yield q.get()
