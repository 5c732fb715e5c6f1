"""SHARP (credit/sharp.py, CREDIT_SPEC §4): planning, hand-derived rewards, a slow reference on
random ragged batches, the [T] properties (§10 rows 10–12), the identities with GRPO, an
end-to-end run through the real engine with scripted agents that counts backend requests,
and a 3-step training smoke run on a tiny random model."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import re
from collections import defaultdict

import pytest
from team_helpers import TOPOLOGIES, team_config, varied_reward  # varied_reward: random models never solve the task
import torch
import yaml
from credit_reference import make_group, make_turn, ref_normalise
from pydantic import TypeAdapter, ValidationError

from mas.credit import build_credit_batch, credit_config_union, get_credit, plan_credit, run_credit
from mas.credit.baselines import GRPOConfig
from mas.credit.sharp import SharpConfig as _SharpConfig
from mas.credit.sharp import coalition_key, episode_players, plan_sharp


def SharpConfig(**kw) -> _SharpConfig:  # noqa: N802 - these tests fix exclude=() (every agent a player) unless told
    kw.setdefault("exclude", ())
    kw.setdefault("agent_samples", "turn")  # the references here count turns; the default (episode) is tested below
    return _SharpConfig(**kw)
from mas.credit.shapley import permutation_orderings, resolve_kind
from mas.rollout.script import MASK_TEXT
from mas.types import Episode, EpisodeGroup, InterventionRequest, Task

EPS = 1e-6


# --- helpers -------------------------------------------------------------------------------------------


def result_episode(src: Episode, reward: float, status: str = "ok") -> Episode:
    return Episode(task=src.task, group_id=src.group_id, sample_id=0, seed=0, reward=reward, status=status)


def results_from(requests, value_of):
    """Hand-made engine results: key -> [episode whose reward is value_of(request)] (or an error)."""
    out = {}
    for r in requests:
        v = value_of(r)
        out[r.key] = [result_episode(r.source, 0.0, "error")] if v is None else [result_episode(r.source, v)]
    return out


def episodes_of(groups):
    return [ep for g in groups for ep in g.episodes]


# --- config and plan -----------------------------------------------------------------------------------


def test_config_defaults_and_yaml():
    cfg = TypeAdapter(credit_config_union()).validate_python({"method": "sharp"})
    assert isinstance(cfg, _SharpConfig) and cfg.exclude is None  # default: the answering agent
    assert (cfg.lambda_s, cfg.lambda_p, cfg.marginal, cfg.max_exact_players, cfg.mc_permutations) == (1.0, 0.0, "exact", 8, 64)
    assert cfg.agent_samples == "episode"  # one sample per (episode, agent), as the spec normalises
    assert (cfg.players, cfg.exclude, cfg.mask_mode, cfg.sparsify, cfg.normaliser, cfg.tool_key) == ("agents", None, "mask", 0.0, "agent", "tool_valid")
    for field in _SharpConfig.model_fields.values():
        assert field.description
    with pytest.raises(ValidationError):
        SharpConfig(marginal="banzhaf")
    with pytest.raises(ValidationError):
        SharpConfig(lambda_shapley=1.0)
    with pytest.raises(ValidationError):
        SharpConfig(sparsify=-1.0)
    assert get_credit("sharp").plan is plan_sharp


def test_plan_one_request_per_distinct_coalition():
    """Episode 0: players {a, b, c} -> 2^3 − 1 = 7 re-runs (the full coalition is the episode);
    episode 1: {a} -> 1; the planner p is excluded and never masked."""
    groups = [make_group([["p", "a", "b", "c", "a"], ["p", "a"]], [1.0, 0.0])]
    reqs = plan_sharp(groups, SharpConfig(exclude=("p",)))
    keys = [r.key for r in reqs]
    assert len(keys) == len(set(keys)) == 7 + 1
    assert set(keys) == {coalition_key(0, m) for k in (1, 2, 3) for m in itertools.combinations("abc", k)} | {"sharp/1/a"}
    assert "sharp/0/a,b,c" in keys and coalition_key(0, ["c", "a"]) == "sharp/0/a,c"
    assert episode_players(["b", "p", "a", "b"], ["p"]) == ["a", "b"]
    for r in reqs:
        assert isinstance(r, InterventionRequest) and r.keep_others and r.mode == "mask" and "p" not in r.agents
        assert r.source is groups[0].episodes[int(r.key.split("/")[1])]
        assert r.key == coalition_key(int(r.key.split("/")[1]), r.agents)
    assert len(plan_sharp(groups, SharpConfig(marginal="loo"))) == 4 + 2  # n per episode (p is a player here)
    assert all(r.mode == "remove" for r in plan_sharp(groups, SharpConfig(mask_mode="remove")))
    assert plan_sharp(groups, SharpConfig(lambda_s=0.0)) == []
    assert plan_credit(groups, SharpConfig()) == plan_sharp(groups, SharpConfig())


def test_plan_mc_requests_the_distinct_coalitions_its_orderings_visit():
    """12 players, 5 orderings: 5·12 prefix look-ups, at most 5·11 + 1 distinct masked sets (the full
    coalition needs no re-run), each once; exact falls back to the same MC plan above 8 players."""
    agents = [f"w{i:02d}" for i in range(12)]
    groups = [make_group([agents], [1.0])]
    mc = plan_sharp(groups, SharpConfig(marginal="mc", mc_permutations=5))
    assert len(mc) == len({r.key for r in mc}) <= 5 * 11 + 1
    assert [r.key for r in plan_sharp(groups, SharpConfig(mc_permutations=5))] == [r.key for r in mc]
    orderings = permutation_orderings(12, 5, seed=0)  # episode 0, seed 0
    expected = set()
    for perm in orderings.tolist():
        for k in range(12):  # the coalition before position k; masked = the rest
            expected.add(coalition_key(0, [agents[i] for i in perm[k:]]))
    assert {r.key for r in mc} == expected


# --- hand-derived --------------------------------------------------------------------------------------


def test_hand_example_and_game_exact_and_loo():
    """Group of two episodes, agents a, b acting once each.  Episode 0 (R=1) is an AND game:
    v({a}) = v({b}) = v(∅) = 0.  Episode 1 (R=0): v({a}) = 1 (b's message hurts), v({b}) = 0, v(∅) = 0.

    exact: φ0 = (½, ½); φ1_a = ½(v(a) − v(∅)) + ½(v(ab) − v(b)) = ½(1) + ½(0) = ½,
           φ1_b = ½(v(b) − v(∅)) + ½(v(ab) − v(a)) = 0 + ½(0 − 1) = −½.
    R_{i,m} = R_i + φ_{i,m}: a: [1.5, 0.5], b: [1.5, −0.5]; agent-wise over the 2 episodes."""
    groups = [make_group([["a", "b"], ["a", "b"]], [1.0, 0.0])]
    batch = build_credit_batch(groups, ["a", "b"])
    v = {"sharp/0/a": 0.0, "sharp/0/b": 0.0, "sharp/0/a,b": 0.0, "sharp/1/b": 1.0, "sharp/1/a": 0.0, "sharp/1/a,b": 0.0}
    results = results_from(plan_sharp(groups, SharpConfig()), lambda r: v[r.key])
    credit = run_credit(batch, SharpConfig(), results)
    torch.testing.assert_close(credit.breakdown["marginal"], torch.tensor([0.5, 0.5, 0.5, -0.5]))
    torch.testing.assert_close(credit.breakdown["turn_reward"], torch.tensor([1.5, 1.5, 0.5, -0.5]))

    def agentwise(x0, x1):
        mu, sd = (x0 + x1) / 2, abs(x0 - x1) / math.sqrt(2)
        return [(x0 - mu) / (sd + EPS), (x1 - mu) / (sd + EPS)]

    a, b = agentwise(1.5, 0.5), agentwise(1.5, -0.5)
    torch.testing.assert_close(credit.advantages, torch.tensor([a[0], b[0], a[1], b[1]]))
    assert int(credit.breakdown["coalition_evals"]) == 6 and int(credit.breakdown["coalition_failures"]) == 0

    # LOO: Δ = v(N) − v(N∖{m}): episode 0: (1 − 0, 1 − 0) = (1, 1), sum 2 ≠ v(N) − v(∅) = 1;
    # episode 1: a: 0 − v({b}) = 0, b: 0 − v({a}) = −1.  Needs only the single-mask re-runs.
    loo_reqs = plan_sharp(groups, SharpConfig(marginal="loo"))
    assert sorted(r.key for r in loo_reqs) == ["sharp/0/a", "sharp/0/b", "sharp/1/a", "sharp/1/b"]
    loo = run_credit(batch, SharpConfig(marginal="loo", normaliser="none"), results_from(loo_reqs, lambda r: v[r.key]))
    torch.testing.assert_close(loo.breakdown["marginal"], torch.tensor([1.0, 1.0, 0.0, -1.0]))
    torch.testing.assert_close(loo.advantages, torch.tensor([2.0, 2.0, 0.0, -1.0]))  # none: the raw R_{i,m}


def test_tool_reward_is_the_agents_mean_over_its_turns_and_zero_when_absent():
    """a acts twice in episode 0 with tool_valid 1 and 0 -> ½; b has no signal -> 0.
    R = R^b + λ_p·R^tool with λ_s = 0 (nothing planned, no results needed).  Only a's second
    turn carries "other" (5.0): the mean is over the turns that carry the key -> 5, not 2.5."""
    g = make_group([["a", "b", "a"]], [1.0])
    g.episodes[0].turns[0].extra_rewards = {"tool_valid": 1.0}
    g.episodes[0].turns[2].extra_rewards = {"tool_valid": 0.0, "other": 5.0}
    batch = build_credit_batch([g], ["a", "b"])
    credit = run_credit(batch, SharpConfig(lambda_s=0.0, lambda_p=0.4, normaliser="none"))
    torch.testing.assert_close(credit.breakdown["tool"], torch.tensor([0.5, 0.0, 0.5]))
    torch.testing.assert_close(credit.advantages, torch.tensor([1.0 + 0.4 * 0.5, 1.0, 1.0 + 0.4 * 0.5]))
    other = run_credit(batch, SharpConfig(lambda_s=0.0, lambda_p=0.4, tool_key="other", normaliser="none"))
    torch.testing.assert_close(other.breakdown["tool"], torch.tensor([5.0, 0.0, 5.0]))
    plain = build_credit_batch([make_group([["a", "b"]], [1.0])], ["a", "b"])
    assert torch.equal(run_credit(plain, SharpConfig(lambda_s=0.0, lambda_p=1.0)).breakdown["tool"], torch.zeros(2))


def test_tool_reward_measures_validity_not_the_number_of_calls():
    """The engine sets tool_valid (fraction of valid calls) on turns that made calls only; a
    reply turn has no key.  Episode 0 (R = 1), turns in order:
      A: 4 tool turns, all valid (1, 1, 1, 1), then a reply   -> mean over call turns = 1
         (averaging over all 5 turns would give 4/5 = 0.8: the more calls, the more reward)
      B: a valid call turn (1), a malformed one (0), a reply  -> (1 + 0)/2 = ½   (not 1/3)
      C: a reply only, no calls                               -> 0
      D: one turn with 2 of 3 calls valid (⅔), then a reply   -> ⅔               (not ⅓)
    Episode 1 (R = 0): A makes 1 valid call + reply -> 1 (not ½), the same as 4 valid calls.
    λ_s = 0, λ_p = 1, normaliser none: R_{i,m} = R_i + R^tool_{i,m} on every turn of m."""
    agents = ["A"] * 5 + ["B"] * 3 + ["C"] + ["D"] * 2
    g = make_group([agents, ["A", "A"]], [1.0, 0.0])
    tool_valid = [1.0, 1.0, 1.0, 1.0, None, 1.0, 0.0, None, None, 2 / 3, None]
    for t, v in zip(g.episodes[0].turns, tool_valid):
        if v is not None:
            t.extra_rewards = {"tool_valid": v}
    g.episodes[1].turns[0].extra_rewards = {"tool_valid": 1.0}
    batch = build_credit_batch([g], ["A", "B", "C", "D"])
    assert batch.turn_reward_present["tool_valid"].tolist() == [v is not None for v in tool_valid] + [True, False]
    credit = run_credit(batch, SharpConfig(lambda_s=0.0, lambda_p=1.0, normaliser="none"))
    per_agent = {"A": 1.0, "B": 0.5, "C": 0.0, "D": 2 / 3}
    expected = [per_agent[a] for a in agents] + [1.0, 1.0]
    torch.testing.assert_close(credit.breakdown["tool"], torch.tensor(expected))
    torch.testing.assert_close(credit.advantages, torch.tensor([1.0 + x for x in expected[:-2]] + [1.0, 1.0]))
    # a hand-built batch without presence masks treats every turn as carrying the signal
    legacy = dataclasses.replace(batch, turn_reward_present={})
    old = run_credit(legacy, SharpConfig(lambda_s=0.0, lambda_p=1.0, normaliser="none")).breakdown["tool"]
    assert old[0].item() == pytest.approx(0.8) and old[5].item() == pytest.approx(1 / 3)


def test_errored_counterfactual_counts_zero_and_is_counted():
    """v({a}) would be 1 but its re-run errored -> 0: φ_a = ½(0 − 0) + ½(1 − v({b})), v({b}) = 0.5."""
    groups = [make_group([["a", "b"]], [1.0])]
    batch = build_credit_batch(groups, ["a", "b"])
    v = {"sharp/0/b": None, "sharp/0/a": 0.5, "sharp/0/a,b": 0.0}
    credit = run_credit(batch, SharpConfig(normaliser="none"), results_from(plan_sharp(groups, SharpConfig()), lambda r: v[r.key]))
    phi_a = 0.5 * (0.0 - 0.0) + 0.5 * (1.0 - 0.5)
    phi_b = 0.5 * (0.5 - 0.0) + 0.5 * (1.0 - 0.0)
    torch.testing.assert_close(credit.breakdown["marginal"], torch.tensor([phi_a, phi_b]))
    assert int(credit.breakdown["coalition_failures"]) == 1 and int(credit.breakdown["coalition_evals"]) == 3


def test_sparsify_zeroes_small_credits():
    groups = [make_group([["a", "b", "c"]], [1.0])]
    batch = build_credit_batch(groups, ["a", "b", "c"])
    results = results_from(plan_sharp(groups, SharpConfig(marginal="loo")), lambda r: {"sharp/0/a": 0.95, "sharp/0/b": 0.5, "sharp/0/c": 1.2}[r.key])
    dense = run_credit(batch, SharpConfig(marginal="loo", normaliser="none"), results)
    torch.testing.assert_close(dense.breakdown["marginal"], torch.tensor([0.05, 0.5, -0.2]))
    sparse = run_credit(batch, SharpConfig(marginal="loo", normaliser="none", sparsify=0.1), results)
    torch.testing.assert_close(sparse.breakdown["marginal"], torch.tensor([0.0, 0.5, -0.2]))


def test_exclude_keeps_the_planner_out_of_the_game():
    """p is always present: never masked, φ_p = 0; the workers' AND game splits ½, ½."""
    groups = [make_group([["p", "a", "b", "p"]], [1.0])]
    batch = build_credit_batch(groups, ["p", "a", "b"])
    cfg = SharpConfig(exclude=("p",), normaliser="none")
    results = results_from(plan_sharp(groups, cfg), lambda r: 0.0)
    credit = run_credit(batch, cfg, results)
    torch.testing.assert_close(credit.breakdown["marginal"], torch.tensor([0.0, 0.5, 0.5, 0.0]))
    assert credit.breakdown["players"].tolist() == [2]
    with pytest.raises(ValueError, match="unknown agents \\['planner'\\]"):
        run_credit(batch, SharpConfig(exclude=("planner",)), results)


def test_missing_results_are_an_error_unless_nothing_was_planned():
    groups = [make_group([["a", "b"]], [1.0])]
    batch = build_credit_batch(groups, ["a", "b"])
    with pytest.raises(KeyError, match="sharp/0/"):
        run_credit(batch, SharpConfig(), None)
    with pytest.raises(KeyError, match="sharp/0/a"):
        run_credit(batch, SharpConfig(), {"sharp/0/b": [result_episode(groups[0].episodes[0], 0.0)]})
    run_credit(batch, SharpConfig(lambda_s=0.0), None)


# --- slow reference on random ragged batches ---------------------------------------------------------------


def ref_sharp(groups, results, cfg: SharpConfig, agent_names) -> list[float]:
    """Straight from CREDIT_SPEC §4.2/§4.3 with nested loops: brute-force Shapley over all n!
    orderings (exact), the same orderings as the method (mc), or v(N) − v(N∖{m}) (loo)."""
    values, gids, aids, pair = [], [], [], []
    e = 0
    for b, g in enumerate(groups):
        for ep in g.episodes:
            players = sorted({t.agent for t in ep.turns} - set(cfg.exclude))
            n = len(players)

            def v(S, e=e, ep=ep, players=players):
                masked = [p for p in players if p not in S]
                if not masked:
                    return float(ep.reward)
                r = results[coalition_key(e, masked)][0]
                return 0.0 if r.status == "error" else r.reward

            phi = defaultdict(float)
            kind = resolve_kind(n, cfg.marginal, cfg.max_exact_players)
            if cfg.lambda_s != 0 and n:
                if kind == "loo":
                    for p in players:
                        phi[p] = v(set(players)) - v(set(players) - {p})
                else:
                    if kind == "exact":
                        perms = list(itertools.permutations(range(n)))
                    else:
                        perms = permutation_orderings(n, cfg.mc_permutations, (cfg.seed * 1_000_003 + e) % (1 << 63)).tolist()
                    for perm in perms:
                        S = set()
                        for i in perm:
                            phi[players[i]] += (v(S | {players[i]}) - v(S)) / len(perms)
                            S.add(players[i])
                for p in players:
                    if abs(phi[p]) < cfg.sparsify:
                        phi[p] = 0.0
            tool = defaultdict(list)  # R^tool: mean over the agent's turns that carry the key, 0 if none
            for t in ep.turns:
                if cfg.tool_key in t.extra_rewards:
                    tool[t.agent].append(float(t.extra_rewards[cfg.tool_key]))
            for t in ep.turns:
                r_tool = sum(tool[t.agent]) / len(tool[t.agent]) if tool[t.agent] else 0.0
                r = float(ep.reward) + cfg.lambda_s * phi[t.agent] + cfg.lambda_p * r_tool
                values.append(r)
                gids.append(b)
                aids.append(t.agent)
                pair.append((e, t.agent))
            e += 1
    if cfg.normaliser == "agent" and cfg.agent_samples == "episode":
        per_pair = {}
        for x, gid, a, pr in zip(values, gids, aids, pair):
            per_pair[pr] = (x, gid, a)
        keys = list(per_pair)
        normed = ref_normalise("agent", [per_pair[k][0] for k in keys], [per_pair[k][1] for k in keys], [per_pair[k][2] for k in keys], cfg.scale_by_std, cfg.eps)
        lookup = dict(zip(keys, normed))
        return [lookup[pr] for pr in pair]
    if cfg.normaliser == "group":  # one sample per episode: the mean of its turns' R (R_i without turns)
        scores, score_gids, turn_ep = [], [], []
        e = 0
        it = iter(values)
        for b, g in enumerate(groups):
            for ep in g.episodes:
                rs = [next(it) for _ in ep.turns]
                scores.append(sum(rs) / len(rs) if rs else float(ep.reward))
                score_gids.append(b)
                turn_ep += [e] * len(rs)
                e += 1
        normed = ref_normalise("group", scores, score_gids, [0] * len(scores), cfg.scale_by_std, cfg.eps)
        return [normed[i] for i in turn_ep]
    return ref_normalise(cfg.normaliser, values, gids, aids, cfg.scale_by_std, cfg.eps)


def random_sharp_batch(seed: int, agents: list[str], min_group: int = 1, max_group: int = 4):
    """3 task groups of min_group..max_group episodes with 0..6 turns by random agents, random
    tool_valid signals on half the turns, rewards mixing {0, 1} with continuous values."""
    rng = random.Random(seed)
    groups = []
    for b in range(3):
        task = Task(task_id=f"t{b}", prompt="q", answer="a")
        eps = []
        for i in range(rng.randint(min_group, max_group)):
            turns = [make_turn(rng.choice(agents), t) for t in range(rng.randint(0, 6))]
            for t in turns:
                if rng.random() < 0.5:
                    t.extra_rewards = {"tool_valid": float(rng.random() < 0.7)}
            eps.append(Episode(task=task, group_id=b, sample_id=i, seed=i, turns=turns, reward=float(rng.choice([0.0, 1.0, rng.uniform(-1, 2)]))))
        groups.append(EpisodeGroup(task=task, episodes=eps))
    return groups


CASES = [
    dict(),
    dict(marginal="loo"),
    dict(marginal="mc", mc_permutations=7, seed=3),
    dict(max_exact_players=2, mc_permutations=5),
    dict(exclude=("p",), lambda_s=0.7, lambda_p=0.3, sparsify=0.2),
    dict(normaliser="global", lambda_p=1.0, scale_by_std=False),
    dict(normaliser="none", mask_mode="remove"),
    dict(normaliser="group", lambda_p=0.5),
    dict(agent_samples="episode", lambda_p=0.5),
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "default" for c in CASES])
def test_vectorised_sharp_equals_the_slow_reference(seed, case):
    agents = ["p", "a", "b", "c"]
    groups = random_sharp_batch(seed, agents)
    cfg = SharpConfig(**case)
    rng = random.Random(100 + seed)
    reqs = plan_sharp(groups, cfg)
    results = results_from(reqs, lambda r: None if rng.random() < 0.15 else float(rng.choice([0.0, 1.0, rng.uniform(-1, 2)])))
    batch = build_credit_batch(groups, agents)
    credit = run_credit(batch, cfg, results)
    expected = ref_sharp(groups, results, cfg, agents)
    torch.testing.assert_close(credit.advantages, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-5)
    if cfg.lambda_s:
        assert int(credit.breakdown["coalition_evals"]) == len(reqs)  # every planned re-run is read, once
        assert int(credit.breakdown["coalition_failures"]) == sum(results[r.key][0].status == "error" for r in reqs)


