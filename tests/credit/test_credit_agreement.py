"""Agreement with the methods' public code and peer libraries (docs/credit.md, "Agreement with
the authors' code"): one hand-derived test per item, beside the per-method files that test the
same rules on random batches against slow references.

Items here: float64 credit arithmetic with one cast at the end (every method), LLM-MCA's
rescaling guard for cancelling credits, rewards of extreme magnitude, eps = 0 as a config
error, TRL's ``scale_rewards="batch"`` normaliser, and CCPO v1's defaults as the authors' run
script sets them.  (MAGRPO's std default: test_credit_magrpo.py; singleton segments:
test_credit_normalise.py / test_credit_dr_mas.py / test_credit_baselines.py; C3's no-replay
pooling: test_credit_c3.py.)
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from credit_reference import make_group, random_groups
from pydantic import TypeAdapter, ValidationError

from mas.credit import NonFiniteCreditError, build_credit_batch, credit_config_union, credit_names, get_credit, plan_credit, run_credit
from mas.credit.baselines import GRPOConfig, RLOOConfig
from mas.credit.ccpo import CCPOConfig
from mas.credit.critic import CriticConfig
from mas.credit.normalise import normalise_group_batch_std
from mas.types import CritiqueRequest, Episode

AGENTS = ["planner", "worker", "answerer"]


# --- float64 throughout, one cast at the end ------------------------------------------------------


def test_rloo_integer_ratio_is_float64():
    """G = 7: G/(G-1) = 7/6 is not a float32 number.  R = [1, 0, 0, 0, 0, 0, 0.3]:
    mean = 1.3/7, so A_0 = 7/6 · (1 − 1.3/7) = (7 − 1.3)/6 = 0.95 exactly in real arithmetic.
    The float64 result is within round-off of 0.95; a factor computed from integer tensors
    (float32 1.1666666269302368) would be ~3e-8 off."""
    R = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3]
    batch = build_credit_batch([make_group([["planner"]] * 7, R)], AGENTS)
    adv = run_credit(batch, RLOOConfig(), dtype=torch.float64).advantages
    assert adv.dtype == torch.float64
    assert abs(float(adv[0]) - 0.95) < 1e-15
    assert abs(float(adv[6]) - (0.3 - 1.0 / 6)) < 1e-15  # 0.3 − mean of the other six (1/6)
    f32_factor = float(torch.tensor(7) / torch.tensor(6))  # what long / long gives
    assert abs(f32_factor * (1 - 1.3 / 7) - 0.95) > 1e-8  # the error the float64 path avoids


def _fake_results(groups, cfg, seed: int) -> dict:
    """What the engine would return for every planned request: replay / intervention episodes
    with seeded rewards, critic replies that parse."""
    rng = random.Random(seed)
    out: dict = {}
    requests = plan_credit(groups, cfg)
    for req in requests:
        if isinstance(req, CritiqueRequest):
            if getattr(cfg, "mode", "") == "llm_mca":
                e = int(req.key.split("/")[1])
                ep = [ep for g in groups for ep in g.episodes][e]
                counts: dict[str, int] = {}
                for t in ep.turns:
                    counts[t.agent] = counts.get(t.agent, 0) + 1
                out[req.key] = [json.dumps({a: [rng.uniform(-1, 2) for _ in range(n)] for a, n in counts.items()})]
            else:
                out[req.key] = [f"PROCESS_SCORE: {rng.choice([0, 3, 5.5, 7, 10])}"]
        else:
            n = getattr(req, "num_samples", 1)
            out[req.key] = [Episode(task=req.source.task, group_id=0, sample_id=i, seed=0, reward=rng.choice([0.0, 1.0, rng.uniform(-1, 2)])) for i in range(n)]
    return out


def _section(method: str) -> dict:
    return {
        "sharp": {"method": "sharp"},
        "c3": {"method": "c3", "fanout": [4, 3]},
        "ccpo": {"method": "ccpo", "version": "v1", "min_samples": 0},
        "critic": {"method": "critic", "critic": "judge"},
        "m_grpo": {"method": "m_grpo", "main_agent": "planner"},
    }.get(method, {"method": method})


@pytest.mark.parametrize("method", credit_names() + ["critic_llm_mca"])
def test_every_method_computes_in_float64_and_casts_once(method):
    """For every registered method: the method function returns float64 advantages and float
    breakdowns, and run_credit's float32 output is exactly that result rounded once (bitwise)."""
    section = {"method": "critic", "critic": "judge", "mode": "llm_mca"} if method == "critic_llm_mca" else _section(method)
    cfg = TypeAdapter(credit_config_union()).validate_python(section)
    groups = random_groups(7, 3, 4, 4, AGENTS, min_turns=1)
    batch = build_credit_batch(groups, AGENTS)
    results = _fake_results(groups, cfg, 7)
    state = get_credit(cfg.method).state
    if state is not None:
        state.reset()
    raw = get_credit(cfg.method).fn(batch, cfg, results)
    assert raw.advantages.dtype == torch.float64
    assert all(v.dtype == torch.float64 for v in raw.breakdown.values() if v.is_floating_point()), method
    for dtype in (torch.float64, torch.float32):
        if state is not None:
            state.reset()
        out = run_credit(batch, cfg, results, dtype=dtype)
        assert out.advantages.dtype == dtype
        assert torch.equal(out.advantages, raw.advantages.to(dtype)), (method, dtype)


