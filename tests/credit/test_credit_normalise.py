"""Normalisers: hand-derived examples, invariances and the verl statistics rules."""

from __future__ import annotations

import math

import pytest
import torch
from credit_reference import make_group

from mas.credit import build_credit_batch
from mas.credit.normalise import (
    NORMALISER_NAMES,
    NORMALISERS,
    RawScores,
    get_normaliser,
    normalise_agent,
    normalise_credit,
    normalise_global,
    normalise_group,
    normalise_none,
    segment_stats,
)

EPS = 1e-6


def f64(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """float64 results against float64 hand values: equal to round-off."""
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want.to(torch.float64), rtol=1e-12, atol=1e-12)


def test_group_hand_example():
    # two groups: [1, 0, 0, 1] and [2, 4]
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    s0 = math.sqrt(4 * 0.25 / 3)  # ddof = 1
    s1 = math.sqrt(2 * 1.0 / 1)
    out = normalise_group(values, group_ids=groups)
    expected = f64([0.5 / (s0 + EPS), -0.5 / (s0 + EPS), -0.5 / (s0 + EPS), 0.5 / (s0 + EPS), -1 / (s1 + EPS), 1 / (s1 + EPS)])
    close(out.values, expected)
    close(out.mean, f64([0.5] * 4 + [3.0] * 2))
    close(out.std, f64([s0] * 4 + [s1] * 2))
    assert out.count.tolist() == [4, 4, 4, 4, 2, 2]
    centred = normalise_group(values, group_ids=groups, scale_by_std=False)
    close(centred.values, f64([0.5, -0.5, -0.5, 0.5, -1.0, 1.0]))


def test_global_hand_example():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0])
    mean, std = 3.0, math.sqrt((4 + 1 + 0 + 9) / 3)
    out = normalise_global(values, group_ids=torch.tensor([0, 0, 1, 1]))  # ids are ignored
    close(out.values, (values.double() - mean) / (std + EPS))