# --- [T] properties and identities --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_agentwise_normalised_advantages_have_mean_0_std_1_per_agent(seed):
    """[T] §10 row 12: per (task group, agent) with ≥ 2 distinct values, mean 0 and std_ddof1 1
    (up to ε/σ), also with variable invocation counts."""
    agents = ["p", "a", "b", "c"]
    groups = random_sharp_batch(seed, agents, min_group=4, max_group=6)
    rng = random.Random(seed)
    results = results_from(plan_sharp(groups, SharpConfig()), lambda r: rng.random())
    batch = build_credit_batch(groups, agents)
    credit = run_credit(batch, SharpConfig(lambda_p=0.5), results)
    checked = 0
    for b in range(len(groups)):
        for k in range(len(agents)):
            sel = (batch.group_ids == b) & (batch.agent_ids == k)
            raw = credit.breakdown["turn_reward"][sel]
            if sel.sum() < 2 or raw.std() < 1e-3:
                continue
            adv = credit.advantages[sel].double()
            sd = float(raw.double().std())
            assert abs(float(adv.mean())) < 1e-5 and abs(float(adv.std()) - sd / (sd + EPS)) < 1e-5
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize("seed", range(4))
def test_zero_lambdas_is_per_agent_grpo_on_the_broadcast_reward(seed):
    """λ_s = λ_p = 0: R_{i,m} = R_i, so SHARP = grpo with normaliser agent (nothing planned)."""
    agents = ["p", "a", "b", "c"]
    groups = random_sharp_batch(seed, agents)
    batch = build_credit_batch(groups, agents)
    cfg = SharpConfig(lambda_s=0.0, lambda_p=0.0)
    assert plan_sharp(groups, cfg) == []
    torch.testing.assert_close(run_credit(batch, cfg).advantages, run_credit(batch, GRPOConfig(normaliser="agent")).advantages, rtol=0, atol=0)
    with_lambda = run_credit(batch, SharpConfig(lambda_s=0.0, lambda_p=1.0), dtype=torch.float64).breakdown
    torch.testing.assert_close(with_lambda["turn_reward"], batch.episode_rewards[batch.episode_ids] + with_lambda["tool"], rtol=0, atol=0)
    assert bool((with_lambda["tool"] != 0).any())  # the tool reward does enter the per-agent reward


