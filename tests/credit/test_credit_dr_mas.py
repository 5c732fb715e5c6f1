"""Dr. MAS agent-wise normalisation: hand-derived examples and the [T] properties of CREDIT_SPEC §2.7."""

from __future__ import annotations

import math
import random

import pytest
import torch
from credit_reference import make_group, random_groups

from mas.credit import build_credit_batch, run_credit
from mas.credit.baselines import GRPOConfig
from mas.credit.dr_mas import DrMasConfig

EPS = 1e-6


def _heterogeneous_search_batch():
    """The spec's example: one successful rollout with 3 search calls, three failed ones with 1.

    Turn order: [search, search, search, answer] (R=1), then [search, answer] x 3 (R=0).
    """
    groups = [make_group([["search", "search", "search", "answer"]] + [["search", "answer"]] * 3, [1.0, 0.0, 0.0, 0.0])]
    return build_credit_batch(groups, ["search", "answer"])


def test_dr_mas_differs_from_grpo_under_invocation_heterogeneity():
    """[T] §10 row 7: mu_search = (1+1+1+0+0+0)/6 = 0.5, while the trajectory mean = 1/4."""
    batch = _heterogeneous_search_batch()
    dr = run_credit(batch, DrMasConfig())
    gr = run_credit(batch, GRPOConfig())
    search = batch.agent_ids == 0
    answer = batch.agent_ids == 1

    mu_search = (1 + 1 + 1 + 0 + 0 + 0) / 6  # 0.5
    sd_search = math.sqrt((3 * 0.5**2 + 3 * 0.5**2) / 5)  # sqrt(0.3)
    mu_answer = 1 / 4
    sd_answer = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)  # 0.5
    mu_traj, sd_traj = 1 / 4, 0.5  # GRPO over the four trajectories [1, 0, 0, 0]

    assert torch.allclose(dr.breakdown["baseline_mean"][search], torch.tensor(mu_search))
    assert torch.allclose(gr.breakdown["baseline_mean"][search], torch.tensor(mu_traj))
    R = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # reward of each flattened turn
    ag = ["s", "s", "s", "a", "s", "a", "s", "a", "s", "a"]
    expected_dr = [(r - mu_search) / (sd_search + EPS) if k == "s" else (r - mu_answer) / (sd_answer + EPS) for r, k in zip(R, ag)]
    expected_gr = [(r - mu_traj) / (sd_traj + EPS) for r in R]
    torch.testing.assert_close(dr.advantages, torch.tensor(expected_dr))
    torch.testing.assert_close(gr.advantages, torch.tensor(expected_gr))
    # the once-per-rollout agent gets GRPO's credit; the search agent does not
    torch.testing.assert_close(dr.advantages[answer], gr.advantages[answer])
    assert not torch.allclose(dr.advantages[search], gr.advantages[search])


def test_dr_mas_invalid_penalty_hits_that_row_only():
    """Per-row reward R - p*invalid_t (DrMAS apply_invalid_action_penalty)."""
    p = 0.1
    # episode 0: R=1, [a (invalid), b]; episode 1: R=1, [a, b]
    groups = [make_group([["a", "b"], ["a", "b"]], [1.0, 1.0], invalid={0: (0,)})]
    batch = build_credit_batch(groups, ["a", "b"])
    credit = run_credit(batch, DrMasConfig(invalid_penalty=p))
    mu_a = ((1 - p) + 1) / 2
    sd_a = math.sqrt(((1 - p - mu_a) ** 2 + (1 - mu_a) ** 2) / 1)
    expected = torch.tensor([(1 - p - mu_a) / (sd_a + EPS), 0.0, (1 - mu_a) / (sd_a + EPS), 0.0])  # b's rows are equal: 0
    torch.testing.assert_close(credit.advantages, expected)
    torch.testing.assert_close(credit.breakdown["turn_reward"], torch.tensor([1 - p, 1.0, 1.0, 1.0]))
    assert DrMasConfig().invalid_penalty == 0.1  # the DrMAS run-script value


@pytest.mark.parametrize("seed", range(6))
def test_dr_mas_mean_zero_std_one_per_task_and_agent(seed):
    """[T] §10 row 5, with variable invocation counts (random agent per turn)."""
    agents = ["planner", "search", "answer"]
    groups = random_groups(seed, 4, 5, 6, agents, min_turns=1)
    batch = build_credit_batch(groups, agents)
    credit = run_credit(batch, DrMasConfig())
    seen_repeat = False
    for b in range(len(groups)):
        for k in range(len(agents)):
            sel = (batch.group_ids == b) & (batch.agent_ids == k)  # [N]
            if int(sel.sum()) < 2:
                continue
            per_episode = torch.bincount(batch.episode_ids[sel])
            seen_repeat |= bool((per_episode > 1).any())
            a = credit.advantages[sel].double()
            r = credit.breakdown["turn_reward"][sel].double()
            if float(r.max() - r.min()) == 0.0:
                assert torch.equal(a, torch.zeros_like(a))
                continue
            assert abs(float(a.mean())) < 1e-5
            assert float(a.std()) == pytest.approx(1.0, abs=1e-4)
    assert seen_repeat, "the random batch should invoke some agent several times in one episode"


