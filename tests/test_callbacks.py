"""Callbacks and early stop: a run asked to stop ends at a step boundary with a checkpoint
that ``--resume`` continues, and its hooks see every step, evaluation and checkpoint."""

from __future__ import annotations

import json

import torch
from team_helpers import team_config, varied_reward

from mas.training.callbacks import RunControl
from mas.config.schema import validate_config
from mas.training.team import build_team
from mas.training.trainer import train


def build(model_dir, **trainer):
    cfg = team_config(model_dir, "chain")
    cfg["trainer"] = {**cfg["trainer"], "steps": 4, "save_every": 0, **trainer}
    team = build_team(validate_config(cfg))
    team.engine.score = varied_reward
    return team


class Recorder:
    """Records every hook call; asks to stop at the end of ``stop_at``."""

    def __init__(self, stop_at: int | None = None):
        self.stop_at = stop_at
        self.calls: list[tuple] = []

    def on_step_end(self, step, metrics, groups, credit):
        assert metrics["step"] == step and len(groups) == 2 and credit.advantages.numel() > 0
        self.calls.append(("step", step))
        return step == self.stop_at

    def on_eval(self, name, metrics):
        self.calls.append(("eval", name))

    def on_checkpoint(self, step, path):
        assert (path / "trainer_state.json").exists()
        self.calls.append(("checkpoint", step))


def steps_logged(run_dir) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "step" in r]


def test_a_callback_stops_the_run_cleanly_with_a_resumable_checkpoint(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    rec = Recorder(stop_at=1)
    summary = train(build(tiny_model_dir), run, callbacks=[rec])
    assert summary["stopped"] == {"reason": "Recorder.on_step_end", "after_step": 1}
    assert rec.calls == [("step", 0), ("step", 1), ("checkpoint", 1)]  # save_every 0: only the stop saves
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"
    assert steps_logged(run) == [0, 1]
    assert json.loads((run / "summary.json").read_text())["stopped"]["after_step"] == 1

    # resume finishes the run; the result equals a straight run's
    resumed = build(tiny_model_dir)
    summary = train(resumed, run, resume=True)
    assert "stopped" not in summary
    assert steps_logged(run) == [0, 1, 2, 3]
    straight = build(tiny_model_dir)
    train(straight, tmp_path / "straight")
    for a, b in zip(resumed.policies["main"].model.parameters(), straight.policies["main"].model.parameters()):
        assert torch.equal(a, b)


def test_hooks_see_evaluations_steps_and_checkpoints_in_order(tiny_model_dir, tmp_path):
    rec = Recorder()
    team = build(tiny_model_dir, steps=2, eval_size=2, save_every=1)
    summary = train(team, tmp_path / "run", callbacks=[rec])
    assert "stopped" not in summary
    assert rec.calls == [("eval", "before"), ("step", 0), ("checkpoint", 0), ("step", 1), ("checkpoint", 1), ("eval", "after")]


def test_a_stop_requested_before_the_first_step_trains_nothing(tiny_model_dir, tmp_path):
    control = RunControl()
    control.request_stop("test")
    control.request_stop("second reason is ignored")
    team = build(tiny_model_dir)
    before = [p.detach().clone() for p in team.policies["main"].model.parameters()]
    summary = train(team, tmp_path / "run", control=control)
    assert summary["stopped"] == {"reason": "test", "after_step": None} and "eval_after" not in summary
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing to checkpoint
    assert all(torch.equal(a, b) for a, b in zip(before, team.policies["main"].model.parameters()))