def test_zero_lambdas_equal_plain_grpo_when_each_agent_acts_once():
    """Each agent acts once per episode: per-(task, agent) statistics over the G episodes are
    GRPO's trajectory statistics, for either agent_samples."""
    groups = [
        make_group([["a", "b", "c"]] * 4, [1.0, 0.0, 0.5, 1.0], group_id=0),
        make_group([["c", "a", "b"]] * 3, [0.0, 2.0, 1.0], group_id=1),
    ]
    batch = build_credit_batch(groups, ["a", "b", "c"])
    grpo = run_credit(batch, GRPOConfig()).advantages
    torch.testing.assert_close(run_credit(batch, SharpConfig(lambda_s=0.0)).advantages, grpo)
    torch.testing.assert_close(run_credit(batch, SharpConfig(lambda_s=0.0, agent_samples="episode")).advantages, grpo)


def test_agent_samples_episode_differs_from_turn_under_repeated_invocations():
    """a acts 3 times in episode 0 (R=1) and once in episode 1 (R=0).
    episode: samples [1, 0], μ = ½, σ = √½: A = ±½/(√½ + ε) on every turn of the episode;
    turn:    samples [1, 1, 1, 0], μ = ¾, σ = √((3·¼² + ¾²)/3): A = ¼/(σ + ε) and −¾/(σ + ε)."""
    groups = [make_group([["a", "a", "a"], ["a"]], [1.0, 0.0])]
    batch = build_credit_batch(groups, ["a"])
    turn = run_credit(batch, SharpConfig(lambda_s=0.0))
    ep = run_credit(batch, SharpConfig(lambda_s=0.0, agent_samples="episode"))
    sd = math.sqrt(0.5)  # std_ddof1 of [1, 0]
    torch.testing.assert_close(ep.advantages, torch.tensor([0.5 / (sd + EPS)] * 3 + [-0.5 / (sd + EPS)]))
    sd4 = math.sqrt((3 * 0.25**2 + 0.75**2) / 3)
    torch.testing.assert_close(turn.advantages, torch.tensor([0.25 / (sd4 + EPS)] * 3 + [-0.75 / (sd4 + EPS)]))


