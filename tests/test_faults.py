"""Faults injected into short training runs: each run goes on, and each fault is counted.

docs/architecture.md: a failed episode is kept, marked, scored 0 and counted; the step goes on.  Each test
trains a real tiny team for two steps with one kind of fault injected (an agent or topology
exception, a tool that raises, hangs, hoards memory or opens a socket, a reward that is NaN
or raises, a backend error on one batch) and checks the run's own records: every step is in
metrics.jsonl with a finite loss, ``faults`` counts what was injected, and warnings.jsonl
names it.  (A remote critic endpoint that fails is in tests/backends/test_openai_compat.py.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import threading

import pytest
from team_helpers import team_config, varied_reward

from mas.rollout.backends import RoutedBackend
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import validate_config
from mas.rollout.faults import FAULT_KINDS
from mas.training.team import build_team
from mas.training.trainer import train

STEPS = 2


def build(cfg: dict):
    team = build_team(validate_config(cfg))
    team.engine.score = varied_reward
    return team


def run(team, tmp_path) -> tuple[list[dict], list[dict]]:
    """Train; (metrics rows of the steps, warnings)."""
    summary = train(team, tmp_path / "run")
    assert "stopped" not in summary
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r]
    warnings_path = tmp_path / "run" / "warnings.jsonl"
    warnings = [json.loads(line) for line in warnings_path.read_text().splitlines()] if warnings_path.exists() else []
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r in rows:
        assert set(r["faults"]) == set(FAULT_KINDS)
        assert math.isfinite(r["policies"]["main"]["loss"])
    return rows, warnings


def total(rows: list[dict], kind: str) -> int:
    return sum(r["faults"][kind] for r in rows)


def small(model_dir, **trainer) -> dict:
    return team_config(model_dir, "chain", trainer={"steps": STEPS, "batch_size": 2, "group_size": 2, "eval_size": 0,
                                                    "sample_episodes": 1, **trainer})


# --- agents and topologies ------------------------------------------------------------------------


class FailingTopology:
    """The team's topology, except that the episodes ``fail(ctx)`` picks raise."""

    def __init__(self, inner, fail):
        self.inner, self.fail = inner, fail

    async def run(self, ctx):
        if self.fail(ctx):
            raise RuntimeError("injected topology failure")
        return await self.inner.run(ctx)


def test_a_topology_exception_fails_its_episodes_and_the_run_goes_on(tiny_model_dir, tmp_path):
    team = build(small(tiny_model_dir))
    team.engine.topology = FailingTopology(team.engine.topology, lambda ctx: ctx.episode.sample_id == 0)
    rows, warnings = run(team, tmp_path)
    for r in rows:  # one of the two episodes of each of the two tasks
        assert r["faults"]["agent_error"] == 2 and r["episodes"]["errors"] == 2
        assert r["policies"]["main"]["samples"] > 0  # the other episodes still train
    assert any(w["kind"] == "fault.agent_error" and "injected topology failure" in w["message"] for w in warnings)


def test_an_agent_exception_fails_its_episode_and_the_run_goes_on(tiny_model_dir, tmp_path):
    team = build(small(tiny_model_dir))
    helper = team.agents["helper"]
    calls = [0]

    def parse(text):
        calls[0] += 1
        if calls[0] % 3 == 1:
            raise ValueError("injected parser failure")
        return helper.parse(text)

    team.agents["helper"] = dataclasses.replace(helper, parse=parse)
    rows, _ = run(team, tmp_path)
    assert total(rows, "agent_error") >= 2 and total(rows, "agent_error") == sum(r["episodes"]["errors"] for r in rows)


# --- rewards ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["nan", "inf", "raises"])
def test_a_reward_that_is_not_a_number_or_raises_scores_zero_and_is_counted(tiny_model_dir, tmp_path, fault):
    team = build(small(tiny_model_dir))

    def score(ep):
        if ep.sample_id == 1:
            if fault == "raises":
                raise KeyError("injected reward failure")
            return float(fault)
        return varied_reward(ep)

    team.engine.score = score
    rows, warnings = run(team, tmp_path)
    for r in rows:
        assert r["faults"]["score_error"] == 2 and r["episodes"]["errors"] == 2
        assert math.isfinite(r["reward"]["team"])
    assert any(w["kind"] == "fault.score_error" for w in warnings)


