"""Every shipped config trains a step when its real model is swapped for a tiny local one.

The GSM8K configs name Qwen/Qwen2.5-0.5B-Instruct and load data through `datasets`, neither of
which is reachable offline; everything else about them (policies, LoRA sharing, agents,
parsers, topology, credit, trainer settings) runs as shipped.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from team_helpers import varied_reward

from mas.config.schema import apply_overrides, validate_config
from mas.training.team import build_team
from mas.training.trainer import train_step

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("gsm8k_*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_gsm8k_config_runs_a_training_step(path, tiny_model_dir):
    data = yaml.safe_load(path.read_text())
    overrides = ["env.source=sample", "trainer.batch_size=1", "trainer.group_size=2", "trainer.eval_size=0"]
    for name in data["policies"]:
        overrides += [f"policies.{name}.model={tiny_model_dir}", f"policies.{name}.device=cpu",
                      f"policies.{name}.dtype=float32"]
    for agent in data["agents"]:
        overrides.append(f"agents.{agent['name']}.sampling.max_new_tokens=4")
    cfg = validate_config(apply_overrides(data, overrides))
    team = build_team(cfg)
    team.engine.score = varied_reward
    metrics = train_step(team, 0).metrics
    assert metrics["episodes"]["count"] == 2
    assert set(team.learners) == {n for n, p in cfg.policies.items() if p.kind != "frozen"}
    for stats in metrics["policies"].values():
        assert math.isfinite(stats["loss"])