# --- end to end through the engine with scripted agents ------------------------------------------------------


TASKS = [Task(f"t{i}", f"{i}+1", str(i + 1)) for i in range(3)]

GRAPH = TOPOLOGIES["graph"]  # draft -> check -> (END on accept | fix -> check), max_turns 5
CHAIN = {"kind": "chain", "sequence": ["lead", "helper", "checker"]}


def team_cfg(model_dir, topology: dict, credit: dict | None = None, **trainer) -> dict:
    """Three agents: lead and helper on a trainable policy, checker on a frozen one."""
    cfg = team_config(model_dir, "chain", credit=credit or {"method": "sharp"})
    cfg["topology"] = topology
    cfg["trainer"] = {**cfg["trainer"], **trainer}
    return cfg


def scripted_engine(cfg: dict, respond, tokenizer):
    """As tests/test_engine.py: the real engine and topology, a ScriptedBackend, score = exact answer."""
    from mas.agents.agent import build_agents
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.config.schema import validate_config
    from mas.rollout.engine import Engine
    from mas.topologies import build_topology

    run = validate_config(cfg)
    backend = ScriptedBackend(respond, {p: tokenizer for p in run.policies})
    scored = []

    def score(ep):
        scored.append(ep.info.get("request"))
        return float(ep.answer == ep.task.answer)

    engine = Engine(build_topology(run.topology), build_agents(run.agents, run.team.name), {p: tokenizer for p in run.policies},
                    {p: True for p in run.policies}, backend, score)
    return engine, backend, run, scored


