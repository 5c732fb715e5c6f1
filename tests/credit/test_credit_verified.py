"""Verified credit (credit/verified.py): hand-derived values, the slow-loop reference, and its properties.

    R^{i,n} = R_i − p · invalid_n;   r_n = w · v_n + (1 − w) · R^{i,n} where a verifier scored n, else R^{i,n}
    A_n = (r_n − μ_{b,k}) / (σ_{b,k} + ε)   (Dr. MAS: per task group and agent, ddof 1)
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from credit_reference import make_group, random_groups, ref_apply, ref_mean_std

from mas.credit import build_credit_batch, plan_credit, run_credit
from mas.credit.dr_mas import DrMasConfig
from mas.credit.registry import followup_credit
from mas.credit.verified import VerifiedConfig
from mas.envs.math.synthetic import make_task
from mas.envs.math.turns import verify_math_turn
from mas.types import Episode, EpisodeGroup, Task, Turn

EPS = 1e-6


def _score(groups, scores: dict[tuple[int, int, int], float]) -> None:
    """Give turn (group b, episode i, turn t) the verifier score ``scores[(b, i, t)]``."""
    for (b, i, t), v in scores.items():
        groups[b].episodes[i].turns[t].extra_rewards["verified"] = v


def _with_random_scores(groups, seed: int, p: float = 0.6) -> None:
    rng = random.Random(seed)
    for g in groups:
        for ep in g.episodes:
            for t in ep.turns:
                if rng.random() < p:
                    t.extra_rewards["verified"] = rng.choice([0.0, 1.0, rng.random()])


def ref_verified(groups: list[EpisodeGroup], w: float, invalid_penalty: float = 0.1, scale_by_std: bool = True,
                 eps: float = EPS) -> list[float]:
    """The formula as loops: per group, per agent, over all that agent's turns."""
    adv: dict[tuple[int, int, int], float] = {}
    for b, g in enumerate(groups):
        rows: dict[str, list[tuple[int, int, float]]] = {}
        for i, ep in enumerate(g.episodes):
            for t, turn in enumerate(ep.turns):
                outcome = ep.reward - invalid_penalty * (0.0 if turn.valid else 1.0)
                v = turn.extra_rewards.get("verified")
                r = outcome if v is None else w * v + (1 - w) * outcome
                rows.setdefault(turn.agent, []).append((i, t, r))
        for lst in rows.values():
            mu, sd = ref_mean_std([r for *_, r in lst])
            for i, t, r in lst:
                adv[(b, i, t)] = ref_apply(r, mu, sd, scale_by_std, eps)
    return [adv[(b, i, t)] for b, g in enumerate(groups) for i, ep in enumerate(g.episodes) for t in range(len(ep.turns))]


def test_hand_derived_one_group_of_four():
    """Two agents; R = [1, 0, 1, 0]; w = 0.5.  The solver's verifier scores are [1, 1, 0, 0]; the
    checker's turns have none, so they keep the outcome alone."""
    groups = [make_group([["solver", "checker"]] * 4, [1.0, 0.0, 1.0, 0.0])]
    _score(groups, {(0, 0, 0): 1.0, (0, 1, 0): 1.0, (0, 2, 0): 0.0, (0, 3, 0): 0.0})
    batch = build_credit_batch(groups, ["solver", "checker"])
    credit = run_credit(batch, VerifiedConfig(weight=0.5))
    # solver: r = 0.5 * v + 0.5 * R = [1, 0.5, 0.5, 0]; mean 0.5, ddof-1 std sqrt((0.25 + 0 + 0 + 0.25) / 3)
    r_solver = [1.0, 0.5, 0.5, 0.0]
    sd = math.sqrt(0.5 / 3)
    want_solver = [(r - 0.5) / (sd + EPS) for r in r_solver]
    # checker: r = R = [1, 0, 1, 0]; mean 0.5, std sqrt(1 / 3)
    want_checker = [(r - 0.5) / (math.sqrt(1 / 3) + EPS) for r in (1.0, 0.0, 1.0, 0.0)]
    want = [x for pair in zip(want_solver, want_checker) for x in pair]
    torch.testing.assert_close(credit.advantages, torch.tensor(want, dtype=torch.float32))
    torch.testing.assert_close(credit.breakdown["turn_reward"][0::2], torch.tensor(r_solver))
    assert credit.breakdown["verified"].tolist() == [True, False] * 4
    assert float(credit.breakdown["verified_share"]) == 0.5
    # the solver's episode 2 (v = 0, R = 1) and 1 (v = 1, R = 0) tie: the verifier and the outcome each count half
    assert credit.advantages[2] == credit.advantages[4]


