"""Research teams train end to end on tiny models with real BM25 tools over the shipped sample.

The shipped HotpotQA configs run as shipped except for the model (a tiny local one, warm-started
for a few seconds to write tool calls: ``research_helpers``), the data source (the shipped
sample instead of `datasets`), sizes, and the reward: a tiny model never answers a HotpotQA
question, so F1 would be 0 everywhere and every advantage 0; the env's score is replaced (at
class level, before the CLI builds the team) by a reward that varies with the episode.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from research_helpers import warm_research_model
from safetensors.torch import load_file

from mas.cli import main
from mas.config.schema import apply_overrides, load_config, validate_config
from mas.envs.research import HotpotQAEnv
from mas.training.team import build_team
from mas.training.trainer import train_step

CONFIGS = Path(__file__).parents[1] / "configs"
MGRPO = CONFIGS / "hotpotqa_orchestrator_mgrpo.yaml"
DRMAS = CONFIGS / "hotpotqa_search_orchestra_drmas.yaml"


def varied(self, episode) -> float:
    """Varies with the episode (its number of turns), so groups have reward variance."""
    return float(len(episode.turns) % 2)


def tiny_overrides(data: dict, model_dir, steps: int = 3) -> list[str]:
    out = ["env.source=sample", "env.max_train=null", "env.max_eval=null", "trainer.batch_size=2", "trainer.group_size=2",
           f"trainer.steps={steps}", "trainer.eval_size=0", "trainer.sample_episodes=4", "logging.episodes_every=1",
           "logging.progress=false", "runtime.episode_timeout_s=null"]
    for name in data["policies"]:
        out += [f"policies.{name}.model={model_dir}", f"policies.{name}.device=cpu", f"policies.{name}.dtype=float32"]
    for agent in data["agents"]:
        out.append(f"agents.{agent['name']}.sampling.max_new_tokens=32")
    return out


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory) -> Path:
    cfg = load_config(MGRPO, ["env.source=sample", "env.max_train=null", "env.max_eval=null"])
    return warm_research_model(cfg, tmp_path_factory.mktemp("warm-research"))


@pytest.fixture(scope="module")
def warm_graph_dir(tmp_path_factory) -> Path:
    """Warm-started on the Dr. MAS search orchestra's own roles: its verifier REJECTs (so the graph
    reaches the searcher) or ACCEPTs, its searcher writes calls.  The M-GRPO model above never
    learnt the verdict role, so with it the verifier never REJECTs and the searcher never acts."""
    cfg = load_config(DRMAS, ["env.source=sample", "env.max_train=null", "env.max_eval=null"])
    return warm_research_model(cfg, tmp_path_factory.mktemp("warm-graph"), call_tokens=True)


def test_research_team_trains_three_steps_through_mas_train(warm_dir, tmp_path, monkeypatch):
    data = yaml.safe_load(MGRPO.read_text())
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    run = tmp_path / "run"
    # 3 steps x 4 tasks x 3 episodes: the warm model writes a valid call in about one researcher
    # turn in ten, so the run records valid and malformed calls without relying on a lucky seed
    more = ["trainer.batch_size=4", "trainer.group_size=3", "trainer.sample_episodes=12"]
    assert main(["train", str(MGRPO), *tiny_overrides(data, warm_dir), *more, "--run-dir", str(run)]) == 0

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        for name, stats in r["policies"].items():
            assert math.isfinite(stats["loss"]), (name, stats)
    calls = {a: sum(r["agents"].get(a, {}).get("tool_calls", 0) for r in rows) for a in ("bridge_researcher", "fact_researcher")}
    assert sum(calls.values()) > 0

    # every adapter that got a gradient moved: peft initialises lora_B to zero, training makes it
    # non-zero.  (A policy can have samples and no gradient: M-GRPO gives a turn 0 when its segment
    # is a single turn or has one reward, which tiny groups often are.)
    ckpt = run / "checkpoints" / "step_000002" / "policies"
    trained = {name for r in rows for name, s in r["policies"].items() if s["samples"] > 0 and s["grad_norm"] > 0}
    assert {"planner", "researcher"} <= trained
    for name in trained:
        weights = load_file(ckpt / name / "adapter_model.safetensors")
        lora_b = [v for k, v in weights.items() if "lora_B" in k]
        assert lora_b and any(bool(v.abs().sum() > 0) for v in lora_b), name

    # tool calls are recorded with their observations, valid and malformed alike
    turns = [t for line in (run / "episodes.jsonl").read_text().splitlines() for t in json.loads(line)["turns"] if t["tool_calls"]]
    assert turns
    for t in turns:
        assert len(t["tool_calls"]) == len(t["observations"]) and "tool_valid" in t["extra_rewards"]
    records = [(c, o) for t in turns for c, o in zip(t["tool_calls"], t["observations"])]
    good = [(c, o) for c, o in records if c["valid"]]
    bad = [(c, o) for c, o in records if not c["valid"]]
    assert good and bad
    for c, o in good:
        assert o.startswith('search("') or o.split(":")[0] == c["arguments"]["title"], o
    for c, o in bad:
        assert c["error"] and (o.startswith("error: ") or o.startswith("not run: ")) and c["error"] in o


@pytest.mark.parametrize("name,model", [
    ("hotpotqa_orchestrator_sharp", "warm_dir"),
    ("hotpotqa_search_orchestra_drmas", "warm_graph_dir"),  # the model that knows the verifier's role
])
def test_shipped_research_config_runs_a_training_step(name, model, request, monkeypatch):
    """Generic checks; the search orchestra's tool path is checked in the test below."""
    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    # SHARP, 4 episodes per task: an episode in which the orchestrator alone speaks has no
    # coalition to re-run, and the warm model delegates in about one orchestrator turn in five
    more = ["trainer.group_size=4"] if name == "hotpotqa_orchestrator_sharp" else []
    cfg = validate_config(apply_overrides(data, tiny_overrides(data, request.getfixturevalue(model), steps=1) + more))
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    team = build_team(cfg)
    result = train_step(team, 0)
    episodes = cfg.trainer.batch_size * cfg.trainer.group_size
    assert result.metrics["episodes"]["count"] == episodes and result.metrics["episodes"]["errors"] == 0
    assert set(team.learners) == set(cfg.policies)
    for stats in result.metrics["policies"].values():
        assert math.isfinite(stats["loss"])
    if cfg.credit.method == "sharp":  # coalitions were re-run through the engine (tool turns replayed)
        assert result.metrics["credit_cost"]["interventions"] > 0
    tool_turns = [t for g in result.groups for ep in g.episodes for t in ep.turns if t.tool_calls]
    assert all(len(t.observations) == len(t.tool_calls) for t in tool_turns)


