"""C3 (CREDIT_SPEC §5, §10 rows 13–15): the replay plan, node values, LOO credit, sibling-group
standardisation, a slow reference, a hand example through the real engine and a training smoke run."""

from __future__ import annotations

import json
import math
import random

import pytest
from team_helpers import dyad_config
import torch
from credit_reference import make_group, random_groups
from pydantic import TypeAdapter, ValidationError

from mas.agents.agent import build_agents
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import validate_config
from mas.credit import build_credit_batch, credit_config_union, plan_credit, run_credit
from mas.credit.c3 import C3Config
from mas.rollout.engine import Engine
from mas.training.team import build_team
from mas.topologies import build_topology
from mas.training.trainer import train
from mas.types import Episode, EpisodeGroup, ReplayRequest, Task

EPS8 = 1e-8
AGENTS = ["reasoner", "actor"]


# --- helpers ---------------------------------------------------------------------------------


def chain_groups(rewards: list[list[float]], agents=("reasoner", "actor")) -> list[EpisodeGroup]:
    """One task group per row of ``rewards``; every episode is the chain ``agents``."""
    return [make_group([list(agents)] * len(rs), rs, group_id=b) for b, rs in enumerate(rewards)]


def fake_results(requests, rewards: dict[str, list[float]], failed: dict[str, int] | None = None) -> dict:
    """Results of ``requests``: replay episodes with the given rewards (the first ``failed[key]`` fail)."""
    out = {}
    for req in requests:
        rs = rewards[req.key]
        assert len(rs) == req.num_samples, req.key
        bad = (failed or {}).get(req.key, 0)
        out[req.key] = [
            Episode(task=req.source.task, group_id=0, sample_id=i, seed=0, reward=r, status="error" if i < bad else "ok") for i, r in enumerate(rs)
        ]
    return out


def run(groups, cfg, results=None):
    batch = build_credit_batch(groups, sorted({t.agent for g in groups for ep in g.episodes for t in ep.turns}) or AGENTS)
    return run_credit(batch, cfg, results)


def grpo_pop(values: list[float]) -> list[float]:
    """GRPO with the population std (and C3's 1e-8 inside the sqrt)."""
    n = len(values)
    m = sum(values) / n
    var = sum((v - m) ** 2 for v in values) / n
    return [(v - m) / math.sqrt(var + EPS8) for v in values]


# --- slow reference ----------------------------------------------------------------------------


def ref_c3(groups: list[EpisodeGroup], results: dict, fanout: tuple[int, ...], baseline: str = "loo", std_norm: bool = True,
           no_replay: bool = False) -> list[float]:
    """C3 straight from CREDIT_SPEC §5.2 over the nested episodes, one loop per node.  With
    ``no_replay`` a depth-d (d >= 1) sibling group is every depth-d node of the task (C3's
    c3_no_replay: the parent is ignored): the recorded nodes and their replays."""
    D = len(fanout)
    flat = [(b, ep) for b, g in enumerate(groups) for ep in g.episodes]

    def replays(e: int, d: int) -> list[float]:
        ep = flat[e][1]
        if d >= len(ep.turns) or fanout[d] <= 1:
            return []
        return [x.reward for x in results[f"c3/{e}/{d}"] if x.status != "error"]

    def q_rec(e: int, d: int) -> float:  # mean of the leaves below the recorded node (e, d)
        leaves = [flat[e][1].reward] + [r for dd in range(d + 1, D) for r in replays(e, dd)]
        return sum(leaves) / len(leaves)

    def credits(values: list[float]) -> list[float]:
        n = len(values)
        out = []
        for j, v in enumerate(values):
            if baseline == "loo":
                base = v if n == 1 else (sum(values) - v) / (n - 1)
            else:
                base = sum(values) / n
            out.append(v - base)
        if std_norm:
            m = sum(out) / n
            var = sum((c - m) ** 2 for c in out) / n
            out = [(c - m) / math.sqrt(var + EPS8) for c in out]
        return out

    adv = []
    for e, (b, ep) in enumerate(flat):
        for t in range(len(ep.turns)):
            d = min(t, D - 1)
            if d == 0:
                members = [e2 for e2, (b2, ep2) in enumerate(flat) if b2 == b and ep2.turns]
                adv.append(credits([q_rec(e2, 0) for e2 in members])[members.index(e)])
            elif no_replay:
                members = [e2 for e2, (b2, ep2) in enumerate(flat) if b2 == b and len(ep2.turns) > d]
                values = [q_rec(e2, d) for e2 in members] + [r for e2 in members for r in replays(e2, d)]
                adv.append(credits(values)[members.index(e)])
            else:
                adv.append(credits([q_rec(e, d)] + replays(e, d))[0])
    return adv


