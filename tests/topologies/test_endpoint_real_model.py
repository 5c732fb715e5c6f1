"""Token fidelity through the endpoint on the real model: SmolLM2-135M-Instruct in float32 (hf
backend), a two-agent team whose requests carry tools and a tool round.  Every turn's recorded
ids are what the server rendered and sampled, and the learner's recomputed logprobs of them (the
PPO old logprobs, ``old_logprobs: learner``) equal the logprobs the endpoint sampled with and
returned to the client: to 1e-5 is the issue's target, and float32 holds it on the tiny model
(tests/topologies/test_endpoint.py) but not quite on SmolLM2's 30 layers, whose incremental
(KV-cache) generation and the learner's packed forward sum in other orders: the largest
difference measured here is 1.14e-5 (of logprobs up to about -7), so the bound is 3e-5, far
below what a misaligned token or a re-tokenised text would give (tenths to units)."""

from __future__ import annotations

import pytest
from endpoint_helpers import received
from test_endpoint import endpoint_config

from mas.config.schema import validate_config
from mas.credit import build_credit_batch, run_credit
from mas.training.team import build_team
from mas.training.trainer import training_batches
from mas.types import Task

pytestmark = pytest.mark.slow


def test_every_turn_of_a_tool_using_team_on_smollm2_is_trained_on_the_ids_and_logprobs_it_sampled():
    cfg = endpoint_config("unused", "tool_turns")
    cfg["policies"] = {"main": {"kind": "lora", "model": "smollm2-135m-instruct", "dtype": "float32", "device": "cpu",
                                "optim": {"lr": 1e-4}}}
    cfg["trainer"]["old_logprobs"] = "learner"
    cfg["agents"] = [{**a, "policy": "main", "sampling": {**a["sampling"], "max_new_tokens": 8}}
                     for a in cfg["agents"] if a["name"] in ("lead", "helper")]
    with build_team(validate_config(cfg)) as team:
        groups = team.engine.rollout([Task("t0", "What is 2+3?", "5")], group_size=2, seed=0)
        tok = team.runtime.tokenizers["main"]
        turns = []
        for ep, pairs in received(groups, ["lead", "helper"]):
            assert all("lookup" in tok.decode(t.prompt_ids) for t in ep.turns)  # the tool offered to both
            assert "7" in tok.decode(ep.turns[1].prompt_ids)  # the tool's result, rendered into the helper's prompt
            for turn, reply in pairs:
                assert reply["logprobs"] == pytest.approx(turn.logprobs, abs=0)  # what the client got is what was kept
                turns.append(turn)
        credit = run_credit(build_credit_batch(groups, team.cfg.agent_names), team.cfg.credit)
        samples, _ = training_batches(team, groups, credit, {"main": team.learners["main"]})
        assert [(s.prompt_ids, s.completion_ids) for s in samples["main"]] == [(t.prompt_ids, t.completion_ids) for t in turns]
        batch = team.learners["main"]._prepare(samples["main"])  # the update's first pass: old logprobs recomputed
        recomputed, sampled = batch.per_token["old_logprobs"], batch.per_token["rollout_logprobs"]
        assert len(sampled) == sum(len(t.completion_ids) for t in turns) > 0
        assert (recomputed - sampled).abs().max().item() < 3e-5