def test_search_orchestra_searcher_calls_tools_and_trains(warm_graph_dir, monkeypatch):
    """The Dr. MAS graph verify -> [reject: search -> verify | accept: answer] end to end: the
    verifier REJECTs, the searcher takes turns with valid and malformed calls whose observations
    are recorded, the graph routes back to the verifier, and the searcher's adapter is trained.
    (With a model that never REJECTs the searcher gets no turn and every tool check is vacuous,
    so the counts are asserted first.)"""
    data = yaml.safe_load(DRMAS.read_text())
    cfg = validate_config(apply_overrides(data, tiny_overrides(data, warm_graph_dir, steps=1) + ["trainer.group_size=4"]))
    monkeypatch.setattr(HotpotQAEnv, "score", varied)
    team = build_team(cfg)
    before = [p.detach().clone() for p in team.policies["searcher"].trainable_parameters()]
    assert before
    result = train_step(team, 0)
    episodes = [ep for g in result.groups for ep in g.episodes]
    assert len(episodes) == 8 and all(ep.status == "ok" for ep in episodes)

    searcher = [t for ep in episodes for t in ep.turns if t.agent == "searcher"]
    calls = [c for t in searcher for c in t.tool_calls]
    assert len(searcher) > 0 and len(calls) > 0, "the searcher never acted: the verifier did not REJECT"
    assert result.metrics["agents"]["searcher"]["tool_calls"] > 0
    assert any(c["valid"] for c in calls) and any(not c["valid"] for c in calls)
    for t in searcher:
        assert len(t.observations) == len(t.tool_calls)
        assert ("tool_valid" in t.extra_rewards) == bool(t.tool_calls)
        for c, o in zip(t.tool_calls, t.observations):
            if c["valid"]:
                assert o.startswith('search("') or o.split(":")[0] == c["arguments"]["title"], o
            else:
                assert c["error"] and c["error"] in o and (o.startswith("error: ") or o.startswith("not run: ")), o

    # the graph's routing: every search visit follows a REJECT; after a search the verifier decides again
    for ep in episodes:
        assert ep.turns[0].agent == "verifier"
        visits = [t for t in ep.turns if t.agent != "searcher" or t.parsed.get("label") != "tool"]  # one per node visit
        for prev, nxt in zip(visits, visits[1:]):
            if nxt.agent == "searcher":
                assert prev.agent == "verifier" and prev.parsed.get("label") == "reject"
            if prev.agent == "searcher":
                assert nxt.agent == "verifier"
    assert any(t.parsed.get("label") == "reject" for ep in episodes for t in ep.turns if t.agent == "verifier")

    # the searcher's turns are trained: samples, a finite loss, its LoRA weights moved
    stats = result.metrics["policies"]["searcher"]
    assert stats["samples"] == sum(bool(t.completion_ids) for t in searcher) > 0 and math.isfinite(stats["loss"])
    after = team.policies["searcher"].trainable_parameters()
    assert any(not torch.equal(b, a.detach()) for b, a in zip(before, after))


def test_research_eval_reports_em_f1_and_tool_calls_per_agent(warm_dir, tmp_path, capsys):
    data = yaml.safe_load(MGRPO.read_text())
    overrides = tiny_overrides(data, warm_dir)
    assert main(["eval", str(MGRPO), *overrides, "--size", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 4
    assert set(out) >= {"accuracy", "em", "f1", "tool_calls"}
    assert out["accuracy"] == pytest.approx(out["f1"])  # reward: f1
    assert 0.0 <= out["em"] <= out["f1"] <= 1.0
    # every agent with tools is reported, whether or not it made a call; others are not
    assert set(out["tool_calls"]) == {"bridge_researcher", "fact_researcher"}
    assert all(v >= 0 for v in out["tool_calls"].values())
