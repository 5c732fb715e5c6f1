"""A team behind the OpenAI-compatible endpoint (``kind: openai``) served by vLLM: SmolLM2 LoRA
adapters in float32 on one engine, 8 concurrent episodes.  Every request is a recorded turn whose
logprobs are what the client received, the episodes' requests share the engine's batches, and the
learner's recompute of the recorded ids agrees with vLLM's logprobs (``FP32_LOGPROB_TOL``)."""

from __future__ import annotations

import pytest
from endpoint_helpers import received
from team_helpers import team_config
from vllm_helpers import FP32_LOGPROB_TOL, MODEL, device, require_vllm

from mas.config.schema import validate_config
from mas.credit import build_credit_batch, run_credit
from mas.training.team import build_team
from mas.training.trainer import training_batches
from mas.types import Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_serves_the_endpoint_teams_requests_batched_and_the_learner_trains_what_was_sampled():
    require_vllm()
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    cfg = team_config("unused", "chain")
    lora = {"kind": "lora", "model": MODEL, "dtype": "float32", "device": device(), "backend": "vllm",
            "lora": {"r": 8, "alpha": 16}, "optim": {"lr": 1e-4}}
    cfg["policies"] = {"main": dict(lora), "help": dict(lora)}
    cfg["agents"] = [{"name": "lead", "policy": "main", "role": "You answer.", "parser": "answer",
                      "sampling": {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0}},
                     {"name": "helper", "policy": "help", "role": "You help.", "parser": "answer",
                      "sampling": {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0}}]
    cfg["topology"] = {"kind": "openai", "entry": "endpoint_helpers:two_agents"}
    cfg["trainer"].update(old_logprobs="learner")
    with build_team(validate_config(cfg)) as team:
        assert type(team.backend).__name__ == "VLLMBackend"
        before = dict(team.engine.stats)
        groups = team.engine.rollout([Task("t0", "7+5", "12"), Task("t1", "12-4", "8")], group_size=4, seed=0)
        requests = team.engine.stats["requests"] - before.get("requests", 0)
        batches = team.engine.stats["batches"] - before.get("batches", 0)
        assert requests == 16 and batches < requests  # 8 episodes x 2 calls, in shared batches
        turns = []
        for _, pairs in received(groups, ["lead", "helper"]):
            for turn, reply in pairs:
                assert reply["logprobs"] == turn.logprobs and len(turn.completion_ids) > 0
                turns.append(turn)
        credit = run_credit(build_credit_batch(groups, team.cfg.agent_names), team.cfg.credit)
        samples, _ = training_batches(team, groups, credit, dict(team.learners))
        for name, learner in team.learners.items():
            batch = learner._prepare(samples[name])
            diff = (batch.per_token["old_logprobs"] - batch.per_token["rollout_logprobs"]).abs().max().item()
            assert diff < FP32_LOGPROB_TOL, (name, diff)