def respond_factory(fail_on_mask: bool = False):
    """lead drafts a wrong answer; helper answers correctly; checker accepts only right after the
    helper's real answer.  The final answer is correct iff the helper's real message is visible."""

    def respond(req):
        content = req.messages[-1]["content"]
        x = int(re.search(r"Task: (\d+)\+1", content).group(1))
        if req.agent == "lead":
            return "ANSWER: 0"
        if req.agent == "helper":
            if fail_on_mask and MASK_TEXT in content:
                raise RuntimeError("helper cannot work from a masked transcript")
            return f"ANSWER: {x + 1}"
        return "ACCEPT" if content.splitlines()[-1].startswith("helper: ANSWER") else "REJECT"

    return respond


def run_sharp_step(engine, cfg, tasks, group_size=2):
    groups = engine.rollout(tasks, group_size, seed=0)
    batch = build_credit_batch(groups, ["lead", "helper", "checker"])
    requests = plan_credit(groups, cfg)
    results = engine.execute(requests, seed=1) if requests else None
    return groups, batch, requests, results, run_credit(batch, cfg, results)


def test_chain_helper_is_pivotal_through_the_engine(tiny_tokenizer):
    """Chain lead -> helper -> checker; the answer is the latest one, so it is right iff the
    helper's real message is visible: v(S) = 1 iff helper ∈ S.  φ = (lead 0, helper 1, checker 0),
    Σφ = v(N) − v(∅) = 1.  Every re-run reuses the recorded turns: no backend request at all."""
    engine, backend, run, _ = scripted_engine(team_cfg("m", CHAIN), respond_factory(), tiny_tokenizer)
    for mode in ("mask", "remove"):
        cfg = SharpConfig(mask_mode=mode, normaliser="none")
        before = backend.requests
        groups, batch, requests, results, credit = run_sharp_step(engine, cfg, TASKS[:2])
        assert backend.requests - before == 2 * 2 * 3  # the rollouts only: 4 episodes x 3 turns
        assert len(requests) == 4 * 7
        for r in requests:
            ep = results[r.key][0]
            assert ep.reward == float("helper" not in r.agents), (r.key, ep.answer)
            assert all(t.replayed or t.finish_reason == ("masked" if mode == "mask" else "removed") for t in ep.turns)
        names = [batch.agent_names[k] for k in batch.agent_ids.tolist()]
        assert credit.breakdown["marginal"].tolist() == [float(n == "helper") for n in names]
        assert credit.advantages.tolist() == [1.0 + float(n == "helper") for n in names]  # R = 1 + φ
        assert int(credit.breakdown["coalition_evals"]) == 4 * 7


