"""`mas study` end to end on tiny models: the grid of ordinary run directories, held-out curves,
study.json and study.html, resuming where it stopped, the token budget, and Ray tasks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from ray_helpers import local_ray
from study_helpers import METHODS, tiny_team_yaml

from mas.cli import main
from mas.config.schema import ConfigError
from mas.study import StudySpec, plan_jobs, run_study, write_outputs
from mas.study.runner import read_jsonl


def steps_of(run: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "eval" not in r]


def evals_of(run: Path) -> list[tuple[str, int | None]]:
    return [(r["eval"], r.get("step")) for r in read_jsonl(run / "metrics.jsonl") if "eval" in r]


def test_study_writes_a_grid_of_runs_with_held_out_curves(tiny_study):
    for method in METHODS:
        for seed in (0, 1):
            run = tiny_study / "runs" / method / f"seed_{seed}"
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            assert cfg["credit"]["method"] == method and cfg["trainer"]["seed"] == seed
            assert steps_of(run) == [0, 1]
            # before training (the baseline evaluates its start twice: the noise floor), then after every step
            # (trainer.eval_every = 1); "after" reuses the last
            noise = [("noise", None)] if method == "grpo" else []
            assert evals_of(run) == [("before", None), *noise, ("periodic", 0), ("periodic", 1), ("after", None)]
            assert cfg["trainer"]["eval_train"] is True and cfg["trainer"]["eval_noise"] is (method == "grpo")
            first = next(r for r in read_jsonl(run / "metrics.jsonl") if r.get("eval") == "before")
            assert first["decoding"] == "greedy" and "accuracy" in first["train"] and first["sampled"]["k"] >= 1
            for r in read_jsonl(run / "metrics.jsonl"):
                if "eval" not in r:  # generated-token accounting: rollouts and the credit method's own generations
                    gen = r["generated"]
                    assert gen["total"] == gen["rollout_tokens"] + gen["credit_tokens"] and gen["rollout_tokens"] == r["tokens"] > 0
                    assert (gen["credit_tokens"] > 0) == (method == "sharp")  # SHARP re-samples the checker per coalition
            assert json.loads((run / "study_run.json").read_text())["budget"] == {"kind": "steps", "limit": 2.0, "used": 2.0, "reached": True}
            assert (run / "checkpoints" / "latest").exists()
    study = json.loads((tiny_study / "study.json").read_text())
    assert [r["method"] for r in study["table"]] == list(METHODS) and study["baseline"] == "grpo"
    for axis in ("steps", "tokens", "seconds"):
        for method in METHODS:
            c = study["curves"][axis][method]
            assert len(c["x"]) == len(c["mean"]) == len(c["std"]) >= 2 and c["x"][0] == 0
    assert study["curves"]["steps"]["grpo"]["x"] == [0, 1, 2]
    by = {r["method"]: r for r in study["table"]}
    assert by["grpo"]["extra_compute"] == 0 and by["sharp"]["extra_compute"] > 0
    assert {p["method"] for p in study["frontier"]} == set(METHODS)
    html = (tiny_study / "study.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and 'data-method="sharp"' in html


def test_rerunning_a_finished_study_trains_nothing(tiny_study, capsys):
    spec = json.loads((tiny_study / "study_spec.json").read_text())
    before = {p: p.stat().st_mtime_ns for p in tiny_study.glob("runs/*/*/metrics.jsonl")}
    assert main(["study", spec["config"], "--methods", ",".join(METHODS), "--seeds", "2", "--out", str(tiny_study),
                 "--eval-every", "1", "trainer.steps=2"]) == 0
    assert "4 done, 0 to resume, 0 to start" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in tiny_study.glob("runs/*/*/metrics.jsonl")} == before


def test_a_different_study_in_the_same_directory_is_refused(tiny_study):
    spec = json.loads((tiny_study / "study_spec.json").read_text())
    with pytest.raises(ConfigError, match="seeds"):
        run_study(StudySpec(config=spec["config"], methods=METHODS, seeds=3, out=str(tiny_study), overrides=("trainer.steps=2",), eval_every=1))


@pytest.mark.parametrize("text, why", [
    ("team: {name: x\n", "YAML syntax"),  # an unclosed mapping
    ("a: &a [*a, *a]\n", "recursive structure"),  # a recursive alias: refused by the bounded reader, never expanded
    ("- just\n- a list\n", "expected a mapping"),
])
def test_a_study_of_an_unreadable_config_is_a_config_error_naming_the_file(tmp_path, text, why, capsys):
    from mas.cli import main

    config = tmp_path / "team.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=why) as e:
        run_study(StudySpec(config=str(config), methods=("grpo",), seeds=1, out=str(tmp_path / "study")))
    assert str(config) in str(e.value)
    assert main(["study", str(config), "--methods", "grpo", "--seeds", "1", "--out", str(tmp_path / "study")]) != 0
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_an_interrupted_study_resumes_from_checkpoints(tmp_path, tiny_model_dir, capsys):
    """One run stopped after step 0 (checkpointed, as Ctrl-C or a crash after a checkpoint leaves it),
    one never started: re-running continues the first from step 1 and trains the second."""
    from mas.config.schema import validate_config
    from mas.training.team import build_team
    from mas.training.trainer import train

    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir, save_every=1)
    spec = StudySpec(config=team_yaml, methods=("grpo",), seeds=2, out=str(tmp_path / "out"), eval_every=1)
    first = plan_jobs(spec)[0]
    train(build_team(validate_config(first.config)), Path(first.run_dir), stop_after=1)
    assert steps_of(Path(first.run_dir)) == [0] and not (Path(first.run_dir) / "study_run.json").exists()
    run_study(spec)
    assert "0 done, 1 to resume, 1 to start" in capsys.readouterr().out
    for job in plan_jobs(spec):
        assert job.state == "done" and steps_of(Path(job.run_dir)) == [0, 1]  # no step repeated or lost
    json_path, html_path = write_outputs(spec.out)
    assert json.loads(json_path.read_text())["table"][0]["seeds"] == 2 and html_path.exists()


def test_token_budget_counts_credit_generations(tmp_path, tiny_model_dir):
    """--budget tokens N: every run stops after the step that reaches N generated tokens, SHARP's
    coalition re-runs included, so SHARP (more tokens per step) gets no more steps than GRPO."""
    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir, steps=6)
    out = tmp_path / "out"
    assert main(["study", team_yaml, "--methods", "grpo,sharp", "--seeds", "1", "--out", str(out), "--budget", "tokens", "120",
                 "--eval-every", "2"]) == 0
    used = {}
    for method in ("grpo", "sharp"):
        run = out / "runs" / method / "seed_0"
        totals = [r["generated"]["total"] for r in read_jsonl(run / "metrics.jsonl") if "eval" not in r]
        assert sum(totals) >= 120 and sum(totals[:-1]) < 120  # stopped right after crossing the budget
        record = json.loads((run / "study_run.json").read_text())
        assert record["budget"]["used"] == sum(totals) and record["budget"]["reached"]
        assert evals_of(run)[-1] == ("periodic", len(totals) - 1)  # a final held-out point where it stopped
        assert json.loads((run / "summary.json").read_text())["stopped"]["reason"] == "BudgetStop.on_step_end"
        used[method] = len(totals)
    assert used["sharp"] <= used["grpo"] < 6
    study = json.loads((out / "study.json").read_text())
    assert "compute-matched" in study["checklist"][0]["value"]


def test_bad_study_arguments_fail_before_training(tmp_path, tiny_model_dir, capsys):
    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir)
    assert main(["study", team_yaml, "--methods", "grpo,magic", "--seeds", "1", "--out", str(tmp_path / "o")]) == 2
    assert "magic" in capsys.readouterr().err
    assert main(["study", team_yaml, "--methods", "grpo", "--seeds", "1", "--out", str(tmp_path / "o"), "--budget", "episodes", "3"]) == 2
    assert "valid: ['steps', 'tokens', 'seconds']" in capsys.readouterr().err
    assert main(["study", team_yaml, "--methods", "grpo", "--seeds", "1", "--out", str(tmp_path / "o"), "trainer.eval_size=0"]) == 2
    assert "eval_size" in capsys.readouterr().err
    assert not (tmp_path / "o" / "runs").exists()


def test_credit_blocks_per_method(tmp_path, tiny_model_dir):
    """Each method gets its own defaults; C3's roots follow group_size; --credit-set reaches one method."""
    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir)
    spec = StudySpec(config=team_yaml, methods=("dr_mas", "c3", "sharp"), seeds=1, out=str(tmp_path / "o"),
                     credit_sets=("sharp.marginal=loo", "c3.fanout=[2,3]"))
    by = {j.method: j.config["credit"] for j in plan_jobs(spec)}
    assert by["dr_mas"]["invalid_penalty"] == 0.1  # the config's own block (it names dr_mas)
    assert by["sharp"]["marginal"] == "loo" and by["c3"]["fanout"] == [2, 3]
    default = {j.method: j.config["credit"] for j in plan_jobs(StudySpec(config=team_yaml, methods=("c3",), seeds=1, out=str(tmp_path / "p")))}
    assert default["c3"]["fanout"] == [2, 4]  # [group_size, 4]


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    offline = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MAS_CACHE_DIR") if k in os.environ}
    with local_ray(num_cpus=2, log_to_driver=False, runtime_env={"env_vars": offline}) as ray:
        yield ray


