"""GRPO, Dr. GRPO and RLOO: hand-derived examples and the [T] properties of CREDIT_SPEC §1.1–1.3."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError
import torch
from credit_reference import make_group, random_groups

from mas.credit import build_credit_batch, run_credit
from mas.credit.baselines import DrGRPOConfig, GRPOConfig, RLOOConfig

EPS = 1e-6


def _one_turn_group(rewards, agent="solver"):
    """One task, one single-turn episode per reward."""
    return build_credit_batch([make_group([[agent]] * len(rewards), rewards)], [agent])


# --- hand-derived 1x4 example: R = [1, 0, 0, 1] ----------------------------------------------


def test_grpo_hand_1x4():
    batch = _one_turn_group([1.0, 0.0, 0.0, 1.0])
    mean = (1 + 0 + 0 + 1) / 4  # 1/2
    std = math.sqrt(4 * (1 / 2) ** 2 / (4 - 1))  # ddof = 1: sqrt(1/3)
    expected = torch.tensor([(1 - mean) / (std + EPS), (0 - mean) / (std + EPS), (0 - mean) / (std + EPS), (1 - mean) / (std + EPS)])
    credit = run_credit(batch, GRPOConfig())
    torch.testing.assert_close(credit.advantages, expected)
    torch.testing.assert_close(credit.breakdown["baseline_mean"], torch.full((4,), mean))
    torch.testing.assert_close(credit.breakdown["baseline_std"], torch.full((4,), std))


def test_dr_grpo_hand_1x4():
    credit = run_credit(_one_turn_group([1.0, 0.0, 0.0, 1.0]), DrGRPOConfig())
    torch.testing.assert_close(credit.advantages, torch.tensor([0.5, -0.5, -0.5, 0.5]))  # R - 1/2


def test_rloo_hand_1x4():
    credit = run_credit(_one_turn_group([1.0, 0.0, 0.0, 1.0]), RLOOConfig())
    # R_i - mean of the other three: 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3
    torch.testing.assert_close(credit.advantages, torch.tensor([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3]))
    torch.testing.assert_close(credit.breakdown["baseline_mean"], torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))


def test_advantage_is_broadcast_to_every_turn_of_the_episode():
    """Episodes of 3, 1 and 2 turns by different agents: each turn gets its episode's value."""
    groups = [make_group([["a", "b", "a"], ["b"], ["a", "a"]], [1.0, 0.0, 0.5])]
    batch = build_credit_batch(groups, ["a", "b"])
    mean, std = 0.5, math.sqrt((0.5**2 + 0.5**2 + 0) / 2)  # std = 0.5
    a = [(1.0 - mean) / (std + EPS), (0.0 - mean) / (std + EPS), 0.0]
    expected = torch.tensor([a[0]] * 3 + [a[1]] + [a[2]] * 2)
    torch.testing.assert_close(run_credit(batch, GRPOConfig()).advantages, expected)


def test_grpo_invalid_penalty_is_averaged_over_the_rollout():
    """DrMAS 'vanilla GRPO': per-row rewards R - p*invalid, averaged into one trajectory score."""
    p = 0.2
    # episode 0: R=1, turns [valid, invalid]  -> s0 = (1 + (1 - p)) / 2 = 1 - p/2
    # episode 1: R=1, turns [valid]           -> s1 = 1
    # episode 2: R=0, turns [invalid, invalid, invalid] -> s2 = -p
    groups = [make_group([["a", "b"], ["a"], ["a", "b", "a"]], [1.0, 1.0, 0.0], invalid={0: (1,), 2: (0, 1, 2)})]
    batch = build_credit_batch(groups, ["a", "b"])
    s = [1 - p / 2, 1.0, -p]
    mean = sum(s) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in s) / 2)
    a = [(x - mean) / (std + EPS) for x in s]
    credit = run_credit(batch, GRPOConfig(invalid_penalty=p))
    torch.testing.assert_close(credit.advantages, torch.tensor([a[0], a[0], a[1], a[2], a[2], a[2]]))
    torch.testing.assert_close(credit.breakdown["episode_score"], torch.tensor(s))
    torch.testing.assert_close(credit.breakdown["turn_reward"], torch.tensor([1.0, 1 - p, 1.0, -p, -p, -p]))
    # default penalty is 0: the invalid turns change nothing
    torch.testing.assert_close(run_credit(batch, GRPOConfig()).advantages, run_credit(_one_turn_group([1.0, 1.0, 0.0]), GRPOConfig()).advantages[[0, 0, 1, 2, 2, 2]])


