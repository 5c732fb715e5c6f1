"""configs/smol_heterogeneous.yaml: two model families (a SmolLM2 LoRA orchestrator, embedded-model
specialists) and a frozen, competent specialist.  Over the warm-up and a training step the frozen
embedded subtractor's weights do not change and its turns are never trained, while the two
trainable policies move.  The SmolLM2 policy is swapped for a tiny local model (another family and
tokenizer than the embedded model's, as SmolLM2 is); the embedded policies are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from research_helpers import warm_research_model

from mas.config.schema import apply_overrides, validate_config
from mas.envs.math import SyntheticMathEnv
from mas.training.team import build_team
from mas.training.trainer import train

CONFIG = Path(__file__).parents[1] / "configs" / "smol_heterogeneous.yaml"


def varied(self, episode) -> float:
    """A reward that differs within every group (the real one is 0 for an untrained tiny orchestrator)."""
    return float(episode.sample_id % 2)


@pytest.fixture(scope="module")
def delegating_model(tmp_path_factory) -> Path:
    from mas.config.schema import load_config

    return warm_research_model(load_config(CONFIG), tmp_path_factory.mktemp("delegating"), steps=120)


def team_for(model_dir: Path):
    data = yaml.safe_load(CONFIG.read_text())
    overrides = [f"policies.planner.model={model_dir}", "policies.planner.device=cpu", "policies.planner.dtype=float32",
                 "trainer.steps=1", "trainer.batch_size=4", "trainer.group_size=4", "trainer.eval_size=0",
                 "trainer.warmup.steps=1", "trainer.warmup.episodes=4", "trainer.warmup.batch_size=2", "logging.progress=false"]
    return build_team(validate_config(apply_overrides(data, overrides), str(CONFIG)))


def test_the_team_mixes_two_model_families_and_freezes_the_competent_specialist(delegating_model):
    with team_for(delegating_model) as team:
        policies = team.cfg.policies
        assert {a.name: (a.policy, policies[a.policy].model, policies[a.policy].kind) for a in team.cfg.agents} == {
            "orchestrator": ("planner", str(delegating_model), "lora"), "adder": ("calculator", "embedded", "full"),
            "subtractor": ("fixed", "embedded", "frozen")}
        assert yaml.safe_load(CONFIG.read_text())["policies"]["planner"]["model"] == "smollm2-135m-instruct"
        toks = team.runtime.tokenizers
        assert toks["planner"].get_vocab() != toks["fixed"].get_vocab()  # two tokenizers
        assert set(team.learners) == {"planner", "calculator"}


def test_the_frozen_agents_weights_do_not_change_over_a_training_step(delegating_model, tmp_path, monkeypatch):
    monkeypatch.setattr(SyntheticMathEnv, "score", varied)
    with team_for(delegating_model) as team:
        before = {name: {k: v.detach().clone() for k, v in h.model.state_dict().items()} for name, h in team.policies.items()}
        train(team, tmp_path / "run")

        def changed(name: str) -> list[str]:
            now = team.policies[name].model.state_dict()
            return [k for k in now if not torch.equal(before[name][k], now[k])]

        assert changed("fixed") == [] and team.policies["fixed"].version == 0  # the frozen subtractor
        assert changed("calculator")  # the embedded adder trains (full fine-tuning) ...
        assert changed("planner") and all("lora_" in k for k in changed("planner"))  # ... and the orchestrator's adapter
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 0)
    assert set(step["policies"]) == {"planner", "calculator"}
    assert step["agents"]["subtractor"]["turns"] > 0  # the frozen agent spoke in the step: its weights had the chance to move
