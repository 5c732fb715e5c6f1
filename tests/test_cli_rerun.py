"""Runs that are safe to re-run: a run directory that holds a run is never written into by a
new run, --overwrite moves the old run aside, and old checkpoints are pruned atomically."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import yaml
from team_helpers import team_config

from mas.training.checkpoint import latest_checkpoint, prune_checkpoints
from mas.cli import main

REPO = Path(__file__).parents[1]


def write_config(tmp_path, model_dir, **trainer) -> Path:
    cfg = team_config(model_dir, "chain")
    cfg["trainer"] = {**cfg["trainer"], "steps": 2, **trainer}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def steps_in(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


def test_a_new_run_into_a_run_directory_refuses_and_overwrite_moves_the_old_run_aside(tmp_path, tiny_model_dir, capsys):
    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--run-dir", str(run)]) == 0
    metrics = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()

    assert main(["train", str(cfg), "--run-dir", str(run), "trainer.steps=1"]) == 2
    err = capsys.readouterr().err
    assert f"{run} already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert "run.old-1" in err and "Traceback" not in err
    assert (run / "metrics.jsonl").read_bytes() == metrics  # untouched
    assert main(["train", "--resume", str(run), "--overwrite"]) == 2

    # --overwrite: the old run is moved, whole, and the new one starts in an empty directory
    assert main(["train", str(cfg), "--run-dir", str(run), "trainer.steps=1", "--overwrite"]) == 0
    assert f"moved the old run to {tmp_path / 'run.old-1'}" in capsys.readouterr().err
    assert (tmp_path / "run.old-1" / "metrics.jsonl").read_bytes() == metrics
    assert steps_in(tmp_path / "run.old-1") == [0, 1] and steps_in(run) == [0]
    assert latest_checkpoint(tmp_path / "run.old-1").name == "step_000001"
    assert main(["train", str(cfg), "--run-dir", str(run), "trainer.steps=1", "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("run")) == ["run", "run.old-1", "run.old-2"]


def test_old_checkpoints_are_pruned_to_keep_last_and_resume_goes_on(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    args = ["train", str(cfg), "--run-dir", str(run), "trainer.steps=5", "trainer.save_every=1", "trainer.keep_last=2"]
    assert main([*args, "--stop-after", "4"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000002", "step_000003"]
    assert main(["train", "--resume", str(run)]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000003", "step_000004"]
    assert steps_in(run) == [0, 1, 2, 3, 4]


def fake_checkpoints(root: Path, steps: list[int], latest: int) -> None:
    for s in steps:
        (root / f"step_{s:06d}" / "policies").mkdir(parents=True)
    (root / "latest").write_text(f"step_{latest:06d}")


def test_pruning_never_deletes_what_latest_names_and_clears_leftovers(tmp_path):
    root = tmp_path / "checkpoints"
    fake_checkpoints(root, [1, 2, 3, 4], latest=1)  # e.g. latest rewound by hand to an older step
    (root / "step_000005.tmp").mkdir()  # a save that crashed
    (root / "step_000000.pruned").mkdir()  # a prune that crashed after its rename
    assert prune_checkpoints(tmp_path, keep_last=1) == ["step_000002", "step_000003"]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000004"]
    assert latest_checkpoint(tmp_path) == root / "step_000001"
    assert prune_checkpoints(tmp_path, keep_last=None) == []  # None keeps everything
    assert prune_checkpoints(tmp_path / "nowhere", keep_last=1) == []


def test_the_quickstart_script_runs_twice(tmp_path):
    """scripts/quickstart.sh as a user runs it (setup skipped: the test command did it), twice
    into the same run directory: the second run moves the first aside."""
    env = {**os.environ, "MAS_SKIP_SETUP": "1", "RUN_DIR": str(tmp_path / "qs")}
    quick = ["trainer.steps=1", "trainer.batch_size=2", "trainer.group_size=2", "trainer.eval_size=4", "logging.progress=false"]
    for _ in range(2):
        # own session: if it hangs, the whole group (bash and its mas processes) is ended, not just bash
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "quickstart.sh"), *quick], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=1200)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err
    assert (tmp_path / "qs" / "report.html").exists() and (tmp_path / "qs.old-1" / "report.html").exists()
    assert f"moved the old run to {tmp_path / 'qs.old-1'}" in err
