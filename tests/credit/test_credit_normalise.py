"""Normalisers: hand-derived examples, invariances and the verl statistics rules."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from mas.credit.normalise import (
    NORMALISERS,
    NormaliserConfig,
    get_normaliser,
    normalise_agent,
    normalise_global,
    normalise_group,
    normalise_none,
    segment_stats,
)

EPS = 1e-6


def test_group_hand_example():
    # two groups: [1, 0, 0, 1] and [2, 4]
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    s0 = math.sqrt(4 * 0.25 / 3)  # ddof = 1
    s1 = math.sqrt(2 * 1.0 / 1)
    out = normalise_group(values, group_ids=groups)
    expected = torch.tensor([0.5 / (s0 + EPS), -0.5 / (s0 + EPS), -0.5 / (s0 + EPS), 0.5 / (s0 + EPS), -1 / (s1 + EPS), 1 / (s1 + EPS)])
    torch.testing.assert_close(out.values, expected)
    torch.testing.assert_close(out.mean, torch.tensor([0.5] * 4 + [3.0] * 2))
    torch.testing.assert_close(out.std, torch.tensor([s0] * 4 + [s1] * 2))
    assert out.count.tolist() == [4, 4, 4, 4, 2, 2]
    centred = normalise_group(values, group_ids=groups, scale_by_std=False)
    torch.testing.assert_close(centred.values, torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, 1.0]))


def test_global_hand_example():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0])
    mean, std = 3.0, math.sqrt((4 + 1 + 0 + 9) / 3)
    out = normalise_global(values, group_ids=torch.tensor([0, 0, 1, 1]))  # ids are ignored
    torch.testing.assert_close(out.values, (values - mean) / (std + EPS))


def test_agent_hand_example():
    # group 0: agent 0 -> [1, 0, 1]; agent 1 -> [5]   group 1: agent 0 -> [2, 2]; agent 1 -> [0, 3]
    values = torch.tensor([1.0, 5.0, 0.0, 1.0, 2.0, 0.0, 2.0, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    agents = torch.tensor([0, 1, 0, 0, 0, 1, 0, 1])
    m00, s00 = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    s11 = math.sqrt(2 * 1.5**2 / 1)
    expected = torch.tensor(
        [
            (1 - m00) / (s00 + EPS),
            5.0 / (1 + EPS),  # singleton: mean 0, std 1
            (0 - m00) / (s00 + EPS),
            (1 - m00) / (s00 + EPS),
            0.0,  # constant [2, 2]
            -1.5 / (s11 + EPS),
            0.0,
            1.5 / (s11 + EPS),
        ]
    )
    torch.testing.assert_close(normalise_agent(values, group_ids=groups, agent_ids=agents).values, expected)


def test_none_is_identity():
    values = torch.tensor([3.0, -1.0, 0.5])
    out = normalise_none(values, group_ids=torch.zeros(3, dtype=torch.long))
    assert torch.equal(out.values, values)
    assert torch.equal(out.mean, torch.zeros(3)) and torch.equal(out.std, torch.ones(3))


def test_singleton_segment_keeps_raw_value():
    """verl: a segment of one gets mean 0 and std 1."""
    out = normalise_group(torch.tensor([0.7, 2.0, 4.0]), group_ids=torch.tensor([0, 1, 1]), eps=0.5)
    assert out.values[0].item() == pytest.approx(0.7 / 1.5)
    assert out.mean[0].item() == 0.0 and out.std[0].item() == 1.0
    assert normalise_global(torch.tensor([0.7]), scale_by_std=False).values.item() == pytest.approx(0.7)


@pytest.mark.parametrize("kind", ["global", "group", "agent"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_constant_segments_give_exact_zero(kind, eps):
    """0.9 x 3 leaves float32 rounding residue in a naive mean; here the result is exactly 0
    (and not NaN with eps = 0)."""
    values = torch.full((6,), 0.9)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    out = NORMALISERS[kind](values, group_ids=ids, agent_ids=torch.zeros(6, dtype=torch.long), eps=eps)
    assert torch.equal(out.values, torch.zeros(6))
    naive = (values[:3] - values[:3].mean()) / (values[:3].std() + 1e-6)
    assert naive.abs().max() > 1e-3  # the case is a real trap for a float32 implementation


@pytest.mark.parametrize("seed", range(4))
def test_agent_normaliser_is_shift_invariant_per_agent(seed):
    """Adding c_k to every value of agent k (and c_(b,k) per task) leaves the result unchanged;
    the group normaliser is not invariant to that.  Singleton segments are the exception: the
    verl quirk returns their raw (hence shifted) value."""
    gen = torch.Generator().manual_seed(seed)
    m = 40
    groups = torch.randint(0, 3, (m,), generator=gen)
    agents = torch.randint(0, 4, (m,), generator=gen)
    values = torch.randn(m, generator=gen)
    c_agent = torch.randn(4, generator=gen) * 5  # [K]
    c_pair = torch.randn(3, 4, generator=gen) * 5  # [B, K]
    ref = normalise_agent(values, group_ids=groups, agent_ids=agents)
    for shifted in (values + c_agent[agents], values + c_pair[groups, agents]):
        out = normalise_agent(shifted, group_ids=groups, agent_ids=agents)
        many = ref.count > 1  # [M]
        assert int(many.sum()) > 20 and int((~many).sum()) > 0
        torch.testing.assert_close(out.values[many], ref.values[many], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.values[~many], shifted[~many] / (1 + 1e-6))
    assert not torch.allclose(
        normalise_group(values + c_agent[agents], group_ids=groups).values, normalise_group(values, group_ids=groups).values, atol=1e-3
    )


@pytest.mark.parametrize("kind", ["global", "group", "agent"])
def test_scale_invariance_and_unit_std(kind):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(30, generator=gen)
    g = torch.randint(0, 2, (30,), generator=gen)
    a = torch.randint(0, 2, (30,), generator=gen)
    fn = NORMALISERS[kind]
    out = fn(values, group_ids=g, agent_ids=a)
    torch.testing.assert_close(fn(values * 7 + 3, group_ids=g, agent_ids=a).values, out.values, atol=1e-4, rtol=1e-4)
    key = {"global": torch.zeros_like(g), "group": g, "agent": g * 2 + a}[kind]
    for s in key.unique():
        sel = key == s
        if int(sel.sum()) > 1:
            assert abs(float(out.values[sel].mean())) < 1e-5
            assert float(out.values[sel].std()) == pytest.approx(1.0, abs=1e-4)


def test_segment_stats_empty_segments_and_empty_input():
    stats = segment_stats(torch.tensor([1.0, 3.0]), torch.tensor([2, 2]), num_segments=4)
    assert stats.count.tolist() == [0, 0, 2, 0]
    assert stats.mean[2].item() == 2.0
    empty = normalise_agent(torch.zeros(0), group_ids=torch.zeros(0, dtype=torch.long), agent_ids=torch.zeros(0, dtype=torch.long))
    assert empty.values.shape == (0,)


def test_dtype_is_preserved():
    v64 = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    assert normalise_global(v64).values.dtype == torch.float64
    assert normalise_global(v64.float()).values.dtype == torch.float32


def test_missing_ids_and_unknown_name_are_errors():
    with pytest.raises(ValueError, match="group_ids"):
        normalise_group(torch.ones(2))
    with pytest.raises(ValueError, match="agent_ids"):
        normalise_agent(torch.ones(2), group_ids=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\['agent', 'global', 'group', 'none'\]"):
        get_normaliser("batch")


def test_normaliser_config():
    cfg = NormaliserConfig(kind="group", scale_by_std=False)
    out = cfg.apply(torch.tensor([1.0, 3.0]), group_ids=torch.tensor([0, 0]))
    torch.testing.assert_close(out.values, torch.tensor([-1.0, 1.0]))
    with pytest.raises(ValidationError):
        NormaliserConfig(kind="batch")
    with pytest.raises(ValidationError):
        NormaliserConfig(kind="group", extra_key=1)
