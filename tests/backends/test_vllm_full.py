"""The vllm backend on a real vLLM engine serving a ``full`` SmolLM2 policy (this module's one
engine): an update's weights reach the engine and change what it generates, and closing the
backend leaves none of the engine's processes.  Runs where vLLM is installed (``vllm_helpers``)."""

from __future__ import annotations

import pytest
import torch

from vllm_helpers import FP32_LOGPROB_TOL, max_logprob_diff, policy, prompts, require_vllm, requests

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def served():
    require_vllm()
    from mas.agents.policy import build_policies
    from mas.rollout.backends.hf import HFBackend
    from mas.rollout.backends.vllm import VLLMBackend

    handles = build_policies({"main": policy("full")}, seed=0)
    backend = VLLMBackend(handles, max_model_len=1024)
    try:
        yield handles, backend, HFBackend(handles)
    finally:
        backend.close()


def test_an_update_reaches_the_engine_and_changes_the_next_generation(served):
    handles, backend, hf = served
    main = handles["main"]
    ps = prompts(main.tokenizer, role="You are a helpful assistant.")
    reqs = requests("main", ps)
    before = backend.generate_batch(reqs)
    assert [r.completion_ids for r in before] == [r.completion_ids for r in hf.generate_batch(reqs)]

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an "update": the last layer's MLP and the final norm move
        for name, p in main.model.named_parameters():
            if ".layers.29.mlp.down_proj" in name or name.endswith("model.norm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    main.mark_updated()
    main.model.train()  # as the learner leaves it
    backend.sync_weights("main")
    hf.sync_weights("main")
    assert not main.model.training and backend.served_versions["main"] == 1 and backend.stats.weight_pushes == 1

    after = backend.generate_batch(reqs)
    assert [r.completion_ids for r in after] != [r.completion_ids for r in before], "the pushed weights changed nothing"
    assert [r.completion_ids for r in after] == [r.completion_ids for r in hf.generate_batch(reqs)]
    assert all(r.weight_version == 1 for r in after)
    assert max_logprob_diff(main, reqs, after) < FP32_LOGPROB_TOL
    metrics = backend.take_metrics()["vllm"]
    assert metrics["generate_calls"] == 2 and metrics["sync_s"] > 0 and metrics["per_call_s"] > 0

    backend.sync_weights("main")  # that version is served already: nothing is pushed
    assert backend.stats.weight_pushes == 1


def test_close_stops_every_engine_process(served):
    import psutil

    _, backend, _ = served
    pids = backend.engine_pids()
    assert pids and all(psutil.pid_exists(p) for p in pids)
    backend.close()
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"engine processes left after close(): {alive}"
    assert backend.engines == {} and not backend.workdir.exists()
    assert backend.close() == []  # idempotent
