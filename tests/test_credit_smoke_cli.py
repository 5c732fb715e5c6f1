"""Every registered credit method trains 3 steps through `mas train` on a tiny random model.

Random-weight models never solve the task, so the env's score is replaced (at class level,
before the CLI builds the team) by a reward such models do earn; everything else is the
shipped command-line path.  Each method gets a topology it fits.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from safetensors.torch import load_file
from team_helpers import team_config, varied_reward

from mas.cli import main
from mas.credit import credit_names
from mas.envs.math.synthetic import SyntheticMathEnv

CASES = {
    "grpo": ("debate", {}),
    "dr_grpo": ("debate", {}),
    "rloo": ("chain", {}),
    "dr_mas": ("orchestrator", {}),
    "sharp": ("chain", {"exclude": ["checker"]}),
    "c3": ("chain", {"fanout": [4, 2]}),
    "ccpo": ("chain", {}),
    # MrlX's scorer gives 0 to a main agent whose format is invalid, as a random model's always is
    "m_grpo": ("chain", {"main_agent": "lead", "main_reward": "linear", "sub_reward": "linear"}),
    "reinforce_pp": ("chain", {}),
    "magrpo": ("debate", {}),
    "critic": ("chain", {"critic": "judge", "outcome_weight": 0.5, "max_new_tokens": 8}),
    # the hybrid: the arithmetic verifier scores the lead's turns, the critic the others'
    "verified": ("chain", {"agents": ["lead"], "critic": "judge", "critic_max_new_tokens": 8}),
}

# what each method's stored episodes must show in the report's method details (per turn)
DETAILS = {
    "grpo": {"norm_mean"}, "dr_grpo": {"norm_mean"}, "rloo": {"norm_mean"}, "dr_mas": {"baseline_mean", "baseline_std"},
    "sharp": {"marginal", "broadcast", "tool"}, "c3": {"node_value", "sibling_baseline"}, "ccpo": {"turn_reward", "upstream"},
    "m_grpo": {"is_main", "item_advantage"}, "reinforce_pp": {"return", "baseline"}, "magrpo": {"norm_mean"},
    "critic": {"critic_score", "critic_reply"}, "verified": {"turn_reward", "verifier_score", "process_score"},
}

# methods with extra evaluations: the timer their wall time is counted under (the others stay 0)
TIMERS = {"sharp": "credit_interventions", "ccpo": "credit_interventions", "c3": "credit_replays", "critic": "credit_critic",
          "verified": "credit_critic"}


def test_every_registered_method_has_a_smoke_case():
    assert sorted(CASES) == credit_names()


@pytest.mark.parametrize("method", sorted(CASES))
def test_three_steps_through_mas_train(method, tiny_model_dir, tmp_path, monkeypatch):
    topology, extra = CASES[method]
    cfg = team_config(tiny_model_dir, topology, credit={"method": method, **extra})
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(SyntheticMathEnv, "score", lambda self, ep: varied_reward(ep))
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(math.isfinite(r["policies"]["main"]["loss"]) for r in rows)
    trained = load_file(tmp_path / "run" / "checkpoints" / "step_000002" / "policies" / "main" / "model.safetensors")
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert any(not torch.equal(initial[k], trained[k]) for k in trained)  # the trainable policy moved
    for timer in ("credit_replays", "credit_interventions", "credit_critic"):
        assert all((r["time"][timer] > 0) == (TIMERS.get(method) == timer) for r in rows), timer
    assert all(r["time"]["credit"] >= r["time"]["credit_assign"] + r["time"].get(TIMERS.get(method), 0.0) for r in rows)
    # the stored episodes carry the method's breakdown, and the report shows it
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert DETAILS[method] <= set(episodes[0]["turns"][0]["details"])
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "method details for this turn" in (tmp_path / "run" / "report.html").read_text()