@pytest.mark.parametrize("marginal,mc_permutations", [("exact", 64), ("mc", 64), ("mc", 3), ("loo", 64)])
def test_graph_coalitions_each_run_once_counted_by_backend_requests(tiny_tokenizer, marginal, mc_permutations):
    """Graph draft(lead) -> check(checker) -> [accept: END | fix(helper) -> check], max 5 turns.
    Source: lead 'ANSWER: 0', checker REJECT, helper 'ANSWER: x+1', checker ACCEPT (reward 1).
    Masking the checker removes its ACCEPT, so the graph goes on to a turn 4 (helper) the source
    does not have: that turn is sampled, one backend request, in the re-runs that mask the checker
    but not the helper ({checker} and {lead, checker}); every other re-run replays or masks only.
    v(S) = 1 iff helper ∈ S for every S, so φ = (lead 0, helper 1, checker 0) for exact and MC alike.
    MC orderings look coalitions up P·(n + 1) times; each distinct one must run exactly once."""
    engine, backend, run, scored = scripted_engine(team_cfg("m", GRAPH), respond_factory(), tiny_tokenizer)
    cfg = SharpConfig(marginal=marginal, mc_permutations=mc_permutations, normaliser="none")
    groups = engine.rollout(TASKS[:2], 2, seed=0)
    assert all([t.agent for t in ep.turns] == ["lead", "checker", "helper", "checker"] and ep.reward == 1.0 for ep in episodes_of(groups))
    rollout_requests = backend.requests
    scored.clear()
    batch = build_credit_batch(groups, ["lead", "helper", "checker"])
    requests = plan_credit(groups, cfg)
    keys = [r.key for r in requests]
    assert len(keys) == len(set(keys))
    results = engine.execute(requests, seed=1)
    credit = run_credit(batch, cfg, results)

    coalitions = {(r.source.group_id, r.source.sample_id, frozenset(r.agents)) for r in requests}  # distinct (episode, masked set)
    assert len(coalitions) == len(requests)  # no coalition planned twice, under any key
    sampled = [c for c in coalitions if "checker" in c[2] and "helper" not in c[2]]
    assert backend.requests - rollout_requests == len(sampled)  # one sampled helper turn per such coalition, nothing twice
    assert sorted(scored) == sorted(keys)  # each coalition episode run and scored once
    if marginal == "exact":
        assert len(requests) == 4 * 7 and backend.requests - rollout_requests == 4 * 2
    elif marginal == "loo":
        assert len(requests) == 4 * 3 and backend.requests - rollout_requests == 4 * 1
    else:  # the orderings look coalitions up P·(n + 1) times per episode; at most 7 distinct re-runs each
        assert len(requests) <= 4 * min(7, mc_permutations * 3)
    for r in requests:
        assert results[r.key][0].reward == float("helper" not in r.agents), r.key
    names = [batch.agent_names[k] for k in batch.agent_ids.tolist()]
    torch.testing.assert_close(credit.breakdown["marginal"], torch.tensor([float(n == "helper") for n in names]))
    assert int(credit.breakdown["coalition_evals"]) == len(requests) and int(credit.breakdown["coalition_failures"]) == 0


