"""Held-out evaluation results: accuracy, the env's named scores (EM/F1) and tool calls per agent."""

from __future__ import annotations

import json

import pytest
from team_helpers import team_config

from mas.cli import main
from mas.training.metrics import eval_metrics
from mas.types import Episode, Task, Turn


def turn(agent: str, calls: int = 0) -> Turn:
    return Turn(agent=agent, policy="p", index=0, parent=None, messages=[], prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                text="", tool_calls=[{"name": "search", "arguments": {}, "valid": True, "error": None}] * calls)


def episode(reward: float, scores: dict | None, turns: list[Turn], status: str = "ok") -> Episode:
    ep = Episode(task=Task("t", "q", "a"), group_id=0, sample_id=0, seed=0, turns=turns, reward=reward, status=status)
    if scores is not None:
        ep.info["scores"] = scores
    return ep


def test_research_results_average_em_f1_and_tool_calls_per_agent():
    eps = [
        episode(0.8, {"em": 0.0, "f1": 0.8}, [turn("lead"), turn("scout", 2), turn("scout", 1)]),
        episode(1.0, {"em": 1.0, "f1": 1.0}, [turn("lead"), turn("scout", 0)]),
        episode(0.0, None, [turn("lead")], status="error"),  # failed before scoring: counts 0
    ]
    out = eval_metrics(eps, tool_agents=["scout", "reader"])
    assert out["accuracy"] == pytest.approx(1.8 / 3)
    assert out["em"] == pytest.approx(1 / 3) and out["f1"] == pytest.approx(1.8 / 3)
    # scout: 3 + 0 + 0 calls over 3 episodes; reader has tools but never acted: listed with 0
    assert out["tool_calls"] == {"reader": 0.0, "scout": 1.0}
    assert out["errors"] == 1 and out["episodes"] == 3


def test_math_results_are_accuracy_only():
    out = eval_metrics([episode(1.0, None, [turn("a")]), episode(0.0, None, [turn("a")])])
    assert out == {"accuracy": 0.5, "episodes": 2, "errors": 0, "truncated": 0,
                   "agents": {"a": {"turns": 2, "parse_failures": 0}}}  # turns and parse failures per agent
    assert eval_metrics([])["accuracy"] == 0.0


def test_mas_eval_on_a_math_team_prints_accuracy(tiny_model_dir, tmp_path, capsys):
    import yaml

    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(team_config(tiny_model_dir, "chain")))
    assert main(["eval", str(path), "--size", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"accuracy", "decoding", "tasks", "sampled", "episodes", "errors", "truncated", "agents", "faults"}
    assert out["episodes"] == 3 and out["decoding"] == "greedy" and len(out["tasks"]) == 3
    assert out["accuracy"] == pytest.approx(sum(out["tasks"]) / 3)
    assert out["sampled"]["k"] == 4 and out["sampled"]["episodes"] == 12  # the team samples: avg@4 / pass@4 beside it
    assert set(out["agents"]) == {"lead", "helper", "checker"} and out["faults"]["agent_error"] == 0


def test_the_evaluation_is_greedy_first_with_sampled_avg_and_pass_at_k_beside_it(tiny_model_dir):
    from mas.config.schema import validate_config
    from mas.training.evaluation import evaluate
    from mas.training.team import build_team

    cfg = team_config(tiny_model_dir, "chain")
    cfg["trainer"] = {**cfg.get("trainer", {}), "eval_sampled_k": 3, "eval_train": True}
    team = build_team(validate_config(cfg))
    tasks = team.env.eval_tasks(4)

    def texts(**kw):
        return [[t.completion_ids for t in ep.turns] for ep in team.engine.evaluate(tasks, **kw)]

    greedy = texts(seed=0)
    assert texts(seed=1) == greedy  # greedy ignores the seed
    sampled = texts(seed=0, sample=True)
    assert texts(seed=0, sample=True) == sampled  # seeded: an evaluation repeats exactly
    assert sampled != greedy and texts(seed=1, sample=True) != sampled  # a random model at T=1 samples
    out = evaluate(team, 4, 0)
    assert out["decoding"] == "greedy" and out["episodes"] == 4  # the headline is the deployed, greedy team
    s = out["sampled"]
    assert s["k"] == 3 and s["episodes"] == 12 and 0.0 <= s["avg"] <= s["pass"] <= 1.0
    assert set(s["temperature"]) == {"lead", "helper", "checker"}
    assert set(out["train"]) == {"accuracy"}  # the training tasks, greedy: the gap under the deployed decoding
    assert evaluate(team, 4, 0)["sampled"] == s  # seeded: the same numbers again
    probe = team.train_probe
    assert len(probe) == 4 and probe == build_team(validate_config(cfg)).env.sample_tasks(4)  # the stream's first tasks


def test_a_team_that_does_not_sample_is_evaluated_greedily_only(tiny_model_dir):
    from mas.config.schema import validate_config
    from mas.training.evaluation import sampled_k, trains_by_sampling

    cfg = team_config(tiny_model_dir, "chain")
    assert trains_by_sampling(validate_config(cfg)) and sampled_k(validate_config(cfg)) == 4
    for a in cfg["agents"]:
        a["sampling"] = {**a.get("sampling", {}), "temperature": 0.0}
    assert not trains_by_sampling(validate_config(cfg)) and sampled_k(validate_config(cfg)) == 0
