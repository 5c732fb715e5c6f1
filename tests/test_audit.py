"""`mas audit`: Spearman and rank agreement by hand, exact Shapley ground truth through the real
engine (scripted AND game: each worker holds half of the answer), and the command on a short
training run of a tiny team (stored and fresh episodes, the cost bound, a bad checkpoint)."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from team_helpers import team_config

from mas.agents.agent import build_agents
from mas.audit import (
    agent_credit,
    audit_game,
    bootstrap_spearman,
    episode_from_record,
    fidelity,
    plan_audit,
    ranks,
    same_order,
    shapley_pairs,
    spearman,
    turn_limit,
)
from mas.rollout.backends.scripted import ScriptedBackend
from mas.cli import main
from mas.config.schema import validate_config
from mas.rollout.engine import Engine
from mas.rollout.script import MASK_TEXT
from mas.topologies import build_topology
from mas.types import Task

# --- statistics by hand ------------------------------------------------------------------------------


def test_ranks_average_ties():
    assert ranks(np.array([10.0, 30.0, 20.0, 30.0])).tolist() == [1.0, 3.5, 2.0, 3.5]


def test_spearman_by_hand():
    """x = [1, 2, 3, 4], y = [1, 3, 2, 4]: d = [0, 1, −1, 0], ρ = 1 − 6·Σd²/(n(n²−1)) = 1 − 12/60 = 0.8."""
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([5, 5, 5], [1, 2, 3]) is None  # constant credit: undefined, not 0
    assert spearman([1], [2]) is None
    # with ties: average ranks [1, 2.5, 2.5, 4] vs [1, 2, 3, 4] -> Pearson of ranks
    a, b = np.array([1, 2.5, 2.5, 4]) - 2.5, np.array([1, 2, 3, 4]) - 2.5
    assert spearman([0, 1, 1, 2], [0, 1, 2, 3]) == pytest.approx(float((a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum())))


def test_bootstrap_ci_resamples_episodes_and_is_seeded():
    rng = random.Random(0)
    a = [rng.random() for _ in range(40)]
    b = [x + rng.gauss(0, 0.2) for x in a]
    episodes = [i // 2 for i in range(40)]  # two pairs per episode
    lo, hi = bootstrap_spearman(a, b, episodes)
    rho = spearman(a, b)
    assert lo < rho < hi and hi - lo < 0.5
    assert bootstrap_spearman(a, b, episodes) == (lo, hi)
    assert bootstrap_spearman(a[:2], b[:2], [0, 0]) == (None, None)  # one episode: no resampling


def test_same_order_requires_matching_ties():
    assert same_order([0.2, 0.9, -1.0], [1.0, 3.0, 0.0])
    assert not same_order([0.2, 0.9], [3.0, 1.0])
    assert not same_order([0.5, 0.5], [1.0, 0.0])  # the credit ties what the audit separates
    assert same_order([0.5, 0.5], [0.25, 0.25])


def test_fidelity_per_agent_pooled_and_rank_agreement():
    pairs = []
    for e, (c1, c2, s1, s2) in enumerate([(1, 0, 0.5, 0.0), (0, 1, 0.0, 0.5), (1, 1, 0.5, 0.5), (0, 1, 0.5, 0.0)]):
        pairs += [{"episode": e, "agent": "w1", "credit": c1, "shapley": s1}, {"episode": e, "agent": "w2", "credit": c2, "shapley": s2}]
    f = fidelity(pairs)
    assert f.per_agent["w1"]["n"] == 4 and f.pooled["n"] == 8
    assert f.per_agent["w1"]["spearman"] == pytest.approx(spearman([1, 0, 1, 0], [0.5, 0, 0.5, 0.5]))
    # episodes 0, 1, 2 ordered as the audit; episode 3 reversed
    assert f.rank_agreement == {"episodes": 4, "agree": 3, "share": 0.75}


def test_agent_credit_is_the_mean_of_its_turns():
    ep = SimpleNamespace(turns=[SimpleNamespace(agent="a"), SimpleNamespace(agent="b"), SimpleNamespace(agent="a")])
    assert agent_credit(ep, [1.0, 5.0, 0.0]) == {"a": 0.5, "b": 5.0}


# --- exact Shapley through the real engine (scripted AND game) -----------------------------------------

WORKERS = ("worker1", "worker2")
TEAM = {
    "team": {"name": "audit-game"},
    "policies": {"workers": {"model": "scripted"}, "synth": {"model": "scripted"}},
    "agents": [
        {"name": "worker1", "policy": "workers", "role": "w1", "parser": "raw"},
        {"name": "worker2", "policy": "workers", "role": "w2", "parser": "raw"},
        {"name": "aggregator", "policy": "synth", "role": "agg", "parser": "answer"},
    ],
    "topology": {"kind": "chain", "sequence": ["worker1", "worker2", "aggregator"]},
    "env": {"name": "synthetic_math", "num_ops": 1},
    "credit": {"method": "grpo"},
}


def and_game_team(tokenizer, halves: dict[str, tuple[str, str]]):
    """Workers say their half of the answer ('?' when they fail); the aggregator answers the two
    visible halves joined, or 0 when one is masked or unknown: v(S) = 1 only for S = both, if both are right."""
    cfg = validate_config(TEAM)

    def respond(req):
        task_id = req.messages[-1]["content"].splitlines()[0].removeprefix("Task: ")
        if req.agent in WORKERS:
            return f"PART: {halves[task_id][WORKERS.index(req.agent)]}"
        seen = {}
        for line in req.messages[-1]["content"].splitlines():
            name, _, text = line.partition(": ")
            if name in WORKERS and text != MASK_TEXT:
                seen[name] = text.removeprefix("PART: ")
        parts = [seen.get(w, "?") for w in WORKERS]
        return f"ANSWER: {''.join(parts) if '?' not in parts else 0}"

    toks = {p: tokenizer for p in cfg.policies}
    engine = Engine(build_topology(cfg.topology), build_agents(cfg.agents, cfg.team.name), toks, dict.fromkeys(cfg.policies, True),
                    ScriptedBackend(respond, toks), score=lambda ep: float(ep.answer == ep.task.answer))
    return SimpleNamespace(cfg=cfg, engine=engine, agents=engine.agents), cfg


def test_shapley_ground_truth_on_the_and_game(tiny_tokenizer):
    """Episode 0: both halves right, R = 1: φ = (½, ½).  Episode 1: worker2 fails, R = 0: φ = (0, 0).
    The coalitions re-run through the real engine; the aggregator (who answers) is re-sampled."""
    halves = {"t0": ("1", "2"), "t1": ("3", "?")}
    team, cfg = and_game_team(tiny_tokenizer, halves)
    tasks = [Task("t0", "t0", "12"), Task("t1", "t1", "34")]
    groups = team.engine.rollout(tasks, 1, seed=0)
    assert [g.episodes[0].reward for g in groups] == [1.0, 0.0]
    episodes = [(g.episodes[0], [0.9, 0.1, 0.0]) for g in groups]  # a method's credit: worker1 gets more
    game = audit_game(cfg.credit, None, permutations=64, max_exact=8)
    plan = plan_audit(episodes, game, turn_limit(cfg), None)
    assert len(plan.requests) == 2 * 3  # 2^2 − 1 coalitions per episode
    pairs = shapley_pairs(team, plan, game, seed=1)
    got = {(p["episode"], p["agent"]): p["shapley"] for p in pairs}
    assert got == {(0, "worker1"): 0.5, (0, "worker2"): 0.5, (1, "worker1"): 0.0, (1, "worker2"): 0.0}
    assert {(p["episode"], p["agent"]): p["credit"] for p in pairs}[(0, "worker1")] == 0.9
    # the efficiency axiom holds per episode: Σφ = v(N) − v(∅) = R
    for e, R in enumerate([1.0, 0.0]):
        assert sum(v for (ee, _), v in got.items() if ee == e) == pytest.approx(R)


def test_max_generations_drops_whole_episodes(tiny_tokenizer):
    team, cfg = and_game_team(tiny_tokenizer, {"t0": ("1", "2"), "t1": ("3", "4")})
    groups = team.engine.rollout([Task("t0", "t0", "12"), Task("t1", "t1", "34")], 1, seed=0)
    episodes = [(g.episodes[0], [0.0] * 3) for g in groups]
    game = audit_game(cfg.credit, None, 64, 8)
    limit = turn_limit(cfg)
    assert limit == 3  # a 3-agent chain without loops
    plan = plan_audit(episodes, game, limit, max_generations=3 * limit + 1)  # one episode's 3 re-runs fit, not two
    assert len(plan.episodes) == 1 and plan.dropped == 1 and plan.bound == 9 and len(plan.requests) == 3
    assert plan.expected == 3  # each re-run re-samples only the aggregator


# --- the command on a short training run -------------------------------------------------------------


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tiny_model_dir):
    """2 training steps of a tiny chain team with credit sharp, every step's episodes stored."""
    root = tmp_path_factory.mktemp("audit")
    cfg = team_config(tiny_model_dir, "chain", credit={"method": "sharp", "marginal": "loo"})
    cfg["trainer"].update({"steps": 2, "batch_size": 2, "group_size": 2, "sample_episodes": 3, "eval_size": 0})
    cfg["logging"] = {"progress": False, "episodes_every": 1}
    (root / "team.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(root / "team.yaml"), "--run-dir", str(root / "run")]) == 0
    return root / "run"


def test_audit_a_short_run_prints_fidelity_and_its_ci(short_run, capsys):
    assert main(["audit", str(short_run), "--episodes", "6"]) == 0
    out = capsys.readouterr().out
    assert "audit cost:" in out and "coalition re-runs" in out
    assert out.index("audit cost:") < out.index("credit fidelity")  # the cost is printed before the results
    assert "pooled" in out and "95% CI" in out and "ranks the agents as the audit does" in out
    report = json.loads((short_run / "audit" / "step_000001.json").read_text())
    assert report["credit_method"] == "sharp" and report["source"] == "stored" and report["episodes"] == 6
    assert report["game"]["estimator"] == "exact Shapley" and report["cost"]["coalition_reruns"] > 0
    assert set(report["per_agent"]) <= {"lead", "helper"}  # the checker answers last: not a player
    assert report["pooled"]["n"] == len(report["pairs"]) > 0
    for p in report["pairs"]:
        assert math.isfinite(p["credit"]) and math.isfinite(p["shapley"])


def test_audit_fresh_episodes_and_an_explicit_checkpoint(short_run, capsys):
    assert main(["audit", str(short_run), "--fresh", "--episodes", "2", "--checkpoint", "1"]) == 0
    report = json.loads((short_run / "audit" / "step_000001.json").read_text())
    assert report["source"] == "fresh" and report["episodes"] == 2


def test_audit_errors_name_what_is_wrong(short_run, tmp_path, capsys):
    assert main(["audit", str(short_run), "--checkpoint", "7"]) == 2
    assert "no checkpoint for step 7" in capsys.readouterr().err
    assert main(["audit", str(short_run), "--max-generations", "1"]) == 2
    assert "--max-generations 1" in capsys.readouterr().err
    assert main(["audit", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_stored_records_rebuild_episodes(short_run):
    record = json.loads((short_run / "episodes.jsonl").read_text().splitlines()[0])
    ep, credits = episode_from_record(record)
    assert [t.text for t in ep.turns] == [t["text"] for t in record["turns"]]
    assert credits == [t["credit"] for t in record["turns"]] and ep.reward == record["reward"]