def random_results(requests, seed: int, p_fail: float = 0.15) -> dict:
    rng = random.Random(seed)
    discrete = rng.random() < 0.5
    out = {}
    for req in requests:
        out[req.key] = [
            Episode(task=req.source.task, group_id=0, sample_id=i, seed=0,
                    reward=rng.choice([0.0, 1.0]) if discrete else rng.uniform(-1, 2), status="error" if rng.random() < p_fail else "ok")
            for i in range(req.num_samples)
        ]
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fanout_tail", [(), (3,), (2, 3), (1, 2), (4, 1, 2)])
@pytest.mark.parametrize("baseline,std_norm", [("loo", True), ("loo", False), ("full_mean", True), ("full_mean", False)])
def test_vectorised_equals_reference_on_random_ragged_trees(seed, fanout_tail, baseline, std_norm):
    G = 1 + seed % 3
    groups = random_groups(seed, 3, G, 5, ["a", "b", "c"], min_turns=0)
    cfg = C3Config(fanout=(G, *fanout_tail), baseline=baseline, std_norm=std_norm)
    requests = plan_credit(groups, cfg)
    results = random_results(requests, seed)
    got = run_credit(build_credit_batch(groups, ["a", "b", "c"]), cfg, results, dtype=torch.float64).advantages
    torch.testing.assert_close(got, torch.tensor(ref_c3(groups, results, cfg.fanout, baseline, std_norm), dtype=torch.float64), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fanout_tail", [(1,), (3,), (2, 3), (1, 1)])
@pytest.mark.parametrize("baseline,std_norm", [("loo", True), ("full_mean", False)])
def test_no_replay_equals_reference(seed, fanout_tail, baseline, std_norm):
    G = 2 + seed % 3
    groups = random_groups(seed, 3, G, 5, ["a", "b", "c"], min_turns=0)
    cfg = C3Config(fanout=(G, *fanout_tail), baseline=baseline, std_norm=std_norm, no_replay=True)
    requests = plan_credit(groups, cfg)
    results = random_results(requests, seed)
    got = run_credit(build_credit_batch(groups, ["a", "b", "c"]), cfg, results, dtype=torch.float64).advantages
    want = ref_c3(groups, results, cfg.fanout, baseline, std_norm, no_replay=True)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=1e-10)


# --- the plan ---------------------------------------------------------------------------------


def test_plan_asks_fanout_minus_one_replays_per_episode_and_depth():
    groups = chain_groups([[1.0, 0.0], [0.0, 0.0]], agents=("reasoner", "actor", "reasoner"))
    reqs = plan_credit(groups, C3Config(fanout=(2, 4, 3)))
    assert [(r.key, r.freeze_upto, r.num_samples) for r in reqs] == [
        (f"c3/{e}/{d}", d, {1: 3, 2: 2}[d]) for e in range(4) for d in (1, 2)
    ]
    assert all(isinstance(r, ReplayRequest) for r in reqs)
    assert reqs[2].source is groups[0].episodes[1]  # episode index = running index over the batch
    # fanout 1 at a depth plans nothing there; a tree deeper than the episode stops at its last turn
    assert [r.key for r in plan_credit(groups, C3Config(fanout=(2, 1, 2, 5)))] == [f"c3/{e}/2" for e in range(4)]
    assert plan_credit(groups, C3Config(fanout=(2,))) == []


def test_plan_rejects_a_group_size_other_than_the_root_fanout():
    with pytest.raises(ValueError, match="group_size = fanout"):
        plan_credit(chain_groups([[1.0, 0.0, 1.0]]), C3Config(fanout=(2, 4)))


def test_missing_replays_are_an_error():
    groups = chain_groups([[1.0, 0.0]])
    with pytest.raises(ValueError, match="c3/0/1"):
        run(groups, C3Config())


def test_config_schema():
    union = TypeAdapter(credit_config_union())
    cfg = union.validate_python({"method": "c3", "fanout": [8, 1], "baseline": "full_mean"})
    assert isinstance(cfg, C3Config) and cfg.fanout == (8, 1) and cfg.std_norm and cfg.variant == "reward_only"
    assert C3Config().fanout == (2, 4) and C3Config().baseline == "loo" and C3Config().normaliser == "none"
    for bad in ({"fanout": [2, 0]}, {"fanout": []}, {"variant": "value_assisted"}, {"alpha": 1.0}):
        with pytest.raises(ValidationError):
            union.validate_python({"method": "c3", **bad})


