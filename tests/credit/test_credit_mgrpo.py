"""M-GRPO (CREDIT_SPEC §3): MrlX reward tables, trajectory alignment, the [T] properties of §3.7
and §10 rows 18 and 22, a slow reference, the engine end to end and 3-step training smoke runs."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict

import pytest
from team_helpers import team_config, train_smoke, varied_reward  # varied_reward: random models never solve the task
import torch
import yaml
from credit_reference import make_group, random_groups, ref_apply, ref_mean_std
from pydantic import TypeAdapter, ValidationError

from mas.credit import build_credit_batch, credit_config_union, run_credit
from mas.credit.mgrpo import MGRPOConfig
from mas.types import Task

EPS = 1e-6
AGENTS = ["main", "search", "visit"]


def _cfg(**kw) -> MGRPOConfig:
    return MGRPOConfig(main_agent="main", **kw)


# --- rewards -------------------------------------------------------------------------------------


def test_mrlx_main_and_sub_reward_tables():
    """MrlX: main 0 (invalid format) / 0.1 (valid, wrong) / 1 (correct); sub 0 (own format
    invalid) / 1 (main score 1) / 0.1 (otherwise).  Episodes (turn 0 is main, turn 1 a sub):
      0: main valid,   R=1, sub valid   -> R_M 1,   R_S 1
      1: main valid,   R=0, sub valid   -> R_M 0.1, R_S 0.1
      2: main invalid, R=1, sub valid   -> R_M 0,   R_S 0.1 (main score is not 1)
      3: main valid,   R=1, sub invalid -> R_M 1,   R_S 0
      4: main invalid, R=0, sub invalid -> R_M 0,   R_S 0"""
    groups = [make_group([["main", "search"]] * 5, [1.0, 0.0, 1.0, 1.0, 0.0], invalid={2: (0,), 3: (1,), 4: (0, 1)})]
    batch = build_credit_batch(groups, AGENTS)
    bd = run_credit(batch, _cfg()).breakdown
    torch.testing.assert_close(bd["main_reward"], torch.tensor([1.0, 0.1, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(bd["main_format"], torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(bd["turn_reward"][1::2], torch.tensor([1.0, 0.1, 0.1, 0.0, 0.0]))
    torch.testing.assert_close(bd["turn_reward"][0::2], bd["main_reward"])


def test_correct_threshold_and_format_scores():
    groups = [make_group([["main", "search"]] * 3, [0.8, 0.5, 0.2])]
    batch = build_credit_batch(groups, AGENTS)
    bd = run_credit(batch, _cfg(correct_threshold=0.5, format_score=0.2, sub_format_score=0.3)).breakdown
    torch.testing.assert_close(bd["main_reward"], torch.tensor([1.0, 1.0, 0.2]))
    torch.testing.assert_close(bd["turn_reward"][1::2], torch.tensor([1.0, 1.0, 0.3]))


def test_linear_rewards_with_a_judge():
    """R_M = a1*fmt + a2*R; R_S = b1*fmt_sub + b2*judge + b3*R_M (judge 0 where absent)."""
    groups = [make_group([["main", "search", "search"], ["main", "search"]], [1.0, 0.5], invalid={0: (2,), 1: (0,)})]
    groups[0].episodes[0].turns[1].extra_rewards["judge"] = 0.75
    groups[0].episodes[1].turns[1].extra_rewards["judge"] = 0.25
    batch = build_credit_batch(groups, AGENTS)
    a1, a2, b1, b2, b3 = 0.2, 0.7, 0.1, 0.5, 0.4
    cfg = _cfg(main_reward="linear", sub_reward="linear", alpha_format=a1, alpha_correct=a2, beta_format=b1, beta_expert=b2, beta_main=b3)
    bd = run_credit(batch, cfg).breakdown
    RM = [a1 * 1 + a2 * 1.0, a1 * 0 + a2 * 0.5]
    RS = [b1 * 1 + b2 * 0.75 + b3 * RM[0], b1 * 0 + b2 * 0.0 + b3 * RM[0], b1 * 1 + b2 * 0.25 + b3 * RM[1]]
    torch.testing.assert_close(bd["main_reward"], torch.tensor(RM))
    torch.testing.assert_close(bd["turn_reward"][[1, 2, 4]], torch.tensor(RS))
    # mrlx ignores the judge; another expert_key reads another signal
    assert run_credit(batch, _cfg(sub_reward="linear", beta_expert=1.0, beta_format=0.0, beta_main=0.0, expert_key="other")).breakdown["turn_reward"][1] == 0.0


# --- hand-derived advantages ---------------------------------------------------------------------------


def _spec_batch():
    """d = [3, 1, 0, 4] sub calls (D_max = max = 4), rewards [1, 0, 0, 1], episode 1's sub is invalid.

    Flattened: ep0 [m s m s s m], ep1 [m s m], ep2 [m], ep3 [m s s s s m]."""
    orders = [["main", "search", "main", "search", "search", "main"], ["main", "search", "main"], ["main"],
              ["main", "search", "search", "search", "search", "main"]]
    return build_credit_batch([make_group(orders, [1.0, 0.0, 0.0, 1.0], invalid={1: (1,)})], AGENTS)


def test_hand_example_pooled():
    """R_M = [1, .1, .1, 1]: mean .55, std .45·2/√3, so main turns get ±√3/2.
    Sub rewards: ep0 3×1, ep1 1×0 (invalid), ep3 4×1.  Aligned to 4 each: ep0 3 subs + 1 copy,
    ep1 its sub 4 times, ep3 as is: 8 ones and 4 zeros, μ = 2/3, σ = sqrt((8/9 + 16/9)/11)."""
    batch = _spec_batch()
    credit = run_credit(batch, _cfg())
    bd = credit.breakdown
    main = bd["is_main"]
    a_main = math.sqrt(3) / 2 / (1 + EPS / (0.45 * 2 / math.sqrt(3)))
    torch.testing.assert_close(bd["main_advantage"], torch.tensor([a_main, -a_main, -a_main, a_main]))
    torch.testing.assert_close(credit.advantages[main], bd["main_advantage"][batch.episode_ids[main]])
    mu, sd = 2 / 3, math.sqrt((8 / 9 + 16 / 9) / 11)
    a1, a0 = (1 - mu) / (sd + EPS), (0 - mu) / (sd + EPS)
    copies = bd["copies"]
    ep = batch.episode_ids
    assert copies[~main & (ep == 0)].sum() == 4 and set(copies[~main & (ep == 0)].tolist()) == {1, 2}
    assert copies[~main & (ep == 1)].tolist() == [4] and copies[~main & (ep == 3)].tolist() == [1, 1, 1, 1]
    torch.testing.assert_close(credit.advantages[~main], copies[~main].float() * torch.where(ep[~main] == 1, a0, a1).float())
    assert bd["d_max"][~main].tolist() == [4] * 8 and bd["sub_invocations"].tolist() == [3, 1, 0, 4]
    assert bd["norm_count"][~main].tolist() == [12] * 8 and bd["norm_count"][main].tolist() == [4] * 8
    # [T] the pooled sub advantages have zero mean over the aligned items
    assert abs(float(credit.advantages[~main].sum())) < 1e-5


def _identity_batch():
    """Every rollout calls 2 subs (d ≡ D_max = 2): ep0 R=1 with its 2nd sub invalid, ep1 R=0, ep2 R=1."""
    orders = [["main", "search", "search", "main"]] * 3
    return build_credit_batch([make_group(orders, [1.0, 0.0, 1.0], invalid={0: (2,)})], AGENTS)


def test_identity_alignment_and_the_three_normalisation_sets():
    """[T] d_k ≡ D_max: every sub turn is kept once.  Sub rewards: ep0 [1, 0], ep1 [.1, .1], ep2 [1, 1].
      pooled   over [1, 0, .1, .1, 1, 1]
      rollout  [1, 0] -> ±.5/√.5; [.1, .1] and [1, 1] -> 0
      subtask  j=0 over [1, .1, 1]; j=1 over [0, .1, 1]"""
    batch = _identity_batch()
    sub = ~run_credit(batch, _cfg()).breakdown["is_main"]
    R = [1.0, 0.0, 0.1, 0.1, 1.0, 1.0]

    def z(vals, x):
        mu, sd = ref_mean_std(vals)
        return ref_apply(x, mu, sd, True, EPS)

    expected = {
        "pooled": [z(R, x) for x in R],
        "rollout": [z([1.0, 0.0], 1.0), z([1.0, 0.0], 0.0), 0.0, 0.0, 0.0, 0.0],
        "subtask": [z([1.0, 0.1, 1.0], 1.0), z([0.0, 0.1, 1.0], 0.0), z([1.0, 0.1, 1.0], 0.1), z([0.0, 0.1, 1.0], 0.1),
                    z([1.0, 0.1, 1.0], 1.0), z([0.0, 0.1, 1.0], 1.0)],
    }
    assert expected["rollout"][0] == pytest.approx(0.5 / math.sqrt(0.5) / (1 + EPS / math.sqrt(0.5)))
    for norm, exp in expected.items():
        for d_max in ("max", "median", 2):
            credit = run_credit(batch, _cfg(sub_norm=norm, d_max=d_max))
            assert credit.breakdown["copies"].tolist() == [1] * batch.num_turns
            torch.testing.assert_close(credit.advantages[sub], torch.tensor(exp, dtype=torch.float32))
    assert run_credit(batch, _cfg(sub_norm="subtask")).breakdown["sub_position"].tolist() == [-1, 0, 1, -1] * 3


def test_identical_main_rewards_give_zero_main_advantages():
    """[T] identical R_M -> main advantages 0 (all correct here, whatever the sub calls)."""
    orders = [["main", "search", "main"], ["main", "main"], ["main", "visit", "search", "main"]]
    for rewards, invalid in (([1.0, 1.0, 1.0], {}), ([1.0, 0.0, 1.0], {0: (0,), 1: (0,), 2: (3,)})):
        batch = build_credit_batch([make_group(orders, rewards, invalid=invalid)], AGENTS)
        credit = run_credit(batch, _cfg())
        assert len(set(credit.breakdown["main_reward"].tolist())) == 1
        assert torch.equal(credit.advantages[credit.breakdown["is_main"]], torch.zeros(6))


def test_scale_by_std_false_only_centres_both_levels():
    batch = _spec_batch()
    credit = run_credit(batch, _cfg(scale_by_std=False))
    main = credit.breakdown["is_main"]
    torch.testing.assert_close(credit.breakdown["main_advantage"], torch.tensor([0.45, -0.45, -0.45, 0.45]))
    item = credit.breakdown["item_advantage"][~main]
    ep = batch.episode_ids[~main]
    torch.testing.assert_close(item, torch.where(ep == 1, torch.tensor(-2 / 3), torch.tensor(1 / 3)))


def test_unknown_main_agent_and_missing_key():
    with pytest.raises(ValueError, match=r"main_agent 'boss' is not an agent of the team; valid: \['main', 'search', 'visit'\]"):
        run_credit(_spec_batch(), MGRPOConfig(main_agent="boss"))
    ta = TypeAdapter(credit_config_union())
    with pytest.raises(ValidationError, match="main_agent"):
        ta.validate_python({"method": "m_grpo"})
    with pytest.raises(ValidationError, match="d_max"):
        ta.validate_python({"method": "m_grpo", "main_agent": "main", "d_max": 0})
    cfg = ta.validate_python(yaml.safe_load("method: m_grpo\nmain_agent: lead\nd_max: 3\nsub_norm: subtask\n"))
    assert isinstance(cfg, MGRPOConfig) and cfg.d_max == 3 and cfg.sub_norm == "subtask"
    d = MGRPOConfig(main_agent="x")
    assert (d.main_reward, d.sub_reward, d.d_max, d.sub_norm, d.align_per_agent) == ("mrlx", "mrlx", "max", "pooled", True)


# --- the slow reference (STYLE 3) ----------------------------------------------------------------------


def _units(groups, cfg):
    """Per flattened turn: (is_main, unit key, pool key, position j among the unit's subs)."""
    out = []
    for b, g in enumerate(groups):
        for i, ep in enumerate(g.episodes):
            seen: dict = defaultdict(int)
            for t in ep.turns:
                if t.agent == cfg.main_agent:
                    out.append((True, None, None, -1))
                    continue
                unit = (b, i, t.agent) if cfg.align_per_agent else (b, i)
                pool = (b, t.agent) if cfg.align_per_agent else (b,)
                out.append((False, unit, pool, seen[unit]))
                seen[unit] += 1
    return out


def ref_d_max(groups, cfg):
    """D_max of each pool from the d of its units, straight from the definitions."""
    d: dict = defaultdict(int)
    pool_of: dict = {}
    for is_main, unit, pool, _ in _units(groups, cfg):
        if not is_main:
            d[unit] += 1
            pool_of[unit] = pool
    per_pool: dict = defaultdict(list)
    for unit, n in d.items():
        per_pool[pool_of[unit]].append(n)
    D = {}
    for pool, ds in per_pool.items():
        if isinstance(cfg.d_max, int):
            D[pool] = cfg.d_max
        elif cfg.d_max == "max":
            D[pool] = max(ds)
        else:
            s = sorted(ds)
            mid = (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2
            D[pool] = math.ceil(mid)
    return d, pool_of, D


def ref_m_grpo(groups, cfg, copies):
    """Advantages from the formulas by loops, given the alignment (``copies`` per turn)."""
    R_M, success = {}, {}
    for b, g in enumerate(groups):
        for i, ep in enumerate(g.episodes):
            fmt = all(t.valid for t in ep.turns if t.agent == cfg.main_agent)
            correct = ep.reward >= cfg.correct_threshold
            if cfg.main_reward == "mrlx":
                R_M[b, i] = 0.0 if not fmt else (1.0 if correct else cfg.format_score)
            else:
                R_M[b, i] = cfg.alpha_format * fmt + cfg.alpha_correct * ep.reward
            success[b, i] = fmt and correct
    main_adv = {}
    for b, g in enumerate(groups):
        mu, sd = ref_mean_std([R_M[b, i] for i in range(len(g.episodes))])
        for i in range(len(g.episodes)):
            main_adv[b, i] = ref_apply(R_M[b, i], mu, sd, cfg.scale_by_std, cfg.eps)
    flat = [(b, i, t) for b, g in enumerate(groups) for i, ep in enumerate(g.episodes) for t in ep.turns]
    units = _units(groups, cfg)
    R_S = []
    for (b, i, t) in flat:
        fmt = 1.0 if t.valid else 0.0
        if cfg.sub_reward == "mrlx":
            R_S.append(0.0 if not t.valid else (1.0 if success[b, i] else cfg.sub_format_score))
        else:
            R_S.append(cfg.beta_format * fmt + cfg.beta_expert * float(t.extra_rewards.get(cfg.expert_key, 0.0)) + cfg.beta_main * R_M[b, i])
    seg_of = []
    for (is_main, unit, pool, j) in units:
        seg_of.append(None if is_main else {"pooled": pool, "rollout": unit, "subtask": (pool, j)}[cfg.sub_norm])
    items: dict = defaultdict(list)  # the aligned multiset of each segment
    for n, seg in enumerate(seg_of):
        if seg is not None:
            items[seg] += [R_S[n]] * copies[n]
    out = []
    for n, (b, i, t) in enumerate(flat):
        if units[n][0]:
            out.append(main_adv[b, i])
        elif copies[n] == 0:
            out.append(0.0)
        else:
            mu, sd = ref_mean_std(items[seg_of[n]])
            out.append(copies[n] * ref_apply(R_S[n], mu, sd, cfg.scale_by_std, cfg.eps))
    return out


def _random(seed, B=4, G=5, T=7, ragged=False):
    rng = random.Random(seed)
    groups = random_groups(seed, B, G, T, AGENTS, ragged_groups=ragged)
    for g in groups:
        for ep in g.episodes:
            for t in ep.turns:
                if rng.random() < 0.5:
                    t.extra_rewards["judge"] = rng.random()
    return groups, build_credit_batch(groups, AGENTS)


CONFIGS = [
    dict(),
    dict(d_max="median"),
    dict(d_max=2, sub_norm="rollout"),
    dict(d_max=1, sub_norm="subtask", align_per_agent=False),
    dict(d_max="median", sub_norm="subtask"),
    dict(sub_norm="rollout", align_per_agent=False, scale_by_std=False),
    dict(d_max=3, main_reward="linear", sub_reward="linear", beta_expert=0.5),
    dict(main_reward="linear", sub_reward="mrlx", correct_threshold=0.5, eps=0.1),
]


def _check_alignment(groups, cfg, copies):
    """[T] each unit with d >= 1 contributes exactly D_max items, all its own; dropped only if d > D."""
    d, pool_of, D = ref_d_max(groups, cfg)
    per_unit: dict = defaultdict(list)
    for n, (is_main, unit, _, _) in enumerate(_units(groups, cfg)):
        if is_main:
            assert copies[n] == 1
        else:
            per_unit[unit].append(copies[n])
    for unit, cs in per_unit.items():
        target = D[pool_of[unit]]
        assert sum(cs) == target, (unit, cs, target)
        if d[unit] > target:
            assert set(cs) <= {0, 1}
        else:
            assert min(cs) >= 1
    return per_unit, D


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kw", CONFIGS, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "defaults" for c in CONFIGS])
def test_matches_reference_and_aligns_to_d_max(seed, kw):
    groups, batch = _random(seed, ragged=seed % 2 == 1)
    cfg = _cfg(**kw)
    credit = run_credit(batch, cfg)
    copies = credit.breakdown["copies"].tolist()
    per_unit, D = _check_alignment(groups, cfg, copies)
    assert per_unit, "the random batch should call sub-agents"
    torch.testing.assert_close(credit.advantages, torch.tensor(ref_m_grpo(groups, cfg, copies), dtype=torch.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("per_agent", [True, False])
def test_pooled_sub_advantages_have_zero_mean(seed, per_agent):
    """[T] §10 row 18: over the aligned items of each pool, Σ A = 0 and (non-degenerate) std 1."""
    groups, batch = _random(seed)
    cfg = _cfg(d_max="median", align_per_agent=per_agent, sub_reward="linear", beta_expert=0.5)  # the judge adds variety
    credit = run_credit(batch, cfg)
    bd, adv = credit.breakdown, credit.advantages.double()
    sub = ~bd["is_main"]
    pool = batch.group_ids * len(AGENTS) + batch.agent_ids if per_agent else batch.group_ids
    checked = 0
    for p in torch.unique(pool[sub]).tolist():
        sel = sub & (pool == p)
        item_values = torch.repeat_interleave(bd["item_advantage"][sel].double(), bd["copies"][sel])  # [K·D_max]
        if item_values.numel() == 1:  # one aligned item: no comparison, 0 (as a one-rollout GRPO group)
            assert float(item_values[0]) == 0.0
            continue
        assert abs(float(adv[sel].sum())) < 1e-5  # Σ_turns copies·A = Σ_items A
        assert abs(float(item_values.mean())) < 1e-6
        rs = bd["turn_reward"][sel][bd["copies"][sel] > 0]
        if item_values.numel() > 1 and float(rs.max() - rs.min()) > 0:
            sigma = float(bd["norm_std"][sel & (bd["copies"] > 0)][0])  # ddof-1 std of the aligned rewards; A = (R - μ)/(σ + ε)
            assert float(item_values.std()) == pytest.approx(sigma / (sigma + EPS), abs=1e-5)
            assert sigma / (sigma + EPS) == pytest.approx(1.0, abs=1e-3)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("seed", range(4))
def test_gradient_equals_the_duplicate_weighted_sum(seed):
    """§3.7 / §10 row 22: training on the aligned multiset (each item its own sample with its own
    A) gives the same policy gradient as training on the turns with the returned advantages.
    Policy: a linear log-probability logπ_n = φ_n·w per turn."""
    groups, batch = _random(seed)
    cfg = _cfg(d_max=2)
    credit = run_credit(batch, cfg)
    bd = credit.breakdown
    sub = torch.nonzero(~bd["is_main"]).flatten()
    copies = bd["copies"][sub]
    assert int(copies.max()) >= 2 and int(copies.min()) == 0  # duplicates and drops both happen
    # the aligned items and their advantages, from the reference multiset statistics
    items = torch.repeat_interleave(sub, copies)  # [K·D_max] turn of each item
    ref = torch.tensor(ref_m_grpo(groups, cfg, bd["copies"].tolist()), dtype=torch.float64)
    item_adv = (ref / bd["copies"].clamp(min=1).double())[items]  # A of one item
    assert float(item_adv.sum()) == pytest.approx(float((bd["copies"][sub].double() * bd["item_advantage"][sub].double()).sum()), abs=1e-5)
    gen = torch.Generator().manual_seed(seed)
    phi = torch.randn(batch.num_turns, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    logp = phi @ w  # [N]
    (g_items,) = torch.autograd.grad(-(item_adv * logp[items]).sum(), w, retain_graph=True)
    (g_turns,) = torch.autograd.grad(-(credit.advantages.double()[sub] * logp[sub]).sum(), w)
    torch.testing.assert_close(g_turns, g_items, rtol=1e-5, atol=1e-5)


# --- randomness of the alignment ------------------------------------------------------------------


def _draw_batch():
    """One task: ep0 calls 4 subs, ep1 2, ep2 1; rewards differ so no segment is constant."""
    orders = [["main", "search", "search", "search", "search", "main"], ["main", "search", "search", "main"], ["main", "search", "main"]]
    return build_credit_batch([make_group(orders, [1.0, 0.0, 1.0], invalid={0: (2,)})], AGENTS)


def test_drops_and_duplicates_are_uniform():
    """d_max=2: ep0 keeps each of its 4 subs with probability 1/2; d_max=3: ep1's one extra copy
    goes to either sub with probability 1/2, ep2's single sub is copied 3 times."""
    batch = _draw_batch()
    n = 400
    keep = torch.zeros(4)
    extra = torch.zeros(2)
    for s in range(n):
        c2 = run_credit(batch, _cfg(d_max=2, seed=s)).breakdown["copies"]
        keep += c2[1:5].float()
        c3 = run_credit(batch, _cfg(d_max=3, seed=s)).breakdown["copies"]
        extra += (c3[7:9] == 2).float()
        assert c3[11] == 3
    # binomial(400, 1/2): sd 10, so ±50 is 5 sd
    assert all(abs(k - n / 2) < 50 for k in keep.tolist()), keep
    assert all(abs(e - n / 2) < 50 for e in extra.tolist()), extra
    assert float(keep.sum()) == 2 * n and float(extra.sum()) == n


def test_alignment_is_a_pure_function_of_batch_and_seed():
    batch = _draw_batch()
    a = run_credit(batch, _cfg(d_max=2, seed=1)).breakdown["copies"]
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(run_credit(batch, _cfg(d_max=2, seed=1)).breakdown["copies"], a)
    assert any(not torch.equal(run_credit(batch, _cfg(d_max=2, seed=s)).breakdown["copies"], a) for s in range(2, 12))
    state = torch.get_rng_state()
    run_credit(batch, _cfg(d_max=2, seed=1))
    assert torch.equal(torch.get_rng_state(), state)  # nor is it consumed


def test_per_agent_alignment_keeps_sub_agents_apart():
    """align_per_agent: the visit agent's calls neither take the search agent's slots nor move its
    statistics; pooled, both share one set of D_max slots per rollout."""
    a = [["main", "search", "visit", "visit", "main"], ["main", "search", "main"], ["main", "search", "visit", "main"]]
    b = [["main", "search", "main"], ["main", "search", "visit", "visit", "visit", "main"], ["main", "search", "main"]]
    ba = build_credit_batch([make_group(a, [1.0, 0.0, 1.0], invalid={0: (3,)})], AGENTS)
    bb = build_credit_batch([make_group(b, [1.0, 0.0, 1.0], invalid={1: (4,)})], AGENTS)
    search_a, search_b = ba.agent_ids == 1, bb.agent_ids == 1
    ca, cb = run_credit(ba, _cfg()), run_credit(bb, _cfg())
    assert ca.breakdown["copies"][search_a].tolist() == [1, 1, 1]  # search: d ≡ 1 = D_max
    torch.testing.assert_close(ca.advantages[search_a], cb.advantages[search_b])
    visit = ba.agent_ids == 2
    assert int(ca.breakdown["copies"][visit].sum()) == 4 and ca.breakdown["d_max"][visit].tolist() == [2, 2, 2]
    pooled = run_credit(ba, _cfg(align_per_agent=False)).breakdown
    assert pooled["d_max"][~pooled["is_main"]].tolist() == [3] * 6  # max over rollouts of all sub calls
    assert int(pooled["copies"][~pooled["is_main"]].sum()) == 9


# --- through the real engine with scripted agents --------------------------------------------------


def _team(model_dir, topology, credit, max_turns=4):
    cfg = team_config(model_dir, topology, credit=credit)
    if topology == "orchestrator":
        cfg["topology"] = {**cfg["topology"], "max_turns": max_turns}
    return cfg


def test_end_to_end_orchestrator_with_scripted_agents(tiny_tokenizer):
    """Scripted orchestrator: in sample g of task t the lead makes PLAN[t][g] calls, alternating
    helper and checker, then answers.  The helper's 2nd reply in a rollout is malformed.  The
    team is correct when the lead made at least 2 calls."""
    from mas.agents.agent import build_agents
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.config.schema import validate_config
    from mas.rollout.engine import Engine
    from mas.topologies import build_topology

    PLAN = {"1+1": [0, 1, 3, 4], "2+2": [2, 2, 1, 5]}
    seen: dict[str, int] = defaultdict(int)

    def respond(req):
        msgs = req.messages
        if req.agent == "lead":
            said = [m["content"] for m in msgs if m["role"] == "assistant"]
            task = next(m["content"] for m in msgs if m["content"].startswith("Task: "))[6:]
            if not said:  # first turn: episodes arrive in order
                total = PLAN[task][seen[task]]
                seen[task] += 1
            else:
                total = int(said[0].split("of ")[1]) if said[0].startswith("CALL") else 0
            if len(said) < total:
                who = "helper" if len(said) % 2 == 0 else "checker"
                return f"CALL {who}: step {len(said) + 1} of {total}"
            return "ANSWER: 2"
        if req.agent == "helper":
            return "no idea" if "step 3 " in msgs[-1]["content"] else "ANSWER: 7"
        return "ACCEPT"

    def score(ep):
        return float(sum(t.agent != "lead" for t in ep.turns) >= 2)

    run = validate_config(_team("m", "orchestrator", {"method": "m_grpo", "main_agent": "lead"}, max_turns=12))
    toks = {p: tiny_tokenizer for p in run.policies}
    engine = Engine(build_topology(run.topology), build_agents(run.agents, run.team.name), toks, {p: True for p in run.policies},
                    ScriptedBackend(respond, toks), score)
    groups = engine.rollout([Task("t0", "1+1", "2"), Task("t1", "2+2", "4")], group_size=4, seed=0)
    names = ["lead", "helper", "checker"]
    calls = [sum(t.agent != "lead" for t in ep.turns) for g in groups for ep in g.episodes]
    assert calls == PLAN["1+1"] + PLAN["2+2"]
    assert any(not t.valid for g in groups for ep in g.episodes for t in ep.turns if t.agent == "helper")
    batch = build_credit_batch(groups, names)
    for kw in (dict(), dict(align_per_agent=False, d_max="median"), dict(d_max=2, sub_norm="subtask")):
        cfg = MGRPOConfig(main_agent="lead", **kw)
        credit = run_credit(batch, cfg)
        copies = credit.breakdown["copies"].tolist()
        _check_alignment(groups, cfg, copies)
        torch.testing.assert_close(credit.advantages, torch.tensor(ref_m_grpo(groups, cfg, copies), dtype=torch.float32), rtol=1e-5, atol=1e-5)
    # default: per sub-agent, D_max = max calls; task 1+1's helper: d = [0, 1, 2, 2] -> D = 2
    bd = run_credit(batch, MGRPOConfig(main_agent="lead")).breakdown
    helper_t0 = (batch.agent_ids == 1) & (batch.group_ids == 0)
    assert set(bd["d_max"][helper_t0].tolist()) == {2} and int(bd["copies"][helper_t0].sum()) == 2 * 3


# --- 3 training steps on a tiny random model --------------------------------------------------------


def _smoke(tmp_path, model_dir, topology, credit):
    from mas.training.trainer import train_step

    team, rows = train_smoke(tmp_path, _team(model_dir, topology, credit))
    return team, rows, train_step


def test_three_training_steps_orchestrator(tmp_path, tiny_model_dir):
    """main_agent = the orchestrator.  A random orchestrator never writes a valid CALL/ANSWER, so
    MrlX's format gate would make every R_M 0 (no gradient); the linear main reward keeps the
    parity reward's variance."""
    credit = {"method": "m_grpo", "main_agent": "lead", "main_reward": "linear", "sub_reward": "linear"}
    team, rows, train_step = _smoke(tmp_path, tiny_model_dir, "orchestrator", credit)
    result = train_step(team, 3)
    assert result.credit.breakdown["main_format"].sum() == 0  # why mrlx gives no signal here
    assert bool(result.credit.breakdown["is_main"].any())


def test_three_training_steps_chain_trains_sub_agents(tmp_path, tiny_model_dir):
    """Chain lead -> helper -> checker: every rollout calls sub-agents, so the aligned path trains."""
    credit = {"method": "m_grpo", "main_agent": "lead", "main_reward": "linear", "sub_reward": "linear", "d_max": "median"}
    team, rows, train_step = _smoke(tmp_path, tiny_model_dir, "chain", credit)
    result = train_step(team, 3)
    bd = result.credit.breakdown
    helper = torch.tensor([t.agent == "helper" for g in result.groups for ep in g.episodes for t in ep.turns])
    assert bool(helper.any()) and bool((result.credit.advantages[helper] != 0).any())
    assert int(bd["copies"][helper].min()) >= 1  # helper and checker act once per pass: d ≡ D_max


def test_dropped_sub_turns_are_left_out_of_the_update():
    """A sub turn alignment drops (copies = 0) is masked out of training, not trained with A = 0."""
    import torch

    from mas.credit import build_credit_batch, run_credit
    from mas.credit.mgrpo import MGRPOConfig

    from credit_reference import make_group  # tests/credit helper: episodes from agent lists and rewards

    groups = [make_group([["main", "sub", "sub", "sub"], ["main", "sub"]], [1.0, 0.0])]
    batch = build_credit_batch(groups, ["main", "sub"])
    credit = run_credit(batch, MGRPOConfig(main_agent="main", d_max=1), None)
    copies = credit.breakdown["copies"]
    assert int((copies == 0).sum()) == 2  # rollout 0 keeps 1 of its 3 sub turns
    assert torch.equal(credit.train_mask, copies > 0)