def test_a_local_study_shows_each_runs_bar_after_its_line(tmp_path, tiny_model_dir, capfd):
    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir, steps=2)
    spec = StudySpec(config=team_yaml, methods=("grpo",), seeds=2, out=str(tmp_path / "out"), eval_every=1)
    run_study(spec)
    got = capfd.readouterr()
    assert "[1/2] grpo" in got.out and "[2/2] grpo" in got.out
    bars = [line for line in got.err.replace("\r", "\n").splitlines() if line.startswith("train")]
    assert sum("2/2" in line for line in bars) >= 2, got.err  # each run's steps, to its last


def test_runs_go_out_as_ray_tasks(tmp_path, tiny_model_dir, ray_cluster, capfd):
    """--executor ray: each run is one Ray task in another process; the same run directories
    result, and one bar counts the steps every run has written."""
    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir, steps=1)
    spec = StudySpec(config=team_yaml, methods=("grpo", "dr_mas"), seeds=1, out=str(tmp_path / "out"), eval_every=1)
    result = run_study(spec, executor="ray")
    assert "study steps" in capfd.readouterr().err
    assert sorted(r["method"] for r in result.records) == ["dr_mas", "grpo"]
    for job in plan_jobs(spec):
        assert job.state == "done" and steps_of(Path(job.run_dir)) == [0]
        info = json.loads((Path(job.run_dir) / "run_info.json").read_text())
        assert info["credit"]["method"] == job.method
    assert ray_cluster.is_initialized()  # a cluster the caller started is left running for it