# --- [T] properties ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rewards", [[1.0, 0.0, 0.0, 1.0, 1.0], [0.3, -1.2, 2.5], [0.0, 1.0]])
def test_loo_credits_sum_to_zero_and_equal_scaled_centring(rewards):
    """§5.7: in a sibling group of n, A_j = Q_j − mean_{j'≠j} Q_j' = n/(n−1)·(Q_j − mean Q); Σ_j A_j = 0.
    Depth 0 with fanout (n,): the n episodes of a task are the sibling group."""
    n = len(rewards)
    groups = chain_groups([rewards], agents=("reasoner",))
    credit = run(groups, C3Config(fanout=(n,), std_norm=False))
    r = [float(x) for x in rewards]
    mean = sum(r) / n
    expected = [r[j] - sum(r[k] for k in range(n) if k != j) / (n - 1) for j in range(n)]
    torch.testing.assert_close(credit.advantages, torch.tensor(expected))
    torch.testing.assert_close(credit.advantages, torch.tensor([n / (n - 1) * (x - mean) for x in r]))
    assert abs(float(credit.advantages.sum())) < 1e-5
    torch.testing.assert_close(credit.breakdown["sibling_baseline"], torch.tensor([(sum(r) - x) / (n - 1) for x in r]))


def test_reasoner_node_value_is_the_mean_of_its_leaf_rewards():
    """§5.7: the reasoner (depth 0) node value = mean of its F1 = 4 leaves (recorded actor + 3 replays)."""
    groups = chain_groups([[1.0, 0.0]])
    reqs = plan_credit(groups, C3Config())
    results = fake_results(reqs, {"c3/0/1": [1.0, 0.0, 1.0], "c3/1/1": [0.0, 0.0, 1.0]})
    credit = run(groups, C3Config(), results)
    node = credit.breakdown["node_value"]
    assert node[0].item() == pytest.approx((1 + 1 + 0 + 1) / 4) and node[2].item() == pytest.approx((0 + 0 + 0 + 1) / 4)
    assert node[1].item() == 1.0 and node[3].item() == 0.0  # a leaf: its terminal reward
    assert credit.breakdown["sibling_count"].tolist() == [2, 4, 2, 4]
    assert credit.breakdown["tree_depth"].tolist() == [0, 1, 0, 1]
    assert credit.breakdown["replays"].item() == 6


@pytest.mark.parametrize("seed", range(5))
def test_reward_only_with_std_norm_is_grpo_with_population_std_per_sibling_group(seed):
    """§5.7 / §10 row 14: LOO's n/(n−1) factor cancels in the standardisation (up to the 1e-8
    inside the sqrt, which the factor rescales: hence the relative tolerance)."""
    rng = random.Random(seed)
    G, F1 = rng.randint(2, 5), rng.randint(2, 5)
    rewards = [[float(rng.choice([0.0, 0.5, 1.0, rng.uniform(-1, 1)])) for _ in range(G)] for _ in range(2)]
    groups = chain_groups(rewards)
    cfg = C3Config(fanout=(G, F1))
    reqs = plan_credit(groups, cfg)
    rep = {r.key: [rng.choice([0.0, 1.0, rng.uniform(-1, 1)]) for _ in range(F1 - 1)] for r in reqs}
    adv = run(groups, cfg, fake_results(reqs, rep)).advantages.tolist()
    expected = []
    for b in range(2):
        roots = [(rewards[b][i] + sum(rep[f"c3/{b * G + i}/1"])) / F1 for i in range(G)]
        root_adv = grpo_pop(roots)
        for i in range(G):
            expected += [root_adv[i], grpo_pop([rewards[b][i]] + rep[f"c3/{b * G + i}/1"])[0]]
    assert adv == pytest.approx(expected, rel=1e-3, abs=1e-5)


def test_a_constant_sibling_group_gives_zero():
    groups = chain_groups([[1.0, 1.0, 1.0]])
    cfg = C3Config(fanout=(3, 3))
    reqs = plan_credit(groups, cfg)
    for baseline in ("loo", "full_mean"):
        for std_norm in (True, False):
            c = run(groups, cfg.model_copy(update={"baseline": baseline, "std_norm": std_norm}), fake_results(reqs, {r.key: [1.0, 1.0] for r in reqs}))
            assert c.advantages.tolist() == [0.0] * 6