@pytest.mark.parametrize("seed", range(4))
def test_dr_mas_equals_grpo_when_each_agent_acts_once(seed):
    """[T] §10 row 6: each agent acts exactly once per rollout (in any order), shared reward."""
    rng = random.Random(seed)
    agents = ["planner", "search", "answer"]
    groups = []
    for b in range(3):
        orders = [rng.sample(agents, len(agents)) for _ in range(5)]
        rewards = [rng.choice([0.0, 0.25, 1.0]) if b else rng.uniform(0, 1) for _ in range(5)]
        groups.append(make_group(orders, rewards, group_id=b))
    batch = build_credit_batch(groups, agents)
    torch.testing.assert_close(run_credit(batch, DrMasConfig()).advantages, run_credit(batch, GRPOConfig()).advantages)
    torch.testing.assert_close(
        run_credit(batch, DrMasConfig(scale_by_std=False)).advantages, run_credit(batch, GRPOConfig(scale_by_std=False)).advantages
    )


def test_dr_mas_per_agent_shift_invariance():
    """[T] §10 row 8: shifting all of agent k's rewards by c_k leaves A unchanged.

    The shift is made by marking every turn of 'search' invalid with penalty p (c = -p);
    GRPO, which averages the penalty per rollout, is *not* invariant to it."""
    p = 0.37
    base = [["search", "search", "search", "answer"], ["search", "answer"], ["answer", "search"], ["search", "search", "answer"]]
    rewards = [1.0, 0.0, 1.0, 0.0]
    invalid = {i: tuple(t for t, a in enumerate(ep) if a == "search") for i, ep in enumerate(base)}
    clean = build_credit_batch([make_group(base, rewards)], ["search", "answer"])
    shifted = build_credit_batch([make_group(base, rewards, invalid=invalid)], ["search", "answer"])
    torch.testing.assert_close(
        run_credit(shifted, DrMasConfig(invalid_penalty=p)).advantages, run_credit(clean, DrMasConfig(invalid_penalty=p)).advantages
    )
    assert not torch.allclose(
        run_credit(shifted, GRPOConfig(invalid_penalty=p)).advantages, run_credit(clean, GRPOConfig(invalid_penalty=p)).advantages
    )


def test_dr_mas_singleton_agent_group_gives_zero():
    """[T] §10 row 9, fixed deliberately: an agent with one turn in the task has no comparison,
    so it gets 0 like a zero-variance set (verl's mean 0, std 1 would return 0.7 / (1 + eps))."""
    groups = [make_group([["solver", "verifier"], ["solver"], ["solver"]], [0.8, 0.0, 1.0], invalid={0: (1,)})]
    batch = build_credit_batch(groups, ["solver", "verifier"])
    for cfg in (DrMasConfig(), DrMasConfig(eps=0.5), DrMasConfig(scale_by_std=False)):
        credit = run_credit(batch, cfg, dtype=torch.float64)
        # verifier row: R - 0.1 = 0.7, alone in its (task, agent) set -> 0, with mean 0.7 and std 0 reported
        assert credit.advantages[1].item() == 0.0
        assert credit.breakdown["baseline_count"][1].item() == 1
        assert credit.breakdown["baseline_mean"][1].item() == pytest.approx(0.7) and credit.breakdown["baseline_std"][1].item() == 0.0


def test_dr_mas_tasks_are_separate():
    """The same agent in two tasks: statistics are per (task, agent), not per agent."""
    g0 = make_group([["a"], ["a"]], [1.0, 0.0], group_id=0)
    g1 = make_group([["a"], ["a"], ["a"]], [5.0, 5.0, 6.0], group_id=1)
    credit = run_credit(build_credit_batch([g0, g1], ["a"]), DrMasConfig())
    s0 = math.sqrt(0.5)
    m1, s1 = 16 / 3, math.sqrt((2 * (1 / 3) ** 2 + (2 / 3) ** 2) / 2)
    expected = [0.5 / (s0 + EPS), -0.5 / (s0 + EPS), (5 - m1) / (s1 + EPS), (5 - m1) / (s1 + EPS), (6 - m1) / (s1 + EPS)]
    torch.testing.assert_close(credit.advantages, torch.tensor(expected))


def test_dr_mas_identical_rewards_give_exact_zeros():
    groups = [make_group([["a", "b", "a"], ["b", "a"], ["a"]], [0.9, 0.9, 0.9])]
    batch = build_credit_batch(groups, ["a", "b"])
    for cfg in (DrMasConfig(), DrMasConfig(eps=1e-300), DrMasConfig(scale_by_std=False)):
        assert torch.equal(run_credit(batch, cfg).advantages, torch.zeros(batch.num_turns))


def test_dr_mas_breakdown():
    batch = _heterogeneous_search_batch()
    bd = run_credit(batch, DrMasConfig()).breakdown
    assert set(bd) >= {"turn_reward", "baseline_mean", "baseline_std", "baseline_count"}
    assert bd["baseline_count"].tolist() == [6, 6, 6, 4, 6, 4, 6, 4, 6, 4]  # |Y_search| = 6, |Y_answer| = 4
    torch.testing.assert_close(bd["baseline_std"][0], torch.tensor(math.sqrt(0.3)))
