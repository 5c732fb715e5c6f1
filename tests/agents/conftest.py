"""Fixtures for policy tests: PolicyConfig factories and a pair of LoRA policies on one tiny base."""

from __future__ import annotations

import pytest

from mas.agents.policy import build_policies
from mas.config.schema import LoraConfig, PolicyConfig


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