def test_flat_fanout_k_1_pools_actor_siblings_across_parents_as_c3_no_replay():
    """§5.7: (K, 1) is the no-replay ablation.  C3's code (c3_no_replay) collapses the parent id
    at depth >= 1, so the K actor nodes of a question form ONE sibling group instead of K
    groups of one (which would give every actor 0).  Reasoner and actor nodes both hold the
    leaf reward here, so both are GRPO (population std) over the K rewards."""
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    groups = chain_groups([rewards])
    cfg = C3Config(fanout=(8, 1))
    assert cfg.no_replay is None and plan_credit(groups, cfg) == []
    c = run(groups, cfg, {})
    adv = c.advantages.view(8, 2)
    assert adv[:, 0].tolist() == pytest.approx(grpo_pop(rewards), abs=1e-6)
    assert adv[:, 1].tolist() == pytest.approx(grpo_pop(rewards), abs=1e-6)
    assert c.breakdown["sibling_count"].view(8, 2)[:, 1].tolist() == [8] * 8
    # the per-parent reading (no_replay: false) gives actor groups of one and zero actor credit
    per_parent = run(groups, C3Config(fanout=(8, 1), no_replay=False), {})
    assert per_parent.advantages.view(8, 2)[:, 1].tolist() == [0.0] * 8
    assert per_parent.breakdown["sibling_count"].view(8, 2)[:, 1].tolist() == [1] * 8


def test_no_replay_pools_replayed_siblings_across_parents():
    """no_replay with replays (fanout (2, 3)): each task's depth-1 group holds both episodes'
    recorded actors and their 2 replays each: 6 nodes, LOO over all of them (C3: a depth-d group
    holds prod(fanout[:d+1]) nodes)."""
    groups = chain_groups([[1.0, 0.0]])
    cfg = C3Config(fanout=(2, 3), no_replay=True, std_norm=False)
    reqs = plan_credit(groups, cfg)
    replay_rewards = {reqs[0].key: [1.0, 0.0], reqs[1].key: [0.0, 0.0]}  # replays of episode 0 and of episode 1
    c = run(groups, cfg, fake_results(reqs, replay_rewards))
    adv = c.advantages.view(2, 2)
    # depth 1 pool: recorded [1, 0] + replays [1, 0, 0, 0]; LOO of the recorded actor of episode 0: 1 - (0+1+0+0+0)/5
    assert adv[0, 1].item() == pytest.approx(1 - 1 / 5) and adv[1, 1].item() == pytest.approx(0 - 2 / 5)
    assert c.breakdown["sibling_count"].view(2, 2)[:, 1].tolist() == [6, 6]


# --- other behaviour --------------------------------------------------------------------------------


def test_turns_beyond_the_tree_take_their_deepest_ancestors_credit():
    """fanout (2, 2): turns 2 and 3 of a 4-turn chain take the credit of the node at depth 1."""
    groups = chain_groups([[1.0, 0.0]], agents=("reasoner", "actor", "reasoner", "actor"))
    cfg = C3Config(fanout=(2, 2))
    reqs = plan_credit(groups, cfg)
    c = run(groups, cfg, fake_results(reqs, {"c3/0/1": [0.0], "c3/1/1": [1.0]}))
    adv = c.advantages.view(2, 4)
    assert torch.equal(adv[:, 2], adv[:, 1]) and torch.equal(adv[:, 3], adv[:, 1])
    # depth 1: {1 (rec), 0} -> +1 / -1 after std_norm; depth 0: Q = [1/2, 1/2] -> 0
    assert adv[:, 1].tolist() == pytest.approx([1.0, -1.0], abs=1e-6) and adv[:, 0].tolist() == [0.0, 0.0]
    assert c.breakdown["tree_depth"].tolist() == [0, 1, 1, 1] * 2


def test_failed_replays_are_left_out_and_counted():
    groups = chain_groups([[1.0, 0.0]])
    reqs = plan_credit(groups, C3Config())
    res = fake_results(reqs, {"c3/0/1": [0.0, 1.0, 0.0], "c3/1/1": [1.0, 1.0, 0.0]}, failed={"c3/0/1": 1})
    c = run(groups, C3Config(), res)
    # episode 0 keeps leaves {1 (rec), 1, 0}: the failed 0.0 does not count
    assert c.breakdown["node_value"][0].item() == pytest.approx(2 / 3)
    assert c.breakdown["sibling_count"][1].item() == 3
    assert c.breakdown["replay_failures"].item() == 1 and c.breakdown["replays"].item() == 5


def test_pipeline_normaliser_applies_after_the_method():
    groups = chain_groups([[1.0, 0.0, 1.0]], agents=("reasoner",))
    raw = run(groups, C3Config(fanout=(3,))).advantages
    glob = run(groups, C3Config(fanout=(3,), normaliser="global", scale_by_std=False)).advantages
    torch.testing.assert_close(glob, raw - raw.mean())


