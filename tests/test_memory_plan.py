"""Memory savers chosen from an estimate (``mas.learning.memory_plan.plan_memory_savers``), on CPU with fake
free-memory budgets.

A model shaped like SmolLM2-135M in bfloat16 (30 layers, width 576, vocabulary 49,152), passes
of T tokens.  Hand-derived sizes (``ACTIVATION_ELEMENTS`` 32, ``LOGIT_COPIES`` 3):

    activations(T)  = T * 30 * 576 * 32 * 2 bytes      T = 4096: 4.22 GiB
    logits(T)       = T * 49152 * 4 * 3 bytes          T = 4096: 2.25 GiB; a 1024 chunk: 0.5625 GiB
    budget          = free / 2
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mas.agents.policy import PolicyHandle
from mas.config.schema import OptimConfig
from mas.learning.learner import Learner
from mas.learning.memory_plan import CPU_PASS_BUDGET, pass_budget_cap, plan_memory_savers

GiB = 2**30


class SmolShaped(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=30, hidden_size=576, vocab_size=49152)
        self.w = nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))


ACT = 4096 * 30 * 576 * 32 * 2
LOGITS = 4096 * 49152 * 4 * 3
CHUNK = 1024 * 49152 * 4 * 3


def test_the_estimates_are_the_formulas():
    plan = plan_memory_savers(SmolShaped(), 4096, "auto", "auto", 100 * GiB)
    assert (plan.activations, plan.logits, plan.budget) == (ACT, LOGITS, 50 * GiB)
    assert plan.activations / GiB == pytest.approx(4.22, abs=0.01) and plan.logits / GiB == 2.25


KEPT = ACT // 32 + ACT // 30  # checkpointed: every layer's input, and one layer's activations recomputed in backward


@pytest.mark.parametrize("free, chunk", [(2 * (KEPT + LOGITS), None), (2 * (KEPT + LOGITS) - 2, 1024)])
def test_a_checkpointed_pass_holds_each_layers_input_and_one_layer_recomputed(free, chunk):
    plan = plan_memory_savers(SmolShaped(), 4096, True, "auto", free)
    assert (plan.checkpointing, plan.logprob_chunk) == (True, chunk), plan.reason


@pytest.mark.parametrize("free, checkpointing, chunk", [
    (2 * (ACT + LOGITS), False, None),  # everything fits: no saver, the fastest pass
    (2 * (ACT + LOGITS) - 2, False, 1024),  # the logits do not fit whole, chunked they do: chunk only
    (2 * (ACT + CHUNK), False, 1024),
    (2 * (ACT + CHUNK) - 2, True, 1024),  # not even chunked: recompute the layers too
    (1 * GiB, True, 1024),
    (None, True, 1024),  # free memory unknown: the safe side
])
def test_auto_turns_savers_on_only_where_the_memory_is_needed(free, checkpointing, chunk):
    plan = plan_memory_savers(SmolShaped(), 4096, "auto", "auto", free)
    assert (plan.checkpointing, plan.logprob_chunk) == (checkpointing, chunk), plan.reason


def test_explicit_settings_are_kept_and_auto_fills_in_the_other():
    model = SmolShaped()
    assert (lambda p: (p.checkpointing, p.logprob_chunk))(plan_memory_savers(model, 4096, False, None, 1 * GiB)) == (False, None)
    assert (lambda p: (p.checkpointing, p.logprob_chunk))(plan_memory_savers(model, 4096, True, 256, 100 * GiB)) == (True, 256)
    # checkpointing off by hand, too little memory: the head is chunked (the only saver left)
    off = plan_memory_savers(model, 4096, False, "auto", 4 * GiB)
    assert (off.checkpointing, off.logprob_chunk) == (False, 1024)
    # checkpointing on by hand keeps ~1/32 of the activations: the whole head then fits in 3 GiB of budget
    on = plan_memory_savers(model, 4096, True, "auto", 6 * GiB)
    assert (on.checkpointing, on.logprob_chunk) == (True, None) and ACT // 32 + LOGITS <= 3 * GiB
    # the head unchunked by hand: checkpointing decides alone
    assert plan_memory_savers(model, 4096, "auto", None, 2 * (ACT + LOGITS)).checkpointing is False
    assert plan_memory_savers(model, 4096, "auto", None, 2 * (ACT + LOGITS) - 2).checkpointing is True


def test_a_model_without_shape_keeps_both_savers_under_auto():
    bare = nn.Linear(2, 2)
    plan = plan_memory_savers(bare, 4096, "auto", "auto", 100 * GiB)
    assert (plan.checkpointing, plan.logprob_chunk, plan.activations) == (True, 1024, None)


@pytest.mark.parametrize("free, on", [(64 * GiB, False), (1024, True)])
def test_the_learner_applies_the_plan_with_the_devices_free_memory(tiny_model, tiny_tokenizer, monkeypatch, free, on):
    """The learner reads the device's free memory (faked here) and switches the model's
    checkpointing on only when the plan says so; the config's own values still win."""
    monkeypatch.setattr("mas.learning.memory_plan.free_memory_bytes", lambda device: free)
    policy = PolicyHandle("p", "full", tiny_model, tiny_tokenizer, "cpu")
    learner = Learner(policy, OptimConfig(lr=1e-3), 10, 0.2, 0.2, 0.0, "token_mean")
    assert learner.memory_plan.budget == min(free // 2, CPU_PASS_BUDGET)
    assert learner.checkpointing is on and learner.logprob_chunk == (1024 if on else None)
    state = getattr(tiny_model, "is_activation_checkpointing", None)  # transformers >= 5; older: is_gradient_checkpointing
    assert bool(state if state is not None else tiny_model.is_gradient_checkpointing) is on
    forced = Learner(PolicyHandle("q", "full", tiny_model, tiny_tokenizer, "cpu"),
                     OptimConfig(lr=1e-3, gradient_checkpointing=False, logprob_chunk=None), 10, 0.2, 0.2, 0.0, "token_mean")
    assert (forced.checkpointing, forced.logprob_chunk, forced.memory_plan.reason) == (False, None, "as configured")


def test_a_cap_bounds_the_budget_whatever_the_free_memory():
    """A 4096-token SmolLM2 pass (activations 4.22 GiB, logits 2.25 GiB) on a host with 100 GiB
    free runs without savers; under a 2 GiB cap it checkpoints and chunks (0.13 + 0.56 GiB)."""
    free = plan_memory_savers(SmolShaped(), 4096, "auto", "auto", 100 * GiB)
    capped = plan_memory_savers(SmolShaped(), 4096, "auto", "auto", 100 * GiB, cap=2 * GiB)
    assert (free.checkpointing, free.logprob_chunk) == (False, None)
    assert (capped.checkpointing, capped.logprob_chunk, capped.budget) == (True, 1024, 2 * GiB), capped.reason
    # a cap above half the free memory changes nothing
    assert plan_memory_savers(SmolShaped(), 4096, "auto", "auto", 4 * GiB, cap=64 * GiB).budget == 2 * GiB


@pytest.mark.parametrize("tokens, checkpointing, chunk", [(1024, False, None), (2048, True, 1024), (4096, True, 1024)])
def test_the_cpu_budget_keeps_a_smollm2_pass_of_1024_tokens_saver_free(tokens, checkpointing, chunk):
    """CPU_PASS_BUDGET (2 GiB): smol_orchestrator's 1024-token passes (1.05 + 0.56 GiB) keep the
    fastest path; the 2048- and 4096-token passes of the other smol configs recompute and chunk."""
    plan = plan_memory_savers(SmolShaped(), tokens, "auto", "auto", 100 * GiB, cap=CPU_PASS_BUDGET)
    assert (plan.checkpointing, plan.logprob_chunk) == (checkpointing, chunk), plan.reason


def test_the_learner_caps_the_budget_on_the_cpu(tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.setattr("mas.learning.memory_plan.free_memory_bytes", lambda device: 64 * GiB)
    learner = Learner(PolicyHandle("p", "full", tiny_model, tiny_tokenizer, "cpu"), OptimConfig(lr=1e-3), 10, 0.2, 0.2, 0.0,
                      "token_mean")
    assert learner.memory_plan.budget == CPU_PASS_BUDGET == 2 * GiB


def test_only_the_cpu_gets_a_pass_cap():
    """The cap is a host rule: a GPU's budget is half its free memory, uncapped."""
    assert pass_budget_cap("cpu") == pass_budget_cap(torch.device("cpu")) == CPU_PASS_BUDGET
    assert pass_budget_cap("cuda:0") is None and pass_budget_cap(torch.device("cuda", 1)) is None