def test_graph_failed_counterfactuals_count_zero(tiny_tokenizer):
    """Same graph, but the helper fails on a masked transcript: the re-runs masking {checker} and
    {lead, checker} error (value 0 instead of 1).  Then, by the subset formula with weights
    1/3, 1/6, 1/6, 1/3:  φ_helper = 1/6·(v(h,c) − v(c)) + 1/3·(v(N) − v(l,c)) = 1/6 + 1/3 = ½,
    φ_checker = 1/6·(v(h,c) − v(h)) + 1/3·(v(N) − v(l,h)) = ½, φ_lead = 0; Σ = v(N) − v(∅) = 1."""
    engine, backend, run, _ = scripted_engine(team_cfg("m", GRAPH), respond_factory(fail_on_mask=True), tiny_tokenizer)
    cfg = SharpConfig(normaliser="none")
    groups, batch, requests, results, credit = run_sharp_step(engine, cfg, TASKS[:1])
    failed = sorted(k for k, v in results.items() if v[0].status == "error")
    assert failed == [coalition_key(e, m) for e in (0, 1) for m in (["checker"], ["checker", "lead"])]
    names = [batch.agent_names[k] for k in batch.agent_ids.tolist()]
    phi = {"lead": 0.0, "helper": 0.5, "checker": 0.5}
    torch.testing.assert_close(credit.breakdown["marginal"], torch.tensor([phi[n] for n in names]))
    assert int(credit.breakdown["coalition_failures"]) == 4 and int(credit.breakdown["coalition_evals"]) == 14


