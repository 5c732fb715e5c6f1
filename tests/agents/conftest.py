"""Fixtures for policy tests: PolicyConfig factories and a pair of LoRA policies on one tiny base."""

from __future__ import annotations

import pytest
import torch

from mas.agents.policy import build_policies
from mas.config import LoraConfig, PolicyConfig


@pytest.fixture()
def policy_config(tiny_model_dir):
    """PolicyConfig factory on the tiny local model (CPU, float32) unless told otherwise."""

    def make(kind: str = "full", model: str | None = None, **kw) -> PolicyConfig:
        if kind == "lora":
            kw.setdefault("lora", LoraConfig(r=4, alpha=8))
        return PolicyConfig(kind=kind, model=model or str(tiny_model_dir), device="cpu", **kw)

    return make


@pytest.fixture()
def lora_pair(policy_config):
    """Two LoRA policies 'alpha' and 'beta' on one tiny base model."""
    return build_policies({"alpha": policy_config("lora"), "beta": policy_config("lora")}, seed=0)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy CI box two spinning OpenMP
    threads per process slow these tests down ten-fold; restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
