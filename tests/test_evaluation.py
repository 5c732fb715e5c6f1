"""mas.training.evaluation: avg@k and pass@k by hand, the paired noise floor, the greedy-regression
guard in a run (progress line, warnings, summary) and the best checkpoint that export takes."""

from __future__ import annotations

import json
import math

import pytest
from team_helpers import team_config

from mas.training.evaluation import paired_drop, regression, sampled_metrics
from mas.types import Episode, Task


def ep(reward: float, task: str = "t") -> Episode:
    return Episode(task=Task(task, "q", "a"), group_id=0, sample_id=0, seed=0, turns=[], reward=reward)


def test_avg_and_pass_at_k_by_hand():
    per_task = [[ep(1.0), ep(0.0), ep(0.0)],   # solved once in 3
                [ep(0.0), ep(0.0), ep(0.0)],   # never
                [ep(0.5), ep(0.25), ep(1.0)]]  # a graded reward: its best
    m = sampled_metrics(per_task)
    assert m["k"] == 3 and m["episodes"] == 9
    assert m["avg"] == pytest.approx((1 + 0.5 + 0.25 + 1.0) / 9)  # mean over all k * n episodes
    assert m["pass"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)  # mean over tasks of the best of k
    assert "accuracy" not in m  # the headline accuracy is the greedy one, never this


def test_paired_drop_by_hand():
    start = [1.0, 1.0, 0.0, 1.0]
    now = [0.0, 1.0, 0.0, 0.0]
    d = paired_drop(start, now)
    diffs = [-1.0, 0.0, 0.0, -1.0]
    mean = -0.5
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 3)
    assert d["change"] == pytest.approx(mean) and d["se"] == pytest.approx(sd / 2)
    assert d["floor"] == pytest.approx(max(2 * sd / 2, 1 / 4)) and d["tasks"] == 4
    assert paired_drop(start, now[:3]) is None and paired_drop([], []) is None  # not the same tasks


def test_regression_only_beyond_the_noise_floor():
    start = {"accuracy": 0.6, "tasks": [1.0] * 60 + [0.0] * 40}
    one_task = {"accuracy": 0.59, "tasks": [1.0] * 59 + [0.0] * 41}  # one task of 100: the floor is at least 1/n
    assert regression(start, one_task) is None
    worse = {"accuracy": 0.4, "tasks": [1.0] * 40 + [0.0] * 60}
    r = regression(start, worse)
    assert r["start"] == 0.6 and r["now"] == 0.4 and r["change"] == pytest.approx(-0.2) and r["floor"] < 0.2
    better = {"accuracy": 0.8, "tasks": [1.0] * 80 + [0.0] * 20}
    assert regression(start, better) is None
    assert regression(start, {"accuracy": 0.1}) is None  # an evaluation without per-task results cannot be paired


def test_a_run_that_falls_below_its_start_says_so_and_keeps_the_best_checkpoint(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """A scripted fall of the greedy team (the evaluations are replaced, the run is real): the periodic
    evaluations after it carry the regression, warnings.jsonl and the summary say so, the best
    checkpoint is the start's, and mas export takes it."""
    import mas.training.trainer as trainer
    from mas.config.schema import validate_config
    from mas.export import export_run
    from mas.training.team import build_team

    script = iter([0.8, 0.9, 0.3, 0.2])  # before, after step 1 (a new best), after step 3 and after step 5 (fallen)

    def fake_evaluate(team, size, seed, abort=None, progress=False, label="eval"):
        acc = next(script)
        ones = round(acc * size)
        return {"accuracy": acc, "decoding": "greedy", "tasks": [1.0] * ones + [0.0] * (size - ones), "episodes": size,
                "faults": {}}

    monkeypatch.setattr(trainer, "evaluate", fake_evaluate)
    cfg = team_config(tiny_model_dir, "chain")
    cfg["trainer"] = {**cfg["trainer"], "steps": 6, "eval_size": 10, "eval_every": 2, "keep_best": True, "save_every": 0}
    cfg["logging"] = {"progress": False}
    run = tmp_path / "run"
    with build_team(validate_config(cfg)) as team:
        summary = trainer.train(team, run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    periodic = [r for r in rows if r.get("eval") == "periodic"]
    assert [("regression" in r) for r in periodic] == [False, True, True]
    assert periodic[1]["regression"]["start"] == 0.8 and periodic[1]["regression"]["now"] == 0.3
    warned = [json.loads(line) for line in (run / "warnings.jsonl").read_text().splitlines()]
    assert [w["step"] for w in warned if w["kind"] == "greedy_regression"] == [3, 5]
    assert "greedy held-out accuracy fell from 0.800" in capsys.readouterr().out
    assert summary["greedy_regression"]["step"] == 5 and summary["greedy_regression"]["now"] == 0.2
    assert summary["best"] == {"step": 1, "accuracy": 0.9}
    state = json.loads((run / "checkpoints" / "best" / "trainer_state.json").read_text())
    assert state["step"] == 1 and (run / "checkpoints" / "latest").read_text() == "step_000005"
    out = tmp_path / "exported"
    logs = []
    export_run(run, out, log=logs.append)
    assert any("checkpoints/best" in line and "0.900" in line for line in logs)