# --- training smoke ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["chain", "debate"])
def test_three_training_steps_on_a_tiny_model(tiny_model_dir, tmp_path, topology):
    import json

    from mas.config.schema import load_config
    from mas.training.team import build_team
    from mas.training.trainer import train

    topo = CHAIN if topology == "chain" else {"kind": "debate", "debaters": ["lead", "helper", "checker"], "rounds": 2}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(team_cfg(tiny_model_dir, topo, {"method": "sharp", "exclude": ["checker"], "lambda_p": 0.1})))
    team = build_team(load_config(path))
    assert isinstance(team.cfg.credit, _SharpConfig) and team.cfg.credit.exclude == ("checker",)
    team.engine.score = varied_reward
    before = {k: v.detach().clone() for k, v in team.policies["main"].model.state_dict().items()}
    train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert math.isfinite(r["policies"]["main"]["loss"]) and r["policies"]["main"]["samples"] > 0
        assert r["credit_cost"]["interventions"] == 8 * 3  # 8 episodes x (2^2 − 1) coalitions of {lead, helper}
    after = team.policies["main"].model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_default_excludes_the_answering_agent_and_resynthesises_after_the_first_masked_message(tiny_tokenizer):
    """exclude=None: the last speaker is no player; masked re-runs replay everything before the
    first masked message and re-sample the answering agent after it."""
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.agents.agent import build_agents
    from mas.config.schema import validate_config
    from mas.rollout.engine import Engine
    from mas.topologies import build_topology
    from mas.types import Task

    def respond(req):
        if req.agent == "verifier":  # the answering agent reads what it can see
            return "ANSWER: 7" if "solver: ANSWER: 7" in req.messages[-1]["content"] else "ANSWER: 0"
        return "ANSWER: 7" if req.agent == "solver" else "I agree."

    cfg = validate_config({
        "team": {"name": "t"}, "policies": {"p": {"model": "x/y"}},
        "agents": [{"name": n, "policy": "p", "role": n} for n in ("solver", "helper", "verifier")],
        "topology": {"kind": "chain", "sequence": ["solver", "helper", "verifier"]},
        "env": {"name": "synthetic_math"}, "credit": {"method": "sharp"},
    })
    backend = ScriptedBackend(respond, {"p": tiny_tokenizer})
    engine = Engine(build_topology(cfg.topology), build_agents(cfg.agents, "t"), {"p": tiny_tokenizer}, {"p": True},
                    backend, score=lambda ep: float(ep.answer == ep.task.answer))
    groups = engine.rollout([Task("t", "q", "7")], 2, seed=0)
    reqs = plan_sharp(groups, cfg.credit)
    assert {r.agents for r in reqs} == {("helper",), ("solver",), ("helper", "solver")}  # verifier is no player
    assert all(r.resample == ("verifier",) for r in reqs)
    credit = run_credit(build_credit_batch(groups, ["solver", "helper", "verifier"]), cfg.credit, engine.execute(reqs, seed=1))
    phi = credit.breakdown["marginal"].tolist()
    assert phi[:3] == [1.0, 0.0, 0.0]  # solver earned it, helper free-rode, the verifier is not a player
