"""Helpers for the study and audit tests: the tiny team YAML they train, and a hand-written
study over team sizes (no training) for the scaling view."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import yaml

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # team_helpers
    sys.path.insert(0, _TESTS)

from team_helpers import team_config  # noqa: E402

from mas.study.runner import StudySpec, scaling_record  # noqa: E402

METHODS = ("grpo", "sharp")
SCALING_METHODS = ("grpo", "c3", "sharp")


def tiny_team_yaml(path, model_dir, **trainer) -> str:
    """A chain team (lead -> helper -> frozen checker) on the tiny random model, written as YAML."""
    cfg = team_config(model_dir, "chain")
    cfg["trainer"].update({"steps": 2, "batch_size": 2, "group_size": 2, "eval_size": 4, **trainer})
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def relay_team(n: int, model: str = "scripted", **trainer) -> dict:
    """A parts chain of n specialists on team_relay of size n."""
    policy = {"kind": "full", "model": model, "device": "cpu", "optim": {"lr": 1e-2, "micro_batch_size": 4}}
    return {
        "team": {"name": f"relay-{n}"},
        "policies": {f"s{k}": dict(policy) for k in range(1, n + 1)},
        "agents": [{"name": f"s{k}", "policy": f"s{k}", "role": "You solve your part. End with ANSWER: n.", "parser": "answer",
                    "sampling": {"max_new_tokens": 4}} for k in range(1, n + 1)],
        "topology": {"kind": "chain", "sequence": [f"s{k}" for k in range(1, n + 1)], "parts": True},
        "env": {"name": "team_relay", "size": n, "heldout_fraction": 0.5},
        "credit": {"method": "grpo"},
        "trainer": {"steps": 2, "batch_size": 1, "group_size": 2, "eval_size": 2, "sample_episodes": 1, **trainer},
        "logging": {"progress": False},
    }


# a hand-written study over team sizes: metrics.jsonl records as a run writes them


def step(s: int, n: int, credit_tokens: int, credit_s: float, reruns: int, signal: dict | None = None, coalitions: float = 0.0) -> dict:
    agents = {f"s{k}": ({"designed_signal": signal[f"s{k}"]} if signal else {}) for k in range(1, n + 1)}
    return {"step": s, "generated": {"rollout_tokens": 100, "credit_tokens": credit_tokens, "total": 100 + credit_tokens},
            "time": {"step": 1.0, "credit": credit_s}, "episodes": {"count": 4},
            "credit_cost": {"replays": reruns, "interventions": 0}, "credit": {"coalition_evals": coalitions}, "agents": agents}


def ev(name: str, value: float, s: int | None = None) -> dict:
    return {"eval": name, "accuracy": value, **({} if s is None else {"step": s})}


def rows(n: int, values: list[float], credit_tokens=0, credit_s=0.0, reruns=0, signal=None, coalitions=0.0) -> list[dict]:
    """before, steps 0..3, an evaluation after steps 1 and 3 (points at 0, 2 and 4 steps)."""
    out = [ev("before", values[0])]
    for s in range(4):
        out.append(step(s, n, credit_tokens, credit_s, reruns, signal if s == 0 else None, coalitions))
        if s % 2 == 1:
            out.append(ev("periodic", values[(s + 1) // 2], s))
    return out


def write_size(root: Path, n: int, runs: dict[str, list[list[dict]]], skipped: dict[str, str], credit: dict | None = None) -> str:
    d = root / f"n{n}"
    spec = StudySpec(config=f"relay_n{n}.yaml", methods=tuple(runs) + tuple(skipped), seeds=2, out=str(d), budget=4.0)
    d.mkdir(parents=True)
    (d / "study_spec.json").write_text(json.dumps(asdict(spec)))
    (d / "not_applicable.json").write_text(json.dumps(skipped))
    for method, seeds in runs.items():
        for s, rs in enumerate(seeds):
            run = d / "runs" / method / f"seed_{s}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
            cfg = relay_team(n)
            cfg["credit"] = {"method": method, **((credit or {}) if method == "sharp" else {})}
            if method == "c3":
                cfg["credit"]["fanout"] = [2] * n
            (run / "config.yaml").write_text(yaml.safe_dump(cfg))
            (run / "study_run.json").write_text(json.dumps({"budget": {"kind": "steps", "limit": 4.0, "used": 4.0, "reached": True}}))
    return spec.config


def hand_scaling_study(root: Path) -> Path:
    """Sizes 2 and 4, grpo / c3 / sharp, 2 seeds each; ccpo does not apply at either size.

    N = 2: grpo ends at 0.6 and 0.4 (target 0.5): seed 0 reaches it after 4 steps, seed 1 never
    (counts 4, censored); c3 reaches it after 2 steps in both seeds.  N = 4: grpo ends at 0.2
    and 0.2 (target 0.2), both at 4 steps; c3 at 2 and 4 steps; sharp never (4, 4; censored)."""
    why = {"ccpo": "CCPO's counterfactual removes the upstream agent of a two-agent dyad"}
    sig2 = {"s1": 0.5, "s2": 0.3}
    c2 = write_size(root, 2, {
        "grpo": [rows(2, [0.1, 0.3, 0.6], signal=sig2), rows(2, [0.1, 0.2, 0.4], signal={"s1": 0.3, "s2": None})],
        "c3": [rows(2, [0.1, 0.5, 0.7], 50, 0.5, 1, signal={"s1": 0.9, "s2": 0.8}), rows(2, [0.1, 0.6, 0.6], 50, 0.5, 1, signal={"s1": 0.7, "s2": 0.8})],
        "sharp": [rows(2, [0.1, 0.3, 0.5], 0, 0.2, 3, coalitions=12.0), rows(2, [0.1, 0.3, 0.5], 0, 0.2, 3, coalitions=12.0)],
    }, why, credit={"exclude": []})
    c4 = write_size(root, 4, {
        "grpo": [rows(4, [0.0, 0.1, 0.2]), rows(4, [0.0, 0.0, 0.2])],
        "c3": [rows(4, [0.0, 0.2, 0.3], 300, 2.0, 3), rows(4, [0.0, 0.1, 0.2], 300, 2.0, 3)],
        "sharp": [rows(4, [0.0, 0.1, 0.1], 0, 1.5, 15, coalitions=60.0), rows(4, [0.0, 0.0, 0.1], 0, 1.5, 15, coalitions=60.0)],
    }, why, credit={"exclude": []})
    spec = StudySpec(config=c2, methods=SCALING_METHODS + ("ccpo",), seeds=2, out=str(root), budget=4.0)
    sizes = [(2, StudySpec(**{**asdict(spec), "config": c2, "out": str(root / "n2")})),
             (4, StudySpec(**{**asdict(spec), "config": c4, "out": str(root / "n4")}))]
    (root / "scaling_spec.json").write_text(json.dumps(scaling_record(spec, sizes)))
    return root