# --- LLM-MCA: credits that nearly cancel -----------------------------------------------------------


def test_llm_mca_nearly_cancelling_credits_do_not_explode():
    """R = 1, critic credits [1, −0.999999]: Σc = 1e-6, Σ|c| ≈ 2, so |Σc| < 0.1 · Σ|c|.  The plain
    rescale c·R/Σc would give [1e6, −999999] (finite, so no check catches it); the guard shifts
    instead: c + (R − Σc)/T = c + (1 − 1e-6)/2 = [1.4999995, −0.4999995], which sums to R."""
    groups = [make_group([["a", "b"], ["a", "b"]], [1.0, 1.0])]
    replies = {"critic/0": ['{"a": [1], "b": [-0.999999]}'], "critic/1": ['{"a": [3], "b": [1]}']}
    cfg = CriticConfig(critic="judge", mode="llm_mca", normaliser="none")
    credit = run_credit(build_credit_batch(groups, ["a", "b"]), cfg, replies, dtype=torch.float64)
    shift = (1 - 1e-6) / 2
    torch.testing.assert_close(credit.advantages[:2], torch.tensor([1 + shift, -0.999999 + shift], dtype=torch.float64), rtol=1e-15, atol=1e-15)
    # the second episode is far from cancelling (|4| >= 0.1·4): rescaled, [3, 1] · 1/4
    torch.testing.assert_close(credit.advantages[2:], torch.tensor([0.75, 0.25], dtype=torch.float64), rtol=1e-15, atol=1e-15)
    assert credit.breakdown["renormalise_shifts"].item() == 1
    assert float(credit.advantages.abs().max()) < 2  # nothing of order 1e6
    # the tolerance is a bound: with cancel_tol 1e-7 the rescale is allowed and explodes as described
    loose = run_credit(build_credit_batch(groups, ["a", "b"]), cfg.model_copy(update={"cancel_tol": 1e-7}), replies, dtype=torch.float64)
    assert float(loose.advantages[0]) == pytest.approx(1e6, rel=1e-9)


def test_llm_mca_rescaled_credit_is_bounded_by_r_over_tol():
    """Every rescaled credit satisfies |c·R/Σc| <= |R| · Σ|c|/|Σc| <= |R|/cancel_tol."""
    rng = random.Random(0)
    groups = random_groups(1, 4, 5, 4, AGENTS, min_turns=1)
    batch = build_credit_batch(groups, AGENTS)
    cfg = CriticConfig(critic="judge", mode="llm_mca", normaliser="none")
    results = _fake_results(groups, cfg, 1)
    for key in results:  # credits that often nearly cancel
        obj = json.loads(results[key][0])
        results[key] = [json.dumps({a: [rng.choice([1.0, -1.0]) * rng.uniform(0.9, 1.1) for _ in v] for a, v in obj.items()})]
    credit = run_credit(batch, cfg, results, dtype=torch.float64)
    R = batch.episode_rewards[batch.episode_ids].abs()
    bound = R / cfg.cancel_tol + 1.1 + R  # rescale bound, or a shifted credit: |c| + |R − Σc|/T
    assert bool((credit.advantages.abs() <= bound).all())
    sums = torch.zeros(batch.num_episodes, dtype=torch.float64).index_add_(0, batch.episode_ids, credit.advantages)
    torch.testing.assert_close(sums, batch.episode_rewards, rtol=1e-12, atol=1e-12)