# --- turn verifiers ----------------------------------------------------------------------------------


def by_parity(ep, turn) -> float:
    """A verifier the tiny models' turns can pass or fail: the parity of the turn's first token."""
    return float(turn.completion_ids[0] % 2) if turn.completion_ids else None


def scored_turns(tmp_path) -> list[dict]:
    rows = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    return [t for ep in rows for t in ep["turns"]]


def test_verifier_scores_reach_the_turns_metrics_and_the_verified_credit(tiny_model_dir, tmp_path):
    cfg = small(tiny_model_dir)
    cfg["credit"] = {"method": "verified"}
    team = build(cfg)
    team.engine.verify = by_parity
    rows, _ = run(team, tmp_path)
    turns = scored_turns(tmp_path)
    assert turns and all(t["extra_rewards"]["verified"] in (0.0, 1.0) for t in turns if t["completion_tokens"])
    for r in rows:
        assert sum(r["faults"][k] for k in ("verifier_error", "verifier_timeout")) == 0
        for name, m in r["agents"].items():
            assert 0.0 <= m["verified_accuracy"] <= 1.0 and m["verified_turns"] == m["turns"]
        assert 0.0 < r["credit"]["verified_share"] <= 1.0


@pytest.mark.parametrize("fault", ["raises", "out_of_range", "times_out"])
def test_a_verifier_that_raises_returns_nonsense_or_hangs_costs_its_turns_score_and_is_counted(tiny_model_dir, tmp_path, fault):
    team = build(small(tiny_model_dir))
    release = threading.Event()

    def verify(ep, turn):
        if turn.agent != "helper":
            return by_parity(ep, turn)
        if fault == "raises":
            raise KeyError("injected verifier failure")
        if fault == "out_of_range":
            return 1.7
        release.wait()  # hangs until the test ends
        return 1.0

    async def deadline_passes(seconds):  # an injected clock: every verifier call's time limit is up at once
        return None

    team.engine.verify = verify
    if fault == "times_out":
        team.engine.sleep = deadline_passes
    try:
        rows, warnings = run(team, tmp_path)
    finally:
        release.set()
    kind = "verifier_timeout" if fault == "times_out" else "verifier_error"
    helper_turns = sum(r["agents"]["helper"]["turns"] for r in rows if "helper" in r["agents"])
    if fault == "times_out":  # the helper's calls hang; the others may or may not beat a deadline that is up at once
        assert helper_turns <= total(rows, kind) <= sum(r["episodes"]["turns"] * r["episodes"]["count"] for r in rows)
    else:
        assert total(rows, kind) == helper_turns
    assert helper_turns > 0
    assert sum(r["episodes"]["errors"] for r in rows) == 0  # a verifier's failure is no episode's
    assert any(w["kind"] == f"fault.{kind}" for w in warnings)
    turns = scored_turns(tmp_path)
    assert all("verified" not in t["extra_rewards"] for t in turns if t["agent"] == "helper")
    if fault != "times_out":
        assert any("verified" in t["extra_rewards"] for t in turns if t["agent"] != "helper")


# --- backends -------------------------------------------------------------------------------------


def test_a_backend_error_on_one_batch_is_retried_per_request_and_counted(tiny_model_dir, tmp_path):
    team = build(small(tiny_model_dir))
    real = team.backend.generate_batch
    batches = [0]

    def flaky(requests, seed=None):
        if len(requests) > 1:
            batches[0] += 1
            if batches[0] == 2:
                raise RuntimeError("injected CUDA error: device-side assert")
        return real(requests, seed)

    team.backend.generate_batch = flaky
    rows, warnings = run(team, tmp_path)
    assert total(rows, "backend_error") == 1  # the failed batch; each of its requests then ran alone
    assert sum(r["episodes"]["errors"] for r in rows) == 0  # ... so nothing was lost
    assert any("injected CUDA error" in w["message"] for w in warnings)