def test_agent_hand_example():
    # group 0: agent 0 -> [1, 0, 1]; agent 1 -> [5]   group 1: agent 0 -> [2, 2]; agent 1 -> [0, 3]
    values = torch.tensor([1.0, 5.0, 0.0, 1.0, 2.0, 0.0, 2.0, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    agents = torch.tensor([0, 1, 0, 0, 0, 1, 0, 1])
    m00, s00 = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    s11 = math.sqrt(2 * 1.5**2 / 1)
    expected = f64(
        [
            (1 - m00) / (s00 + EPS),
            0.0,  # singleton [5]: no comparison, 0 like a constant segment
            (0 - m00) / (s00 + EPS),
            (1 - m00) / (s00 + EPS),
            0.0,  # constant [2, 2]
            -1.5 / (s11 + EPS),
            0.0,
            1.5 / (s11 + EPS),
        ]
    )
    close(normalise_agent(values, group_ids=groups, agent_ids=agents).values, expected)


def test_none_is_identity():
    values = torch.tensor([3.0, -1.0, 0.5])
    out = normalise_none(values, group_ids=torch.zeros(3, dtype=torch.long))
    assert torch.equal(out.values, values.double())
    assert torch.equal(out.mean, torch.zeros(3, dtype=torch.float64)) and torch.equal(out.std, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["global", "group", "group_batch_std", "agent"])
def test_singleton_segment_gives_zero(kind):
    """A segment of one value gets 0 (mean = the value, std 0), like a zero-variance segment;
    verl would give mean 0, std 1 and return 0.7 / (1 + eps).  eps = 0.5 would show that."""
    ids = torch.tensor([0, 1, 1])
    out = NORMALISERS[kind](torch.tensor([0.7, 2.0, 4.0]), group_ids=ids, agent_ids=torch.zeros(3, dtype=torch.long), eps=0.5)
    if kind != "global":  # global pools all three values
        assert out.values[0].item() == 0.0 and out.mean[0].item() == pytest.approx(0.7)
    assert out.count[0].item() == (3 if kind == "global" else 1)
    for scale in (True, False):
        lone = normalise_global(torch.tensor([0.7]), scale_by_std=scale)
        assert lone.values.item() == 0.0 and lone.std.item() == 0.0


@pytest.mark.parametrize("kind", ["global", "group", "group_batch_std", "agent"])
@pytest.mark.parametrize("eps", [1e-6, 1e-300])
def test_constant_segments_give_exact_zero(kind, eps):
    """0.9 x 3 leaves float32 rounding residue in a naive mean; here the result is exactly 0
    (and not huge with a tiny eps)."""
    values = torch.full((6,), 0.9)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    out = NORMALISERS[kind](values, group_ids=ids, agent_ids=torch.zeros(6, dtype=torch.long), eps=eps)
    assert torch.equal(out.values, torch.zeros(6, dtype=torch.float64))
    naive = (values[:3] - values[:3].mean()) / (values[:3].std() + 1e-6)
    assert naive.abs().max() > 1e-3  # the case is a real trap for a float32 implementation


@pytest.mark.parametrize("seed", range(4))
def test_agent_normaliser_is_shift_invariant_per_agent(seed):
    """Adding c_k to every value of agent k (and c_(b,k) per task) leaves the result unchanged;
    the group normaliser is not invariant to that.  Singleton segments give 0 either way."""
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
        assert torch.equal(out.values[~many], torch.zeros_like(out.values[~many]))
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


def test_results_are_float64_whatever_the_input():
    """Credit arithmetic is float64 end to end; only run_credit rounds (once)."""
    v64 = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    for fn in NORMALISERS.values():
        for v in (v64, v64.float(), torch.tensor([1, 2, 4])):
            out = fn(v, group_ids=torch.tensor([0, 0, 1]), agent_ids=torch.zeros(3, dtype=torch.long))
            assert out.values.dtype == out.mean.dtype == out.std.dtype == torch.float64


def test_missing_ids_and_unknown_name_are_errors():
    with pytest.raises(ValueError, match="group_ids"):
        normalise_group(torch.ones(2))
    with pytest.raises(ValueError, match="agent_ids"):
        normalise_agent(torch.ones(2), group_ids=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\['agent', 'global', 'group', 'group_batch_std', 'none'\]"):
        get_normaliser("batch")


def test_normaliser_names():
    assert sorted(NORMALISER_NAMES) == sorted(NORMALISERS) == ["agent", "global", "group", "group_batch_std", "none"]


def _two_task_batch():
    """Task 0: episodes [a, b, a] (R=1) and [b] (R=0); task 1: [a] (R=2), [] (R=4, no turns)."""
    g0 = make_group([["a", "b", "a"], ["b"]], [1.0, 0.0], group_id=0)
    g1 = make_group([["a"], []], [2.0, 4.0], group_id=1)
    return build_credit_batch([g0, g1], ["a", "b"])


def test_normalise_credit_levels_by_hand():
    """Per-turn scores x = [1, 2, 3, 4, 5] (turns: a b a | b | a), episode scores s = [2, 4, 5, 7]."""
    batch = _two_task_batch()
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    s = torch.tensor([2.0, 4.0, 5.0, 7.0], dtype=torch.float64)
    scores = RawScores(turn=x, episode=s)

    none = normalise_credit(batch, scores, "none")
    assert torch.equal(none.values, x) and torch.equal(none.episode_values, s)

    # group: task 0 over episodes {2, 4}: mean 3, std sqrt(2); task 1 over {5, 7} (the turn-less
    # episode counts): mean 6, std sqrt(2); each turn gets its episode's value
    r2 = math.sqrt(2)
    grp = normalise_credit(batch, scores, "group")
    e_adv = [-1 / (r2 + EPS), 1 / (r2 + EPS), -1 / (r2 + EPS), 1 / (r2 + EPS)]
    torch.testing.assert_close(grp.episode_values, torch.tensor(e_adv, dtype=torch.float64))
    torch.testing.assert_close(grp.values, torch.tensor([e_adv[0]] * 3 + [e_adv[1], e_adv[2]], dtype=torch.float64))
    assert grp.count.tolist() == [2, 2, 2, 2, 2]

    # global: all five turns, mean 3, std sqrt(10/4); the turn-less episode contributes nothing
    sd = math.sqrt(10 / 4)
    glob = normalise_credit(batch, scores, "global", scale_by_std=False)
    torch.testing.assert_close(glob.values, x - 3)
    torch.testing.assert_close(normalise_credit(batch, scores, "global").values, (x - 3) / (sd + EPS))
    assert glob.count.tolist() == [5] * 5 and glob.episode_values is None

    # agent: (task 0, a) = {1, 3}: mean 2, std sqrt(2); (task 0, b) = {2, 4}: mean 3, std sqrt(2);
    # (task 1, a) = {5}: singleton, 0
    agent = normalise_credit(batch, scores, "agent")
    expected = [-1 / (r2 + EPS), -1 / (r2 + EPS), 1 / (r2 + EPS), 1 / (r2 + EPS), 0.0]
    torch.testing.assert_close(agent.values, torch.tensor(expected, dtype=torch.float64))
    assert agent.count.tolist() == [2, 2, 2, 2, 1] and agent.episode_values is None


def test_normalise_credit_errors():
    batch = _two_task_batch()
    good = RawScores(turn=torch.zeros(5, dtype=torch.float64), episode=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"valid: \['agent', 'global', 'group', 'group_batch_std', 'none'\]"):
        normalise_credit(batch, good, "batch")
    with pytest.raises(ValueError, match="expected"):
        normalise_credit(batch, RawScores(turn=torch.zeros(4), episode=torch.zeros(4)), "none")
    with pytest.raises(ValueError, match="expected"):
        normalise_credit(batch, RawScores(turn=torch.zeros(5), episode=torch.zeros(3)), "group")