# --- rewards of extreme magnitude ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["grpo", "dr_mas", "magrpo", "reinforce_pp"])
def test_huge_rewards_are_normalised_safely(method):
    """R = [1e155, 0, 0, 1e155]: the squares overflow float64 (1e310), which used to give std = inf
    and silently all-zero advantages.  Scaled statistics give the same advantages as [1, 0, 0, 1]."""
    cfg = TypeAdapter(credit_config_union()).validate_python({"method": method})
    orders = [["planner", "worker"], ["planner"], ["worker", "planner"], ["planner", "answerer"]]
    huge = build_credit_batch([make_group(orders, [1e155, 0.0, 0.0, 1e155])], AGENTS)
    unit = build_credit_batch([make_group(orders, [1.0, 0.0, 0.0, 1.0])], AGENTS)
    a = run_credit(huge, cfg, dtype=torch.float64).advantages
    b = run_credit(unit, cfg, dtype=torch.float64).advantages
    assert bool((a != 0).any())
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # equal up to eps, which is negligible at 1e155 but not at 1


def test_huge_rewards_kept_raw_fail_loudly_naming_the_episode():
    """RLOO (normaliser none) keeps the reward scale: 1e155 − mean overflows float32 at the final
    cast, and run_credit names the episodes and their rewards instead of training on inf."""
    batch = build_credit_batch([make_group([["planner"], ["worker"], ["planner"]], [1e155, 0.0, 2.0])], AGENTS)
    assert torch.isfinite(run_credit(batch, RLOOConfig(), dtype=torch.float64).advantages).all()  # fine in float64
    with pytest.raises(NonFiniteCreditError, match=r"episodes \[0, 1, 2\].*1e\+155") as info:
        run_credit(batch, RLOOConfig())
    assert info.value.agents == ["planner", "worker"]


@pytest.mark.parametrize("section", [
    {"method": "grpo"}, {"method": "dr_grpo"}, {"method": "rloo"}, {"method": "dr_mas"}, {"method": "magrpo"},
    {"method": "reinforce_pp"}, {"method": "sharp"}, {"method": "c3"}, {"method": "ccpo"},
    {"method": "m_grpo", "main_agent": "planner"}, {"method": "critic", "critic": "judge"},
])
def test_eps_zero_is_a_config_error_for_every_method(section):
    ta = TypeAdapter(credit_config_union())
    with pytest.raises(ValidationError, match="greater than 0"):
        ta.validate_python({**section, "eps": 0.0})
    assert ta.validate_python({**section, "eps": 1e-12}).eps == 1e-12


def test_normaliser_functions_reject_eps_zero():
    with pytest.raises(ValueError, match="eps must be"):
        normalise_group_batch_std(torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), eps=0.0)
    assert normalise_group_batch_std(torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), eps=0.0, scale_by_std=False).values.tolist() == [0.5, -0.5]


# --- TRL's scale_rewards="batch" --------------------------------------------------------------------


def test_group_batch_std_by_hand():
    """Two tasks, episode rewards [1, 0] and [3, 3, 0]: group means 1/2 and 2; one ddof-1 std over
    all five rewards [1, 0, 3, 3, 0]: mean 7/5, Σ(x − 7/5)² = 0.16 + 1.96 + 2.56 + 2.56 + 1.96 = 9.2,
    std = sqrt(9.2/4) = sqrt(2.3).  A = (R − group mean) / (sqrt(2.3) + eps)."""
    g0 = make_group([["planner"], ["planner"]], [1.0, 0.0], group_id=0)
    g1 = make_group([["planner"], ["planner"], ["worker"]], [3.0, 3.0, 0.0], group_id=1)
    batch = build_credit_batch([g0, g1], AGENTS)
    eps = 1e-6
    sd = math.sqrt(2.3)
    want = torch.tensor([0.5, -0.5, 1.0, 1.0, -2.0], dtype=torch.float64) / (sd + eps)
    got = run_credit(batch, GRPOConfig(normaliser="group_batch_std"), dtype=torch.float64)
    torch.testing.assert_close(got.advantages, want, rtol=1e-13, atol=1e-13)
    assert got.breakdown["norm_std"].tolist() == pytest.approx([sd] * 5, abs=1e-14)
    # per-group GRPO would scale the two tasks differently; here both share one scale
    assert not torch.allclose(run_credit(batch, GRPOConfig(), dtype=torch.float64).advantages, want)


# --- CCPO v1: the authors' run-script values ----------------------------------------------------------


def test_ccpo_v1_defaults_are_the_authors_run_script_values():
    """CCPO-v1/scripts/rl/separated_rema/example_test500_qwen2_5_7b.sh: historical_min_samples=10,
    ema_decay=0.99, alpha=1.0, eta=1.0; rollout.n=4 with one solo run per joint rollout."""
    cfg = CCPOConfig(version="v1")
    assert (cfg.min_samples, cfg.ema_decay, cfg.alpha, cfg.eta, cfg.solo_samples) == (10, 0.99, 1.0, 1.0, 1)
    assert cfg.v1_warmup == "shapley" and cfg.grpo_scale_by_std is None  # None: v1 divides by the std ("double normalization")
