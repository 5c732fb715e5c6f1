"""Heterogeneous teams: agents on different base models (tokenizers, sizes), one of them frozen.

The shipped configs/hotpotqa_heterogeneous.yaml runs with its two hub models replaced by two tiny
local ones that differ in tokenizer (vocabulary, chat template) and size: model A (warm-started
to delegate and call tools, ``research_helpers``) for the Qwen policies, model B for the SmolLM
one.  Checked: messages cross between models as text and are re-tokenised by the receiving
policy; each policy keeps its own learning rate, micro-batch size and device; only trainable
policies change.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from research_helpers import warm_research_model

from mas.agents.prompts import render_prompt
from mas.config.schema import apply_overrides, validate_config
from mas.envs.research import HotpotQAEnv
from mas.training.team import build_team
from mas.models.tiny import tiny_causal_lm, train_tokenizer
from mas.training.trainer import train, train_step

CONFIG = Path(__file__).parents[1] / "configs" / "hotpotqa_heterogeneous.yaml"
SETTINGS = {"planner": (1e-2, 2), "scout": (3e-3, 3)}  # policy -> (lr, micro_batch_size), deliberately different


def varied(self, episode) -> float:
    return float(len(episode.turns) % 2)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """(A, B): A warm-started for this team's roles (chat template); B another tokenizer and size (plain format)."""
    data = yaml.safe_load(CONFIG.read_text())
    cfg = validate_config(apply_overrides(data, ["env.source=sample", "env.max_train=null", "env.max_eval=null"]))
    a = warm_research_model(cfg, tmp_path_factory.mktemp("model-a"))
    tok_b = train_tokenizer(["Search the paragraph. Read the title. The facts are these: Paris, France, 1945 film."] * 10
                            + [a.role for a in cfg.agents], vocab_size=360, chat_template=False)
    b = tmp_path_factory.mktemp("model-b")
    tiny_causal_lm(tok_b, hidden_size=32, num_layers=1, num_heads=2, max_positions=2048, seed=3).save_pretrained(b)
    tok_b.save_pretrained(b)
    return a, b


def hetero_config(model_dirs, **extra: str):
    a, b = model_dirs
    data = yaml.safe_load(CONFIG.read_text())
    overrides = ["env.source=sample", "env.max_train=null", "env.max_eval=null", "trainer.batch_size=2", "trainer.group_size=2",
                 "trainer.steps=3", "trainer.eval_size=0", "logging.progress=false", "policies.scout.optim.warmup_steps=0"]
    for name, model in (("planner", a), ("oracle", a), ("scout", b)):
        overrides += [f"policies.{name}.model={model}", f"policies.{name}.device=cpu", f"policies.{name}.dtype=float32"]
    for name, (lr, mbs) in SETTINGS.items():
        overrides += [f"policies.{name}.optim.lr={lr}", f"policies.{name}.optim.micro_batch_size={mbs}",
                      f"policies.{name}.optim.packing=false"]  # one row per turn: micro_batch_size rows per pass
    overrides += [f"agents.{ag['name']}.sampling.max_new_tokens=32" for ag in data["agents"]]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    return validate_config(apply_overrides(data, overrides))


def test_the_two_models_really_differ(model_dirs):
    team = build_team(hetero_config(model_dirs))
    tok_a, tok_b = team.policies["planner"].tokenizer, team.policies["scout"].tokenizer
    assert len(tok_a) != len(tok_b) and tok_a.get_vocab() != tok_b.get_vocab()
    assert bool(tok_a.chat_template) and not tok_b.chat_template
    size = lambda name: sum(p.numel() for p in team.policies[name].model.parameters())
    assert size("scout") < size("oracle")