def test_a_run_another_process_is_training_is_left_alone(tmp_path):
    """Two `mas study` processes on one directory: the second must not take the first's
    unfinished run (no checkpoint yet) for an abandoned start and delete it."""
    from mas.study.runner import Job, run_job, run_lock

    run_dir = tmp_path / "runs" / "grpo" / "seed_0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')  # training, before its first checkpoint
    job = Job("grpo", 0, str(run_dir), {}, "steps", 2.0, "new")
    with run_lock(run_dir) as held:  # the other process (flock: another open file conflicts)
        assert held
        assert run_job(job) == {"method": "grpo", "seed": 0, "run_dir": str(run_dir), "busy": True}
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 0}\n'  # untouched
    with run_lock(run_dir) as held:  # released when the holder is done
        assert held


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_busy_run_is_logged_and_left_for_its_holder(tmp_path, tiny_model_dir, executor, request):
    """Both executors report a run another process holds (a Ray task is such a process) and go on;
    the Ray path used to read the busy record's missing budget and fail."""
    from mas.study.runner import run_lock

    if executor == "ray":
        request.getfixturevalue("ray_cluster")
    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir, steps=1)
    spec = StudySpec(config=team_yaml, methods=("grpo",), seeds=1, out=str(tmp_path / "out"))
    (job,) = plan_jobs(spec)
    lines = []
    with run_lock(Path(job.run_dir)) as held:
        assert held
        result = run_study(spec, executor=executor, log=lines.append)
    assert result.records == [{"method": "grpo", "seed": 0, "run_dir": job.run_dir, "busy": True}]
    assert any("grpo/seed_0: another process is training it" in line for line in lines)
    assert not (Path(job.run_dir) / "study_run.json").exists()


def test_ctrl_c_in_mas_study_checkpoints_the_run_in_progress_and_the_same_command_resumes_it(tmp_path, tiny_model_dir):
    """A real SIGINT to `mas study` while its first run is inside step 1 (paused at a fault point
    until the stop request arrives): the run is checkpointed after step 0 and left unfinished, the
    second run is not started, the command exits 130; the same command then resumes the first
    run from step 1 and trains the second."""
    import signal
    import subprocess
    import sys
    import time

    team_yaml = tiny_team_yaml(tmp_path / "team.yaml", tiny_model_dir, save_every=1)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mas.cli", "study", team_yaml, "--methods", "grpo", "--seeds", "2", "--out", str(out),
           "--eval-every", "1", "--executor", "local"]
    pause = tmp_path / "paused"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MAS_PAUSE_AT": "mid_rollout:1",
           "MAS_PAUSE_FILE": str(pause)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 600  # only a hung process gets near it
        while not pause.exists():  # waiting for an event: the run reached step 1's rollout
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the study never reached step 1"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    first, second = plan_jobs(StudySpec(config=team_yaml, methods=("grpo",), seeds=2, out=str(out), eval_every=1))
    assert first.state == "resume" and steps_of(Path(first.run_dir)) == [0]
    assert not (Path(first.run_dir) / "study_run.json").exists()
    assert second.state == "new" and not Path(second.run_dir).exists()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 done, 1 to resume, 1 to start" in done.stdout
    for job in plan_jobs(StudySpec(config=team_yaml, methods=("grpo",), seeds=2, out=str(out), eval_every=1)):
        assert job.state == "done" and steps_of(Path(job.run_dir)) == [0, 1]
