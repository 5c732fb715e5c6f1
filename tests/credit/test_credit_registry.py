"""Registry, config schema and numerical-safety checks of run_credit."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Literal

import pytest
import torch
from credit_reference import make_group
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

import mas.credit as credit
from mas.credit import (
    CreditConfigBase,
    NonFiniteCreditError,
    build_credit_batch,
    credit_config_union,
    credit_names,
    get_credit,
    plan_credit,
    register_credit,
    run_credit,
)
from mas.credit.baselines import GRPOConfig
from mas.credit.dr_mas import DrMasConfig, dr_mas
from mas.types import Credit

BUILTIN = ["dr_grpo", "dr_mas", "grpo", "rloo"]  # the episode-level baselines and Dr. MAS: no plan
ALL_METHODS = sorted(BUILTIN + ["c3", "ccpo", "critic", "m_grpo", "magrpo", "reinforce_pp", "sharp", "verified"])
PLANNED = {"c3", "ccpo", "critic", "sharp", "verified"}  # methods that may ask the engine for extra evaluations (verified: with a critic)


class _NanConfig(CreditConfigBase):
    method: Literal["nan_test"] = Field("nan_test", description="tag")
    bad_agent: int = Field(1, description="agent whose turns get NaN")


def _nan_method(batch, cfg, results=None):
    adv = torch.zeros(batch.num_turns)
    adv[batch.agent_ids == cfg.bad_agent] = math.nan
    return Credit(advantages=adv)


def _batch():
    groups = [make_group([["solver", "verifier"], ["solver"], ["solver", "verifier"]], [1.0, 0.0, 1.0])]
    return build_credit_batch(groups, ["solver", "verifier", "critic"])


def test_builtins_are_registered_on_import():
    assert credit_names() == ALL_METHODS
    assert {n for n in ALL_METHODS if get_credit(n).plan is not None} == PLANNED
    assert get_credit("dr_mas").fn is dr_mas
    assert get_credit("dr_mas").config_cls is DrMasConfig
    assert all(get_credit(n).plan is None for n in BUILTIN)
    assert credit.__all__  # re-exports exist
    for name in ("register_credit", "get_credit", "credit_names", "credit_config_union", "build_credit_batch", "run_credit"):
        assert callable(getattr(credit, name))


def test_duplicate_registration_is_an_error(isolated_registry):
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_credit("grpo", GRPOConfig)(lambda batch, cfg, results=None: None)
    register_credit("nan_test", _NanConfig)(_nan_method)
    with pytest.raises(ValueError, match="already registered"):
        register_credit("nan_test", _NanConfig)(_nan_method)


def test_config_must_carry_the_method_tag(isolated_registry):
    class NoTag(CreditConfigBase):
        eps: float = Field(1e-6, description="eps")

    class WrongTag(CreditConfigBase):
        method: Literal["other"] = Field("other", description="tag")

    for cls in (NoTag, WrongTag):
        with pytest.raises(TypeError, match=r"method: Literal\['mine'\]"):
            register_credit("mine", cls)(_nan_method)
    assert "mine" not in credit_names()


def test_unknown_name_lists_valid_names_sorted():
    with pytest.raises(KeyError) as info:
        get_credit("magic")
    assert str(info.value) == f"unknown credit method 'magic'; valid: {', '.join(ALL_METHODS)}"


def test_run_credit_dispatches_on_method():
    batch = _batch()
    cfg = DrMasConfig(invalid_penalty=0.0)
    # the method returns float64; run_credit casts once, to float32 by default
    assert dr_mas(batch, cfg).advantages.dtype == torch.float64 and run_credit(batch, cfg).advantages.dtype == torch.float32
    assert torch.equal(run_credit(batch, cfg).advantages, dr_mas(batch, cfg).advantages.float())
    assert torch.equal(run_credit(batch, cfg, dtype=torch.float64).advantages, dr_mas(batch, cfg).advantages)
    assert not torch.allclose(run_credit(batch, cfg).advantages, run_credit(batch, GRPOConfig()).advantages)
    with pytest.raises(TypeError, match="expects a GRPOConfig"):
        run_credit(batch, SimpleNamespace(method="grpo", eps=1e-6, scale_by_std=True, invalid_penalty=0.0))
    assert plan_credit([], cfg) == []


def test_non_finite_advantages_name_the_agent(isolated_registry):
    register_credit("nan_test", _NanConfig)(_nan_method)
    with pytest.raises(FloatingPointError, match=r"agents \['verifier'\]") as info:
        run_credit(_batch(), _NanConfig(bad_agent=1))
    assert isinstance(info.value, NonFiniteCreditError) and info.value.agents == ["verifier"]
    assert "solver" not in str(info.value)
    # no turn of agent 2 ('critic'): all finite, no error
    run_credit(_batch(), _NanConfig(bad_agent=2))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("method", BUILTIN)
def test_non_finite_reward_names_the_agents_of_that_episode(bad, method):
    g0 = make_group([["solver"], ["solver"]], [1.0, 0.0], group_id=0)
    g1 = make_group([["critic", "verifier"], ["verifier"]], [bad, 0.0], group_id=1)
    batch = build_credit_batch([g0, g1], ["solver", "verifier", "critic"])
    cfg = TypeAdapter(credit_config_union()).validate_python({"method": method})
    with pytest.raises(NonFiniteCreditError, match=r"episodes \[2\].*\['critic', 'verifier'\]") as info:
        run_credit(batch, cfg)
    assert info.value.agents == ["critic", "verifier"]


def test_run_credit_checks_the_advantage_shape(isolated_registry):
    class ShortConfig(CreditConfigBase):
        method: Literal["short"] = Field("short", description="tag")

    register_credit("short", ShortConfig)(lambda batch, cfg, results=None: Credit(advantages=torch.zeros(1)))
    with pytest.raises(ValueError, match="shape"):
        run_credit(_batch(), ShortConfig())


class _RunConfig(BaseModel):
    credit: credit_config_union()


def test_union_picks_the_class_by_tag():
    cfg = _RunConfig.model_validate({"credit": {"method": "dr_mas", "eps": 1e-5}}).credit
    assert isinstance(cfg, DrMasConfig) and cfg.eps == 1e-5 and cfg.invalid_penalty == 0.1
    assert isinstance(_RunConfig.model_validate({"credit": {"method": "grpo"}}).credit, GRPOConfig)


def test_union_rejects_unknown_method_listing_valid_tags():
    with pytest.raises(ValidationError) as info:
        _RunConfig.model_validate({"credit": {"method": "shapley_magic"}})
    msg = str(info.value)
    assert "shapley_magic" in msg
    assert ", ".join(repr(n) for n in ALL_METHODS) in msg


def test_union_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        _RunConfig.model_validate({"credit": {"method": "grpo", "scale_by_stdd": False}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        _RunConfig.model_validate({"credit": {"method": "dr_grpo", "scale_by_std": False}})  # Dr. GRPO never divides: no such key
    with pytest.raises(ValidationError, match="'none', 'group', 'group_batch_std', 'global' or 'agent'"):
        _RunConfig.model_validate({"credit": {"method": "grpo", "normaliser": "agentwise"}})
    with pytest.raises(ValidationError):
        _RunConfig.model_validate({"credit": {"method": "dr_mas", "eps": -1.0}})
    with pytest.raises(ValidationError):
        _RunConfig.model_validate({"credit": {"method": "dr_mas", "invalid_penalty": math.nan}})


@pytest.mark.parametrize("name", BUILTIN)
def test_configs_are_frozen_documented_and_tagged(name):
    cls = get_credit(name).config_cls
    assert issubclass(cls, CreditConfigBase)
    cfg = cls()
    assert cfg.method == name
    with pytest.raises(ValidationError):
        cfg.eps = 0.5  # frozen
    for field_name, field in cls.model_fields.items():
        assert field.description, f"{cls.__name__}.{field_name} has no description"
    assert {"method", "normaliser", "eps", "invalid_penalty"} <= set(cls.model_fields)


def test_defaults():
    from mas.credit.baselines import DrGRPOConfig, RLOOConfig

    assert GRPOConfig() == GRPOConfig(eps=1e-6, scale_by_std=True, invalid_penalty=0.0)
    assert DrGRPOConfig().invalid_penalty == 0.0 and RLOOConfig().invalid_penalty == 0.0
    assert DrMasConfig() == DrMasConfig(eps=1e-6, scale_by_std=True, invalid_penalty=0.1)
    # each method's spec normaliser
    assert GRPOConfig().normaliser == "group" and GRPOConfig().scale_by_std is True
    assert DrGRPOConfig().normaliser == "group" and DrGRPOConfig().scale_by_std is False
    assert RLOOConfig().normaliser == "none"
    assert DrMasConfig().normaliser == "agent" and DrMasConfig().scale_by_std is True