def test_a_request_that_keeps_failing_fails_only_its_episode(tiny_model_dir, tmp_path):
    team = build(small(tiny_model_dir))
    real = team.backend.generate_batch
    seen = [0]

    def poisoned(requests, seed=None):
        if any(r.agent == "checker" for r in requests):
            seen[0] += 1
            if seen[0] in (1, 2):  # the checker's batch, then its first request alone
                raise RuntimeError("injected backend failure")
        return real(requests, seed)

    team.backend.generate_batch = poisoned
    rows, _ = run(team, tmp_path)
    assert rows[0]["faults"]["backend_error"] == 2 and rows[0]["episodes"]["errors"] == 1
    assert rows[0]["faults"]["agent_error"] == 0  # a backend failure is counted as one, not twice


# --- tools ------------------------------------------------------------------------------------------


def hoard(query: str, k: int = 3) -> str:
    chunks = []
    while True:
        chunks.append(bytearray(8 * 1024 * 1024))


def hang(query: str, k: int = 3) -> str:
    threading.Event().wait()
    return "never"


def fail(query: str, k: int = 3) -> str:
    raise RuntimeError("index corrupted")


def phone_home(query: str, k: int = 3) -> str:
    with socket.create_connection(("127.0.0.1", int(query)), timeout=2):
        return "sent"


def tool_team(model_dir, **runtime) -> dict:
    """lead (trained, tiny model) -> researcher (frozen, scripted: one search call, then a report)."""
    cfg = small(model_dir)
    cfg["env"] = {"name": "hotpotqa"}
    cfg["policies"]["judge"] = {"kind": "frozen", "model": str(model_dir), "device": "cpu"}
    cfg["agents"] = [
        {"name": "lead", "policy": "main", "role": "You lead.", "parser": "raw", "sampling": {"max_new_tokens": 6}},
        {"name": "researcher", "policy": "judge", "role": "You research.", "parser": "raw", "tools": ["search"],
         "max_tool_calls": 1},
    ]
    cfg["topology"] = {"kind": "chain", "sequence": ["lead", "researcher"]}
    cfg["credit"] = {"method": "grpo"}
    cfg["runtime"] = runtime
    return cfg


@pytest.mark.parametrize(
    "fn, timeout, kind, message",
    [(fail, 30, "tool_error", "index corrupted"), (hang, 0.5, "tool_timeout", "did not finish within 0.5s"),
     (hoard, 30, "tool_memory", "ran out of memory"), (phone_home, 30, "tool_error", "network access is disabled")],
)
def test_a_tool_that_fails_hangs_hoards_or_phones_home_costs_one_observation(tiny_model_dir, tmp_path, fn, timeout, kind, message):
    """Only the hanging tool meets the time limit: the others get a generous one, so that a busy
    machine filling 64 MB slowly still hits the memory limit first."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    port = server.getsockname()[1]
    team = build(tool_team(tiny_model_dir, tool_timeout_s=timeout, tool_memory_mb=64))
    calls = f'<tool_call>{{"name": "search", "arguments": {{"query": "{port}"}}}}</tool_call>'
    script = ScriptedBackend(lambda req: "Found it." if len(req.messages) > 2 else calls, {"judge": team.policies["judge"].tokenizer})
    team.backend = team.engine.backend = RoutedBackend({"main": team.backend, "judge": script})
    team.engine.tools["search"] = dataclasses.replace(team.engine.tools["search"], fn=fn)
    try:
        rows, warnings = run(team, tmp_path)
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever connected
    finally:
        server.close()
        team.engine.close()
    for r in rows:  # 2 tasks x 2 episodes, one call each
        assert r["faults"][kind] == 4 and r["episodes"]["errors"] == 0
        assert r["agents"]["researcher"]["tool_calls"] == 4 and r["agents"]["researcher"]["tool_valid"] == 0.0
    assert any(w["kind"] == f"fault.{kind}" and message in w["message"] for w in warnings)
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    observations = [o for ep in episodes for t in ep["turns"] for o in t["observations"]]
    assert observations and all(o.startswith("error: search failed") and message in o for o in observations)
