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
