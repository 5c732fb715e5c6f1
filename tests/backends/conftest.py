"""Fixtures for backend tests: a full policy on the tiny model, and two LoRA policies on one base."""

from __future__ import annotations

import pytest

from mas.agents.policy import PolicyHandle, build_policies
from mas.config.schema import LoraConfig, PolicyConfig


@pytest.fixture()
def full_handle(tiny_model, tiny_tokenizer):
    return PolicyHandle("solver", "full", tiny_model.eval(), tiny_tokenizer, "cpu")


@pytest.fixture()
def lora_handles(tiny_model_dir):
    cfg = PolicyConfig(kind="lora", model=str(tiny_model_dir), device="cpu", lora=LoraConfig(r=4, alpha=8))
    return build_policies({"alpha": cfg, "beta": cfg}, seed=0)