def test_messages_pass_as_text_and_are_retokenised_by_the_receiving_policy(model_dirs, monkeypatch):
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    team = build_team(hetero_config(model_dirs))
    groups = team.engine.rollout(team.env.sample_tasks(4), 2, seed=0)
    episodes = [ep for g in groups for ep in g.episodes]
    crossed = 0
    for ep in episodes:
        assert ep.status != "error", ep.error
        by_index = {t.index: t for t in ep.turns}
        for t in ep.turns:
            tok = team.policies[t.policy].tokenizer
            assert t.prompt_ids == render_prompt(tok, t.messages)  # rendered and encoded by its own policy
            assert max(t.prompt_ids + t.completion_ids) < len(tok)
            parent = by_index.get(t.parent)
            if t.agent == "researcher" and parent is not None and parent.agent == "orchestrator" and t.messages[-1]["role"] == "user":
                # the orchestrator's subtask (decoded from model A's tokens) reaches model B as text
                subtask = parent.parsed["subtask"]
                assert t.messages[-1]["content"] == subtask
                ids_a = team.policies["planner"].tokenizer.encode(subtask, add_special_tokens=False)
                ids_b = tok.encode(subtask, add_special_tokens=False)
                assert ids_a != ids_b and tok.decode(ids_b) == subtask
                crossed += 1
        for t in ep.turns:  # the researcher's reply comes back to the orchestrator as text too
            if t.agent == "orchestrator" and t.messages[-1]["content"].startswith("researcher: "):
                crossed += 1
    assert crossed >= 2


def test_each_policy_keeps_its_own_lr_micro_batch_and_device(model_dirs, monkeypatch):
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    team = build_team(hetero_config(model_dirs, **{"trainer.batch_size": "4", "trainer.group_size": "4"}))
    assert set(team.learners) == {"planner", "scout"}  # the frozen oracle has none
    seen: dict[str, list[tuple[int, str]]] = {name: [] for name in team.learners}
    for name, learner in team.learners.items():
        assert learner.micro_batch_size == SETTINGS[name][1]
        assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(SETTINGS[name][0])
        original = learner._accumulate

        def spy(batch, abort=None, _name=name, _orig=original):
            seen[_name] += [(int(g.input_ids.shape[0]), str(g.input_ids.device)) for g in batch.passes]
            return _orig(batch, abort)

        monkeypatch.setattr(learner, "_accumulate", spy)
    for name, handle in team.policies.items():
        assert handle.device == torch.device("cpu")
        assert all(p.device == handle.device for p in handle.model.parameters())
    metrics = train_step(team, 0).metrics
    for name, (lr, mbs) in SETTINGS.items():
        n = int(metrics["policies"][name]["samples"])
        assert metrics["policies"][name]["lr"] == pytest.approx(lr)
        assert n > mbs  # enough turns for more than one micro-batch
        sizes = [s for s, _ in seen[name]]
        assert sizes == [min(mbs, n - i) for i in range(0, n, mbs)]  # ceil(n / mbs) micro-batches, in order
        assert {d for _, d in seen[name]} == {"cpu"}


def test_heterogeneous_team_trains_three_steps_and_only_trainable_policies_change(model_dirs, tmp_path, monkeypatch):
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    # groups of 4: Dr. MAS gives a turn 0 when its (group, agent) segment is one turn or one reward,
    # and the scout speaks in only some episodes; 4 per group give it segments that vary
    team = build_team(hetero_config(model_dirs, **{"trainer.group_size": "4"}))
    snapshot = {name: {k: v.detach().clone() for k, v in h.model.state_dict().items()} for name, h in team.policies.items()}
    train(team, tmp_path / "run")
    rows = [r for r in map(__import__("json").loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "step" in r]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert set(r["policies"]) == {"planner", "scout"}
        assert all(math.isfinite(s["loss"]) for s in r["policies"].values())
    assert sum(r["policies"]["scout"]["samples"] for r in rows) > 0 and sum(r["policies"]["planner"]["samples"] for r in rows) > 0

    def changed(name: str) -> dict[str, bool]:
        now = team.policies[name].model.state_dict()
        return {k: not torch.equal(snapshot[name][k], now[k]) for k in now}

    assert all(changed("scout").values())  # full fine-tuning: every tensor of model B moved
    planner = changed("planner")
    assert any(v for k, v in planner.items() if "lora_" in k)  # the planner's adapter moved ...
    assert not any(v for k, v in planner.items() if "lora_" not in k)  # ... its base did not
    assert not any(changed("oracle").values())  # the frozen answerer never changes
    assert team.policies["oracle"].version == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_policies_live_and_train_on_their_own_devices(model_dirs, monkeypatch):
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    team = build_team(hetero_config(model_dirs, **{"policies.scout.device": "cuda:0"}))
    assert all(p.device.type == "cuda" for p in team.policies["scout"].model.parameters())
    assert all(p.device.type == "cpu" for p in team.policies["planner"].model.parameters())
    metrics = train_step(team, 0).metrics
    assert all(math.isfinite(s["loss"]) for s in metrics["policies"].values())
