"""Team configs for engine, topology and training tests (imported by test modules)."""

from __future__ import annotations

# ------------------------------------------------------------------------------------------
# team configs for engine, topology and training tests
# ------------------------------------------------------------------------------------------

TOPOLOGIES = {
    "orchestrator": {"kind": "orchestrator", "orchestrator": "lead", "specialists": ["helper", "checker"], "max_turns": 4},
    "debate": {"kind": "debate", "debaters": ["lead", "helper", "checker"], "rounds": 2},
    "chain": {"kind": "chain", "sequence": ["lead", "helper", "checker"], "loop_to": "lead", "max_loops": 1},
    "graph": {
        "kind": "graph",
        "entry": "draft",
        "max_turns": 5,
        "nodes": [{"name": "draft", "agent": "lead"}, {"name": "check", "agent": "checker"}, {"name": "fix", "agent": "helper"}],
        "edges": [
            {"from": "draft", "to": "check"},
            {"from": "check", "to": "END", "when": "accept"},
            {"from": "check", "to": "fix"},
            {"from": "fix", "to": "check"},
        ],
    },
}


def team_config(model_dir, topology: str = "chain", frozen_checker: bool = True, **sections) -> dict:
    """A 3-agent team on tiny models: lead and helper train, checker is frozen (or trains)."""
    cfg = {
        "team": {"name": "test-team"},
        "policies": {
            "main": {"kind": "full", "model": str(model_dir), "device": "cpu", "optim": {"lr": 1e-2, "micro_batch_size": 4}},
            "judge": {"kind": "frozen" if frozen_checker else "full", "model": str(model_dir), "device": "cpu"},
        },
        "agents": [
            {"name": "lead", "policy": "main", "role": "You are the lead.", "parser": "orchestrator", "sampling": {"max_new_tokens": 6}},
            {"name": "helper", "policy": "main", "role": "You help.", "parser": "answer", "sampling": {"max_new_tokens": 6}},
            {"name": "checker", "policy": "judge", "role": "You check.", "parser": "verdict", "sampling": {"max_new_tokens": 6}},
        ],
        "topology": TOPOLOGIES[topology],
        "env": {"name": "synthetic_math", "num_ops": 1, "seed": 0},
        "credit": {"method": "dr_mas"},
        "trainer": {"steps": 3, "batch_size": 2, "group_size": 4, "eval_size": 0, "sample_episodes": 1},
        "logging": {"progress": False},
    }
    cfg.update(sections)
    return cfg


def varied_reward(episode) -> float:
    """A reward random tiny models can earn: parity of the first token of the first turn.

    Random-weight models never solve the task, so outcome rewards would all be 0 and every
    advantage 0; this keeps the credit and update paths exercised with real variance.
    """
    turns = [t for t in episode.turns if t.completion_ids]
    return float(turns[0].completion_ids[0] % 2) if turns else 0.0


def dyad_config(model_dir, credit: dict, first=("reasoner", "You give a hint."), second=("actor", "You answer."),
                **trainer) -> dict:
    """A two-agent chain (upstream -> downstream), each agent on its own trainable policy."""
    policy = {"kind": "full", "model": str(model_dir), "device": "cpu", "optim": {"lr": 1e-2, "micro_batch_size": 4}}
    (up, up_role), (down, down_role) = first, second
    cfg = team_config(model_dir, "chain", credit=credit)
    cfg["policies"] = {"think": dict(policy), "solve": dict(policy)}
    cfg["agents"] = [
        {"name": up, "policy": "think", "role": up_role, "parser": "raw", "sampling": {"max_new_tokens": 6}},
        {"name": down, "policy": "solve", "role": down_role, "parser": "answer", "sampling": {"max_new_tokens": 6}},
    ]
    cfg["topology"] = {"kind": "chain", "sequence": [up, down]}
    cfg["trainer"] = {**cfg["trainer"], "group_size": 2, **trainer}
    return cfg


def train_smoke(tmp_path, cfg: dict):
    """Validate ``cfg`` through the CLI, train it 3 steps with ``varied_reward`` and check the run:
    steps 0..2 logged, the 'main' policy's loss finite with samples, every 'main' tensor moved."""
    import json
    import math

    import torch
    import yaml

    from mas.cli import main
    from mas.config.schema import load_config
    from mas.training.team import build_team
    from mas.training.trainer import train

    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 0
    team = build_team(load_config(path))
    team.engine.score = varied_reward
    model = team.policies["main"].model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert math.isfinite(r["policies"]["main"]["loss"]) and r["policies"]["main"]["samples"] > 0
    assert all(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    return team, rows


def line_graph(state: type, **nodes):
    """A LangGraph ``StateGraph`` of ``nodes`` (name -> function) run one after another, START to END."""
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(state)
    names = list(nodes)
    for name, fn in nodes.items():
        g.add_node(name, fn)
    for a, b in zip([START, *names], [*names, END]):
        g.add_edge(a, b)
    return g
