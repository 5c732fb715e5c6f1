"""Each shipped GSM8K config trains a step with every credit method that suits its topology.

As in test_shipped_configs_train: the hub model is swapped for a tiny local one, the data for the
shipped sample, and the reward for one a random-weight model earns (``varied_reward``); the
policies, agents, parsers and topology run as shipped.  Which methods suit which team:

    orchestrator  (orchestrator + calculator + checker)  dr_mas, grpo, m_grpo (main: the
                  orchestrator), sharp (players: the specialists; the orchestrator re-answers)
    debate        (3 debaters, majority vote)             grpo, magrpo, dr_mas, sharp (no
                  synthesiser: the vote is re-read from the kept transcript)
    chain         (solver -> verifier, loop on REJECT)    dr_mas, c3 (replay tree per decision),
                  ccpo (solver removed counterfactual), sharp
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

CONFIGS = Path(__file__).parents[1] / "configs"
CASES = [
    ("gsm8k_orchestrator", {"method": "dr_mas"}),
    ("gsm8k_orchestrator", {"method": "grpo"}),
    ("gsm8k_orchestrator", {"method": "m_grpo", "main_agent": "orchestrator", "main_reward": "linear", "sub_reward": "linear"}),
    ("gsm8k_orchestrator", {"method": "sharp", "exclude": ["orchestrator"], "marginal": "exact"}),
    ("gsm8k_debate", {"method": "grpo"}),
    ("gsm8k_debate", {"method": "magrpo"}),
    ("gsm8k_debate", {"method": "dr_mas"}),
    ("gsm8k_debate", {"method": "sharp", "exclude": [], "marginal": "loo"}),
    ("gsm8k_chain", {"method": "dr_mas"}),
    ("gsm8k_chain", {"method": "c3", "fanout": [2, 2]}),
    ("gsm8k_chain", {"method": "ccpo", "upstream": "solver"}),
    ("gsm8k_chain", {"method": "sharp", "exclude": ["verifier"]}),
]


@pytest.mark.parametrize("name,credit", CASES, ids=[f"{n}-{c['method']}" for n, c in CASES])
def test_gsm8k_config_trains_with_a_suitable_credit_method(name, credit, tiny_model_dir):
    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    data["credit"] = credit
    overrides = ["env.source=sample", "trainer.batch_size=1", "trainer.group_size=2", "trainer.eval_size=0"]
    for policy in data["policies"]:
        overrides += [f"policies.{policy}.model={tiny_model_dir}", f"policies.{policy}.device=cpu", f"policies.{policy}.dtype=float32"]
    overrides += [f"agents.{a['name']}.sampling.max_new_tokens=4" for a in data["agents"]]
    cfg = validate_config(apply_overrides(data, overrides))
    team = build_team(cfg)
    team.engine.score = varied_reward
    result = train_step(team, 0)
    assert result.metrics["episodes"]["count"] == 2
    assert set(result.metrics["policies"]) == set(team.learners)
    for stats in result.metrics["policies"].values():
        assert math.isfinite(stats["loss"])
    assert result.credit.advantages.isfinite().all()
    acted = {t.agent for g in result.groups for ep in g.episodes for t in ep.turns}
    players = acted - set(credit.get("exclude", ()))  # SHARP plans nothing for an episode without players
    if credit["method"] in ("c3", "ccpo") or (credit["method"] == "sharp" and players):
        cost = result.metrics["credit_cost"]  # their extra evaluations ran through the engine
        assert cost["interventions"] + cost["replays"] > 0