@pytest.mark.parametrize("normaliser", ["agent", "group", "global", "none", "group_batch_std"])
@pytest.mark.parametrize("penalty", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("seed", range(4))
def test_weight_zero_is_dr_mas_exactly(normaliser, penalty, seed):
    """[T] w = 0 equals dr_mas bit for bit, with the same normaliser, penalty, eps and scale_by_std."""
    groups = random_groups(seed, num_groups=3, group_size=4, max_turns=5, agent_names=["a", "b", "c"], ragged_groups=True)
    _with_random_scores(groups, seed)
    batch = build_credit_batch(groups, ["a", "b", "c"])
    for scale in (True, False):
        got = run_credit(batch, VerifiedConfig(weight=0.0, normaliser=normaliser, invalid_penalty=penalty, scale_by_std=scale))
        want = run_credit(batch, DrMasConfig(normaliser=normaliser, invalid_penalty=penalty, scale_by_std=scale))
        assert torch.equal(got.advantages, want.advantages)
        assert torch.equal(got.breakdown["turn_reward"], want.breakdown["turn_reward"])
        assert torch.equal(got.breakdown["episode_score"], want.breakdown["episode_score"])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("w", [0.0, 0.3, 0.5, 1.0])
def test_vectorised_matches_the_slow_loop(seed, w):
    """[T] the batch computation equals the formula written as loops, ragged batches included."""
    rng = random.Random(seed)
    groups = random_groups(seed, num_groups=rng.randint(1, 4), group_size=rng.randint(1, 6), max_turns=6,
                           agent_names=["a", "b", "c", "d"], ragged_groups=True)
    _with_random_scores(groups, seed + 100, p=rng.random())
    batch = build_credit_batch(groups, ["a", "b", "c", "d"])
    got = run_credit(batch, VerifiedConfig(weight=w))
    torch.testing.assert_close(got.advantages, torch.tensor(ref_verified(groups, w), dtype=torch.float32), atol=1e-5, rtol=1e-5)


def test_a_turn_without_a_score_gets_the_outcome_alone():
    groups = [make_group([["a"], ["a"], ["a"]], [1.0, 0.0, 1.0])]
    _score(groups, {(0, 1, 0): 1.0})
    credit = run_credit(build_credit_batch(groups, ["a"]), VerifiedConfig(weight=0.5))
    assert credit.breakdown["turn_reward"].tolist() == [1.0, 0.5, 1.0]  # only the scored turn mixes


def test_weight_below_one_keeps_the_team_outcome_in_every_scored_turn():
    """Same verifier score, different outcomes: with w < 1 the better team outcome still earns more;
    with w = 1 only the verifier counts."""
    groups = [make_group([["a"], ["a"]], [1.0, 0.0])]
    _score(groups, {(0, 0, 0): 1.0, (0, 1, 0): 1.0})
    batch = build_credit_batch(groups, ["a"])
    half = run_credit(batch, VerifiedConfig(weight=0.5)).advantages
    assert half[0] > half[1]
    assert run_credit(batch, VerifiedConfig(weight=1.0)).advantages.tolist() == [0.0, 0.0]


def test_another_agents_scores_never_change_a_turns_credit():
    """[T] with the agent normaliser, the helper's verifier scores leave the lead's advantages alone."""
    groups = random_groups(3, num_groups=2, group_size=4, max_turns=4, agent_names=["lead", "helper"], min_turns=1)
    batch = build_credit_batch(groups, ["lead", "helper"])
    before = run_credit(batch, VerifiedConfig())
    for g in groups:
        for ep in g.episodes:
            for t in ep.turns:
                if t.agent == "helper":
                    t.extra_rewards["verified"] = 1.0
    after = run_credit(build_credit_batch(groups, ["lead", "helper"]), VerifiedConfig())
    lead = batch.agent_ids == 0
    assert torch.equal(before.advantages[lead], after.advantages[lead])
    assert not torch.equal(before.advantages[~lead], after.advantages[~lead]) or bool((~lead).sum() < 2)


def test_a_segment_of_one_value_gives_zero():
    groups = [make_group([["a", "b"], ["a"]], [1.0, 0.0])]
    _score(groups, {(0, 0, 1): 1.0})
    credit = run_credit(build_credit_batch(groups, ["a", "b"]), VerifiedConfig())
    assert credit.advantages[1].item() == 0.0  # b spoke once in its group


# --- the gaming cases, through the real arithmetic verifier -------------------------------------------


def _orchestrated(task: Task, call: str, reply: str, answer: str, reward: float) -> Episode:
    """orchestrator CALLs ``call`` -> adder replies ``reply`` -> orchestrator answers ``answer``."""
    callee, sub = call.split(": ", 1)
    turns = [
        Turn("orchestrator", "p", 0, None, [], [1], [2], [0.0], f"CALL {call}", parsed={"call": callee, "subtask": sub, "label": "call"}),
        Turn("adder", "q", 1, 0, [], [1], [2], [0.0], f"ANSWER: {reply}", parsed={"answer": reply, "label": "answer"}),
        Turn("orchestrator", "p", 2, None, [], [1], [2], [0.0], f"ANSWER: {answer}", parsed={"answer": answer, "label": "answer"}),
    ]
    ep = Episode(task=task, group_id=0, sample_id=0, seed=0, turns=turns, reward=reward)
    for t in turns:
        v = verify_math_turn(ep, t)
        if v is not None:
            t.extra_rewards["verified"] = v
    return ep


def test_a_specialist_right_about_a_wrong_question_is_rewarded_and_the_call_is_not():
    """The orchestrator miscopies 7+5 as 7+6; the adder answers 13, right for what it was asked."""
    task = make_task([7, 5], ["+"])
    bad = _orchestrated(task, "adder: 7+6", "13", "13", 0.0)
    good = _orchestrated(task, "adder: 7+5", "12", "12", 1.0)
    # the call is no step of the task; the adder's 13 is right for 7+6; answering 13 copies a result the
    # conversation never established (only a correctly asked step advances it), so it is checked against 12
    assert [t.extra_rewards["verified"] for t in bad.turns] == [0.0, 1.0, 0.0]
    credit = run_credit(build_credit_batch([EpisodeGroup(task, [bad, good])], ["orchestrator", "adder"]), VerifiedConfig())
    r = credit.breakdown["turn_reward"].tolist()
    assert r[1] == 0.5 * 1.0 + 0.5 * 0.0  # the adder's turn: its own job done, the team lost
    assert r[0] == 0.0  # the miscopied call: no verifier credit, no outcome
    # the adder did its job in both episodes: its two turns differ only by the outcome
    assert credit.advantages[1] < credit.advantages[4]


def test_repeating_the_tasks_numbers_without_a_step_earns_nothing():
    task = make_task([3, 4, 2], ["+", "-"])
    ep = _orchestrated(task, "adder: 3+4-2", "5", "5", 1.0)  # the whole task as a "step"
    assert ep.turns[0].extra_rewards["verified"] == 0.0
    echo = Turn("solver", "p", 0, None, [], [1], [2], [0.0], "3+4-2", parsed={"answer": "3+4-2", "label": "answer"})
    assert verify_math_turn(Episode(task=task, group_id=0, sample_id=0, seed=0, turns=[echo]), echo) == 0.0


# --- the hybrid: a critic scores what the verifier cannot --------------------------------------------


def test_hybrid_asks_the_critic_only_about_unverified_turns_and_uses_its_score():
    groups = [make_group([["a", "b"], ["a", "b"]], [1.0, 0.0])]
    _score(groups, {(0, 0, 0): 1.0, (0, 1, 0): 0.0})  # a's turns are verified; b's are not
    cfg = VerifiedConfig(weight=0.5, critic="judge")
    requests = plan_credit(groups, cfg)
    assert sorted(r.key for r in requests) == ["critic/0/1", "critic/1/1"]
    assert all(r.policy == "judge" for r in requests)
    results = {"critic/0/1": ["PROCESS_SCORE: 8"], "critic/1/1": ["no score here"]}
    retries = followup_credit(groups, cfg, results)
    assert [r.key for r in retries] == ["critic/1/1/retry"]
    results["critic/1/1/retry"] = ["PROCESS_SCORE: 2"]
    credit = run_credit(build_credit_batch(groups, ["a", "b"]), cfg, results)
    r = credit.breakdown["turn_reward"].tolist()
    assert r == pytest.approx([0.5 * 1.0 + 0.5 * 1.0, 0.5 * 0.8 + 0.5 * 1.0, 0.5 * 0.0 + 0.5 * 0.0, 0.5 * 0.2 + 0.5 * 0.0])
    assert float(credit.breakdown["critic_calls"]) == 3 and float(credit.breakdown["critic_parse_failures"]) == 1


def test_hybrid_critique_that_never_parses_leaves_the_outcome():
    groups = [make_group([["b"], ["b"]], [1.0, 0.0])]
    cfg = VerifiedConfig(weight=0.5, critic="judge")
    results = {"critic/0/0": [""], "critic/1/0": [""], "critic/0/0/retry": ["?"], "critic/1/0/retry": ["PROCESS_SCORE: 10"]}
    credit = run_credit(build_credit_batch(groups, ["b"]), cfg, results)
    assert credit.breakdown["turn_reward"].tolist() == [1.0, 0.5 * 1.0 + 0.5 * 0.0]
    assert credit.breakdown["process_score"].tolist() == [False, True]


def test_without_a_critic_nothing_is_planned():
    groups = [make_group([["a"]], [1.0])]
    assert plan_credit(groups, VerifiedConfig()) == []


def test_agents_limits_the_verifier_to_the_named_agents_and_the_rest_is_dr_mas():
    groups = random_groups(5, num_groups=2, group_size=4, max_turns=4, agent_names=["lead", "adder"], min_turns=1)
    _with_random_scores(groups, 5, p=1.0)
    batch = build_credit_batch(groups, ["lead", "adder"])
    got = run_credit(batch, VerifiedConfig(agents=("adder",)))
    lead = batch.agent_ids == 0
    assert torch.equal(got.advantages[lead], run_credit(batch, DrMasConfig()).advantages[lead])
    assert torch.equal(got.advantages[~lead], run_credit(batch, VerifiedConfig()).advantages[~lead])
    assert not bool(got.breakdown["verified"][lead].any())


def test_agents_must_name_agents_of_the_team(tmp_path):
    from mas.config.schema import ConfigError, load_config
    from team_helpers import team_config

    path = tmp_path / "team.yaml"
    import yaml

    path.write_text(yaml.safe_dump(team_config(tmp_path, credit={"method": "verified", "agents": ["helper", "ghost"]})))
    with pytest.raises(ConfigError, match=r"credit.agents\[1\]: unknown agent"):
        load_config(path)
