"""Vectorised credit code == slow pure-Python references, on random ragged batches (STYLE 3)."""

from __future__ import annotations

import pytest
import torch
from credit_reference import ref_dr_grpo, ref_dr_mas, ref_grpo, ref_normalise, ref_pipeline, ref_rloo, random_groups
from pydantic import TypeAdapter

from mas.credit import build_credit_batch, credit_config_union, run_credit
from mas.credit.baselines import DrGRPOConfig, GRPOConfig, RLOOConfig
from mas.credit.dr_mas import DrMasConfig
from mas.credit.normalise import NORMALISER_NAMES, NORMALISERS

AGENTS = ["planner", "search", "answer", "verifier", "critic"]

# (num_groups, group_size, max_turns, num_agents, ragged_groups, seed)
CASES = [
    (1, 1, 1, 1, False, 0),  # a single turn: every statistic is a singleton
    (1, 4, 3, 2, False, 1),
    (2, 2, 1, 1, False, 2),  # one turn per episode
    (3, 5, 4, 3, False, 3),
    (4, 8, 6, 3, True, 4),  # groups of different sizes
    (6, 3, 5, 4, True, 5),
    (8, 8, 8, 5, False, 6),
    (5, 6, 10, 2, True, 7),
]
IDS = [f"B{c[0]}-G{c[1]}-T{c[2]}-K{c[3]}{'-ragged' if c[4] else ''}-s{c[5]}" for c in CASES]


def _batch(case):
    num_groups, group_size, max_turns, k, ragged, seed = case
    agents = AGENTS[:k]
    groups = random_groups(seed, num_groups, group_size, max_turns, agents, ragged_groups=ragged)
    return groups, build_credit_batch(groups, agents)


def _expected(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def assert_ref(got: torch.Tensor, ref: list[float]) -> None:
    """float64 credit against a float64 reference loop: equal to round-off (a float32 step
    anywhere in the arithmetic, such as an integer ratio, would be ~1e-7 off)."""
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, _expected(ref), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("penalty", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_matches_reference(case, penalty, scale_by_std):
    groups, batch = _batch(case)
    credit = run_credit(batch, GRPOConfig(scale_by_std=scale_by_std, invalid_penalty=penalty), dtype=torch.float64)
    assert_ref(credit.advantages, ref_grpo(groups, penalty, scale_by_std))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_dr_grpo_matches_reference(case, penalty):
    groups, batch = _batch(case)
    credit = run_credit(batch, DrGRPOConfig(invalid_penalty=penalty), dtype=torch.float64)
    assert_ref(credit.advantages, ref_dr_grpo(groups, penalty))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_rloo_matches_reference(case, penalty):
    groups, batch = _batch(case)
    credit = run_credit(batch, RLOOConfig(invalid_penalty=penalty), dtype=torch.float64)
    assert_ref(credit.advantages, ref_rloo(groups, penalty))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("penalty", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_dr_mas_matches_reference(case, penalty, scale_by_std):
    groups, batch = _batch(case)
    credit = run_credit(batch, DrMasConfig(scale_by_std=scale_by_std, invalid_penalty=penalty), dtype=torch.float64)
    assert_ref(credit.advantages, ref_dr_mas(groups, penalty, scale_by_std))


@pytest.mark.parametrize("kind", sorted(NORMALISERS))
@pytest.mark.parametrize("scale_by_std", [True, False])
@pytest.mark.parametrize("eps", [1e-6, 0.25])
@pytest.mark.parametrize("seed", range(6))
def test_normalisers_match_reference(kind, scale_by_std, eps, seed):
    """Random ragged segments: values [M], group ids and agent ids drawn at random."""
    gen = torch.Generator().manual_seed(seed)
    m = int(torch.randint(1, 60, (1,), generator=gen))
    num_groups = int(torch.randint(1, 6, (1,), generator=gen))
    num_agents = int(torch.randint(1, 4, (1,), generator=gen))
    group_ids = torch.randint(0, num_groups, (m,), generator=gen)  # [M]
    agent_ids = torch.randint(0, num_agents, (m,), generator=gen)  # [M]
    if seed % 2:  # ties and constant segments
        values = torch.tensor([0.0, 0.1, 0.9, 1.0])[torch.randint(0, 4, (m,), generator=gen)]  # [M]
    else:
        values = torch.randn(m, generator=gen) * 3 + 1  # [M]
    out = NORMALISERS[kind](values, group_ids=group_ids, agent_ids=agent_ids, scale_by_std=scale_by_std, eps=eps)
    expected = ref_normalise(kind, values.tolist(), group_ids.tolist(), agent_ids.tolist(), scale_by_std, eps)
    assert_ref(out.values, expected)


METHODS = ["grpo", "dr_grpo", "rloo", "dr_mas"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("normaliser", NORMALISER_NAMES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("penalty", [0.0, 0.3])
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_every_pipeline_matches_reference(case, normaliser, method, penalty, scale_by_std):
    """Every method x normaliser, configured as the YAML section would be, against the loops
    of ``ref_pipeline``; eps alternates between verl's 1e-6 and a visible 0.25."""
    groups, batch = _batch(case)
    eps = 0.25 if case[-1] % 2 else 1e-6
    section = {"method": method, "normaliser": normaliser, "eps": eps, "invalid_penalty": penalty}
    if method != "dr_grpo":  # Dr. GRPO has no scale_by_std key: it never divides
        section["scale_by_std"] = scale_by_std
    cfg = TypeAdapter(credit_config_union()).validate_python(section)
    credit = run_credit(batch, cfg, dtype=torch.float64)
    assert_ref(credit.advantages, ref_pipeline(groups, method, normaliser, penalty, scale_by_std, eps))
