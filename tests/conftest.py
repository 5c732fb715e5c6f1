"""Shared fixtures: tiny in-process tokenizer and models, Ray/temp isolation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mas.tiny import tiny_causal_lm, train_tokenizer

CORPUS = [
    "You are the orchestrator. Task: 3+4-2 CALL adder: 3+4 ANSWER: 5",
    "You are a solver. Solve the problem. ANSWER: 12 ACCEPT REJECT verifier reviser",
    "Question: how many eggs? The answer is 18. #### 18 debate round previous answers",
] * 20

torch.set_num_threads(1)  # tiny models: one thread is fastest and avoids oversubscription


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="session")
def tiny_plain_tokenizer():
    """Same tokenizer without a chat template: exercises the documented plain prompt format."""
    return train_tokenizer(CORPUS, vocab_size=300, chat_template=False)


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    return tiny_causal_lm(tiny_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny random model and its tokenizer saved in Hugging Face format (the local-path load route)."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_causal_lm(tiny_tokenizer, seed=0).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory, tiny_plain_tokenizer) -> Path:
    """A second tiny model of another size, with a tokenizer that has no chat template."""
    path = tmp_path_factory.mktemp("tiny-model-b")
    tiny_causal_lm(tiny_plain_tokenizer, hidden_size=48, num_layers=1, num_heads=2, seed=1).save_pretrained(path)
    tiny_plain_tokenizer.save_pretrained(path)
    return path


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