def test_episode_without_turns_counts_in_its_group():
    """A turn-less (failed) episode still is one of the G samples of its group."""
    groups = [make_group([["a"], [], ["a"]], [1.0, 0.0, 0.0])]
    batch = build_credit_batch(groups, ["a"])
    mean, std = 1 / 3, math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    expected = torch.tensor([(1 - mean) / (std + EPS), (0 - mean) / (std + EPS)])
    torch.testing.assert_close(run_credit(batch, GRPOConfig()).advantages, expected)


# --- [T] properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [GRPOConfig(), DrGRPOConfig(), RLOOConfig(), GRPOConfig(eps=1e-300)], ids=["grpo", "dr_grpo", "rloo", "grpo-tiny-eps"])
@pytest.mark.parametrize("value", [0.9, 0.3, 1.0, 0.0])
def test_identical_rewards_give_exact_zeros(cfg, value):
    """[T] §10 row 1.  0.9 x 3 and 0.3 x 7 leave float32 rounding residue in a naive mean,
    which a naive (x - mean)/(std + eps) blows up to about 0.06."""
    for n in (3, 6, 7):
        credit = run_credit(_one_turn_group([value] * n), cfg)
        assert torch.equal(credit.advantages, torch.zeros(n)), credit.advantages


def test_identical_scores_after_penalty_give_zeros():
    groups = [make_group([["a", "a"], ["a", "a"], ["a", "a"]], [0.9, 0.9, 0.9], invalid={0: (0,), 1: (1,), 2: (0,)})]
    for cfg in (GRPOConfig(invalid_penalty=0.1), DrGRPOConfig(invalid_penalty=0.1), RLOOConfig(invalid_penalty=0.1)):
        assert torch.equal(run_credit(build_credit_batch(groups, ["a"]), cfg).advantages, torch.zeros(6))


@pytest.mark.parametrize("seed", range(5))
def test_grpo_mean_zero_std_one_per_group(seed):
    """[T] §10 row 2, over the episodes of each non-degenerate group (one value per episode)."""
    groups = random_groups(seed, 4, 6, 4, ["a", "b"], min_turns=1)
    batch = build_credit_batch(groups, ["a", "b"])
    credit = run_credit(batch, GRPOConfig(invalid_penalty=0.1))
    adv_e = credit.breakdown["episode_advantage"]  # [E]
    for b in range(len(groups)):
        a = adv_e[batch.episode_group_ids == b].double()
        score = credit.breakdown["episode_score"][batch.episode_group_ids == b].double()
        assert abs(float(a.mean())) < 1e-5
        if float(score.std()) > 1e-3:
            assert float(a.std()) == pytest.approx(1.0, abs=1e-4)
        else:
            assert torch.equal(a, torch.zeros_like(a))
    # the turn advantages are the episode advantages broadcast
    torch.testing.assert_close(credit.advantages, adv_e[batch.episode_ids])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ragged", [False, True])
