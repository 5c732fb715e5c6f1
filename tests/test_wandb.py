"""Weights & Biases is optional: used only when logging.wandb is set, with a clear error if missing."""

from __future__ import annotations

import sys
import types

import yaml
from team_helpers import team_config

from mas.cli import main


class FakeRun:
    def __init__(self, **kwargs):
        self.init = kwargs
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def write(tmp_path, model_dir, wandb: dict | None):
    cfg = team_config(model_dir, "chain", trainer={"steps": 2, "batch_size": 1, "group_size": 2, "eval_size": 0})
    cfg["logging"] = {"progress": False, **({"wandb": wandb} if wandb else {})}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_step_metrics_go_to_wandb_when_configured(tmp_path, tiny_model_dir, monkeypatch):
    runs: list[FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    path = write(tmp_path, tiny_model_dir, {"project": "mas-tests", "mode": "offline", "tags": ["ci"]})
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    (run,) = runs
    assert run.init["project"] == "mas-tests" and run.init["mode"] == "offline" and run.init["name"] == "test-team"
    assert run.init["tags"] == ["ci"] and run.init["config"]["credit"]["method"] == "dr_mas"
    assert [s for s, _ in run.logged] == [0, 1]
    assert {"reward/team", "agents/lead/reward", "policies/main/loss", "time/rollout"} <= set(run.logged[0][1])
    assert run.finished


def test_wandb_missing_is_a_clear_error_before_training(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    path = write(tmp_path, tiny_model_dir, {"project": "p"})
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "pip install wandb" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_without_wandb_config_wandb_is_never_imported(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    path = write(tmp_path, tiny_model_dir, None)
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 0