# --- hand example through the real engine ----------------------------------------------------------


def chain_config(model_dir, credit: dict, **trainer) -> dict:
    """Two-agent chain, reasoner -> actor, each on its own policy."""
    return dyad_config(model_dir, credit, ("reasoner", "You give a hint."), ("actor", "You answer."), **trainer)


def test_hand_example_fanout_2_4_through_the_engine(tiny_tokenizer):
    """The reasoner's hint is good for episode 0 and bad for episode 1.  A good hint makes the
    actor right every time; with a bad hint it is right on every 4th call only (the 4th call is
    the last replay of episode 1).  Leaves: episode 0 -> [1, 1, 1, 1], episode 1 -> [0, 0, 0, 1].
      reasoners: Q = [1, 1/4]; LOO credits ±3/4, standardised ±(3/4)/sqrt(9/16 + 1e-8) ≈ ±1
      actor of episode 0: a constant group -> 0
      actor of episode 1: values [0, 0, 0, 1], LOO -1/3 (mean of the others); the group's
      credits [-1/3, -1/3, -1/3, 1] have mean 0 and variance 1/3 -> (-1/3)/sqrt(1/3 + 1e-8)."""
    calls = {"reasoner": 0, "bad": 0}

    def respond(req):
        if req.agent == "reasoner":
            calls["reasoner"] += 1
            return "HINT good" if calls["reasoner"] % 2 == 1 else "HINT bad"
        if "HINT good" in req.messages[-1]["content"]:
            return "ANSWER: right"
        calls["bad"] += 1
        return "ANSWER: right" if calls["bad"] % 4 == 0 else "ANSWER: wrong"

    run_cfg = validate_config(chain_config("m", {"method": "c3"}))
    backend = ScriptedBackend(respond, {p: tiny_tokenizer for p in run_cfg.policies})
    engine = Engine(build_topology(run_cfg.topology), build_agents(run_cfg.agents, run_cfg.team.name), {p: tiny_tokenizer for p in run_cfg.policies},
                    {p: True for p in run_cfg.policies}, backend, lambda ep: float(ep.answer == "right"))
    groups = engine.rollout([Task("t0", "2+2", "4")], group_size=2, seed=0)
    assert [ep.reward for ep in groups[0].episodes] == [1.0, 0.0]
    requests = plan_credit(groups, run_cfg.credit)
    results = engine.execute(requests, seed=1)
    assert [ep.reward for ep in results["c3/0/1"]] == [1.0, 1.0, 1.0] and [ep.reward for ep in results["c3/1/1"]] == [0.0, 0.0, 1.0]
    for ep in results["c3/1/1"]:  # the reasoner's message is frozen, the actor resampled
        assert ep.turns[0].replayed and ep.turns[0].text == "HINT bad" and not ep.turns[1].replayed
    assert backend.requests == 10  # Σ_d Π_{t≤d} F_t = 2 + 8 messages, as in the paper (§5.4)
    credit = run_credit(build_credit_batch(groups, AGENTS), run_cfg.credit, results)
    s = (3 / 4) / math.sqrt(9 / 16 + EPS8)
    torch.testing.assert_close(credit.advantages, torch.tensor([s, 0.0, -s, (-1 / 3) / math.sqrt(1 / 3 + EPS8)]))
    torch.testing.assert_close(credit.breakdown["node_value"], torch.tensor([1.0, 1.0, 0.25, 0.0]))


# --- training smoke run ------------------------------------------------------------------------------


def outcome_parity(episode) -> float:
    """A reward random models can earn that depends on every sampled turn (so replays vary)."""
    return float(sum(t.completion_ids[0] for t in episode.turns if t.completion_ids) % 2)


def test_three_training_steps_change_both_policies(tiny_model_dir, tmp_path):
    team = build_team(validate_config(chain_config(tiny_model_dir, {"method": "c3", "fanout": [2, 4]})))
    team.engine.score = outcome_parity
    before = {n: {k: v.detach().clone() for k, v in p.model.state_dict().items()} for n, p in team.policies.items()}
    train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["credit_cost"]["replays"] == 4  # B=2 tasks x G=2 episodes, one depth-1 request each
        for name in ("think", "solve"):
            assert math.isfinite(r["policies"][name]["loss"]) and r["policies"][name]["samples"] > 0
    for name, p in team.policies.items():
        assert any(not torch.equal(before[name][k], v) for k, v in p.model.state_dict().items()), name