def test_rloo_is_scaled_dr_grpo_and_sums_to_zero(seed, ragged):
    """[T] §10 row 3: RLOO = G/(G-1) * Dr. GRPO per episode; RLOO sums to 0 over a group."""
    groups = random_groups(seed, 5, 5, 3, ["a", "b"], ragged_groups=ragged, min_turns=1)
    batch = build_credit_batch(groups, ["a", "b"])
    rloo_e = run_credit(batch, RLOOConfig(invalid_penalty=0.1)).breakdown["episode_advantage"]  # [E]
    dr_e = run_credit(batch, DrGRPOConfig(invalid_penalty=0.1)).breakdown["episode_advantage"]  # [E]
    for b, g in enumerate(groups):
        sel = batch.episode_group_ids == b
        G = len(g.episodes)
        if G == 1:
            continue  # RLOO is 0 there by definition; tested below
        torch.testing.assert_close(rloo_e[sel], G / (G - 1) * dr_e[sel])
        assert abs(float(rloo_e[sel].double().sum())) < 1e-5


def test_dr_grpo_equals_grpo_without_std():
    groups = random_groups(11, 4, 5, 4, ["a", "b", "c"], ragged_groups=True)
    batch = build_credit_batch(groups, ["a", "b", "c"])
    torch.testing.assert_close(
        run_credit(batch, DrGRPOConfig(invalid_penalty=0.3)).advantages,
        run_credit(batch, GRPOConfig(scale_by_std=False, invalid_penalty=0.3)).advantages,
    )


def test_singleton_group_gives_zero():
    """A group of one episode has no comparison: 0, like a zero-variance group (verl would
    return R/(1 + eps)); mean = the value, std = 0 in the breakdown.  eps = 0.5 would make a
    (std = 1) + eps denominator visible."""
    batch = _one_turn_group([0.7])
    for cfg in (GRPOConfig(), GRPOConfig(eps=0.5), DrGRPOConfig(), RLOOConfig()):
        credit = run_credit(batch, cfg, dtype=torch.float64)
        assert torch.equal(credit.advantages, torch.zeros(1, dtype=torch.float64)), cfg
    grpo = run_credit(batch, GRPOConfig(), dtype=torch.float64).breakdown
    assert grpo["norm_mean"].tolist() == [0.7] and grpo["norm_std"].tolist() == [0.0]


@pytest.mark.parametrize("cls", [GRPOConfig, DrGRPOConfig, RLOOConfig])
def test_eps_zero_is_a_config_error(cls):
    with pytest.raises(ValidationError, match="greater than 0"):
        cls(eps=0.0)


def test_groups_are_normalised_separately():
    """Two tasks: task 1's rewards (shifted by +10) do not change task 0's advantages."""
    g0 = make_group([["a"]] * 3, [1.0, 0.0, 0.5], group_id=0)
    g1 = make_group([["a"]] * 3, [11.0, 10.0, 10.0], group_id=1)
    both = run_credit(build_credit_batch([g0, g1], ["a"]), GRPOConfig()).advantages
    alone = run_credit(build_credit_batch([g0], ["a"]), GRPOConfig()).advantages
    torch.testing.assert_close(both[:3], alone)
    m1, s1 = 31 / 3, math.sqrt(((11 - 31 / 3) ** 2 + 2 * (10 - 31 / 3) ** 2) / 2)
    torch.testing.assert_close(both[3:], torch.tensor([(11 - m1) / (s1 + EPS), (10 - m1) / (s1 + EPS), (10 - m1) / (s1 + EPS)]))


def test_breakdown_shapes():
    groups = random_groups(3, 3, 4, 5, ["a", "b"], min_turns=1)  # seed 3, B=3, G=4
    batch = build_credit_batch(groups, ["a", "b"])
    N, E = batch.num_turns, batch.num_episodes
    for cfg in (GRPOConfig(), DrGRPOConfig(), RLOOConfig()):
        bd = run_credit(batch, cfg).breakdown
        assert bd["turn_reward"].shape == (N,) and bd["baseline_mean"].shape == (N,)
        assert bd["episode_score"].shape == (E,) and bd["episode_advantage"].shape == (E,)
        assert bd["baseline_count"].tolist() == [4] * N
