"""CCPO (CREDIT_SPEC §6, §10 rows 16–17 and 20): the remove-the-upstream-agent plan, the v2 bonus
table and centred GRPO, the v1 history normaliser and its state, the Shapley fallback, slow
references, an example through the real engine, and training smoke runs (one alternating)."""

from __future__ import annotations

import json
import math
import random

import pytest
from team_helpers import dyad_config as _dyad
import torch
from credit_reference import make_group, random_groups
from pydantic import TypeAdapter, ValidationError

from mas.agents.agent import build_agents
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import validate_config
from mas.credit import build_credit_batch, credit_config_union, plan_credit, run_credit
from mas.credit import ccpo as ccpo_mod
from mas.credit.ccpo import CCPOConfig, event_bonus, shapley_two_player
from mas.rollout.engine import Engine
from mas.training.team import build_team
from mas.topologies import build_topology
from mas.training.trainer import train, train_step
from mas.types import Episode, EpisodeGroup, InterventionRequest, Task

EPS = 1e-6
AGENTS = ["thinker", "solver"]


@pytest.fixture(autouse=True)
def _fresh_history():
    """v1 keeps its EMA history in the module: every test starts (and leaves) it empty."""
    ccpo_mod.reset_state()
    yield
    ccpo_mod.reset_state()


# --- helpers ---------------------------------------------------------------------------------


def dyad_groups(rewards: list[list[float]]) -> list[EpisodeGroup]:
    """One task group per row; every episode is thinker -> solver."""
    return [make_group([AGENTS] * len(rs), rs, group_id=b) for b, rs in enumerate(rewards)]


def solo_results(groups, cfg, solo: list[float] | dict[str, list[float]], failed: set[str] = frozenset()) -> dict:
    """Counterfactual results: a list gives one solo reward per planned request, in plan order."""
    reqs = plan_credit(groups, cfg)
    if isinstance(solo, list):
        solo = {r.key: [x] for r, x in zip(reqs, solo, strict=True)}
    return {r.key: [Episode(task=r.source.task, group_id=0, sample_id=0, seed=0, reward=x, status="error" if r.key in failed else "ok") for x in solo[r.key]]
            for r in reqs}


def credit_of(groups, cfg, results, agents=AGENTS, dtype=torch.float32):
    return run_credit(build_credit_batch(groups, agents), cfg, results, dtype=dtype)


def seg_stats(xs: list[float]) -> tuple[float, float]:
    """The project's statistics: ddof 1; a singleton or a constant segment (x, 0), so it gives 0."""
    if all(x == xs[0] for x in xs):
        return xs[0], 0.0
    mu = sum(xs) / len(xs)
    return mu, math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def grpo_by_role(groups, turn_reward: dict, is_up: dict, scale: bool) -> list[float]:
    """GRPO per (task group, role) over turns; turn_reward/is_up keyed by (e, t)."""
    out: dict = {}
    e0 = 0
    for g in groups:
        keys = [(e0 + i, t) for i, ep in enumerate(g.episodes) for t in range(len(ep.turns))]
        for role in (True, False):
            sel = [k for k in keys if is_up[k] == role]
            if not sel:
                continue
            mu, sd = seg_stats([turn_reward[k] for k in sel])
            for k in sel:
                c = turn_reward[k] - mu
                out[k] = c / (sd + EPS) if scale else c
        e0 += len(g.episodes)
    flat = [(e, t) for e, ep in enumerate(ep for g in groups for ep in g.episodes) for t in range(len(ep.turns))]
    return [out[k] for k in flat]


# --- slow references ---------------------------------------------------------------------------


def _ref_setup(groups, results, cfg):
    sgn = (lambda x: 2 * x - 1) if cfg.reward_sign else (lambda x: x)
    eps_ = [ep for g in groups for ep in g.episodes]
    gid = [b for b, g in enumerate(groups) for _ in g.episodes]
    solo = {e: [sgn(x.reward) for i in range(cfg.solo_samples) for x in results[f"ccpo/{e}/{i}"] if x.status != "error"]
            for e, ep in enumerate(eps_) if ep.turns}
    up = {e: cfg.upstream or (ep.turns[0].agent if ep.turns else None) for e, ep in enumerate(eps_)}
    is_up = {(e, t): tr.agent == up[e] for e, ep in enumerate(eps_) for t, tr in enumerate(ep.turns)}
    group_solo = {}
    for b in range(len(groups)):
        xs = [x for e in solo if gid[e] == b for x in solo[e]]
        group_solo[b] = sum(xs) / len(xs) if xs else None
    return sgn, eps_, gid, solo, is_up, group_solo


def ref_ccpo_v2(groups, results, cfg: CCPOConfig) -> list[float]:
    """§6.4 pseudo-code, generalised: b = group mean of the usable solo rewards (0 if none)."""
    sgn, eps_, gid, _, is_up, group_solo = _ref_setup(groups, results, cfg)
    turn_reward = {}
    for e, ep in enumerate(eps_):
        rj = sgn(ep.reward)
        b = group_solo[gid[e]] or 0.0
        if cfg.bonus == "event":
            bonus = (1.0 if rj > 0 and b < 0 else 0.0) - (1.0 if rj < 0 and b > 0 else 0.0)
        else:
            bonus = (rj - b) / 2
        for t in range(len(ep.turns)):
            turn_reward[(e, t)] = rj + cfg.lam * bonus if is_up[(e, t)] else rj
    return grpo_by_role(groups, turn_reward, is_up, scale=bool(cfg.grpo_scale_by_std))


class RefHistory:
    """§6.2's EMA history written out with plain floats."""

    def __init__(self):
        self.stats = {k: None for k in ("d", "j", "s")}  # (mean, m2)
        self.count = 0

    def sd(self, k, eps):
        m2 = self.stats[k][1]
        return math.sqrt(m2) if m2 > eps else 1.0

    def update(self, cols: dict[str, list[float]], decay: float):
        if not cols["d"]:
            return
        for k, xs in cols.items():
            mu = sum(xs) / len(xs)
            var = sum((x - mu) ** 2 for x in xs) / len(xs)
            if self.stats[k] is None:
                self.stats[k] = (mu, var)
            else:
                m, v = self.stats[k]
                self.stats[k] = (decay * m + (1 - decay) * mu, decay * v + (1 - decay) * var)
        self.count += len(cols["d"])


def ref_ccpo_v1(groups, results, cfg: CCPOConfig, hist: RefHistory) -> list[float]:
    sgn, eps_, gid, solo, is_up, group_solo = _ref_setup(groups, results, cfg)
    r1, r2, cols = {}, {}, {"d": [], "j": [], "s": []}
    warm = hist.count < max(cfg.min_samples, 1)  # no statistics yet: pass through
    for e, ep in enumerate(eps_):
        rj = sgn(ep.reward)
        if solo.get(e):
            rs = sum(solo[e]) / len(solo[e])
        elif group_solo[gid[e]] is not None:
            rs = group_solo[gid[e]]
        else:
            rs = rj
        d = rj - rs
        if warm:
            r1[e], r2[e] = (0.5 * d, 0.5 * rj + 0.5 * rs) if cfg.v1_warmup == "shapley" else (d, rj)
        else:
            (md, _), (mj, _), (ms, _) = hist.stats["d"], hist.stats["j"], hist.stats["s"]
            sdd, sdj, sds = hist.sd("d", cfg.eps), hist.sd("j", cfg.eps), hist.sd("s", cfg.eps)
            r1[e] = math.tanh(cfg.alpha * (d - md) / (sdd + cfg.eps))
            g = 1 / (1 + math.exp(-cfg.eta * md / (sdd + cfg.eps)))
            r2[e] = g * (rj - mj) / (sdj + cfg.eps) + (1 - g) * (rs - ms) / (sds + cfg.eps)
        if ep.turns:
            cols["d"].append(d)
            cols["j"].append(rj)
            cols["s"].append(rs)
    hist.update(cols, cfg.ema_decay)
    turn_reward = {(e, t): (r1[e] if is_up[(e, t)] else r2[e]) for e, ep in enumerate(eps_) for t in range(len(ep.turns))}
    scale = True if cfg.grpo_scale_by_std is None else cfg.grpo_scale_by_std
    return grpo_by_role(groups, turn_reward, is_up, scale=scale)


def random_solo(groups, cfg, seed):
    rng = random.Random(seed)
    discrete = rng.random() < 0.6
    reqs = plan_credit(groups, cfg)
    return {r.key: [Episode(task=r.source.task, group_id=0, sample_id=0, seed=0,
                            reward=rng.choice([0.0, 1.0]) if discrete else rng.uniform(-1, 1), status="error" if rng.random() < 0.15 else "ok")]
            for r in reqs}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("opts", [{}, {"solo_samples": 3}, {"bonus": "margin", "lam": 0.7}, {"reward_sign": False, "upstream": "b"}, {"grpo_scale_by_std": True}])
def test_v2_vectorised_equals_reference(seed, opts):
    groups = random_groups(seed, 3, 4, 4, ["a", "b", "c"], min_turns=0, ragged_groups=True)
    cfg = CCPOConfig(**opts)
    results = random_solo(groups, cfg, seed)
    got = credit_of(groups, cfg, results, ["a", "b", "c"], dtype=torch.float64).advantages
    torch.testing.assert_close(got, torch.tensor(ref_ccpo_v2(groups, results, cfg), dtype=torch.float64), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("opts", [{"min_samples": 8}, {"min_samples": 0, "ema_decay": 0.5, "solo_samples": 2}, {"v1_warmup": "raw", "min_samples": 15, "alpha": 2.0, "eta": 0.5}])
def test_v1_vectorised_equals_reference_over_consecutive_steps(seed, opts):
    cfg = CCPOConfig(version="v1", **opts)
    hist = RefHistory()
    for step in range(4):  # crosses the warm-up boundary
        groups = random_groups(100 * seed + step, 2, 4, 3, ["a", "b"], min_turns=0, ragged_groups=True)
        results = random_solo(groups, cfg, 100 * seed + step)
        got = credit_of(groups, cfg, results, ["a", "b"], dtype=torch.float64).advantages
        expected = ref_ccpo_v1(groups, results, cfg, hist)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=1e-10, rtol=1e-10)
        assert ccpo_mod.history(cfg).count == hist.count


# --- the plan -------------------------------------------------------------------------------------


def test_plan_removes_the_upstream_agent_once_per_solo_sample():
    groups = dyad_groups([[1.0, 0.0]])
    groups[0].episodes[1].turns.reverse()  # this episode starts with the solver
    for t, turn in enumerate(groups[0].episodes[1].turns):
        turn.index = t
    reqs = plan_credit(groups, CCPOConfig(solo_samples=2))
    assert all(isinstance(r, InterventionRequest) and r.mode == "remove" and not r.keep_others for r in reqs)
    assert [(r.key, r.agents) for r in reqs] == [
        ("ccpo/0/0", ("thinker",)), ("ccpo/0/1", ("thinker",)), ("ccpo/1/0", ("solver",)), ("ccpo/1/1", ("solver",))
    ]
    assert reqs[2].source is groups[0].episodes[1]
    assert {r.agents for r in plan_credit(groups, CCPOConfig(upstream="thinker"))} == {("thinker",)}
    groups[0].episodes[0].turns = []  # an episode without turns gets no counterfactual
    assert [r.key for r in plan_credit(groups, CCPOConfig())] == ["ccpo/1/0"]


def test_missing_counterfactuals_and_unknown_upstream_are_errors():
    groups = dyad_groups([[1.0, 0.0]])
    with pytest.raises(ValueError, match="ccpo/0/0"):
        credit_of(groups, CCPOConfig(), None)
    cfg = CCPOConfig(upstream="nobody")
    with pytest.raises(ValueError, match="nobody"):
        credit_of(groups, cfg, solo_results(groups, cfg, [0.0, 0.0]))


def test_config_schema():
    union = TypeAdapter(credit_config_union())
    cfg = union.validate_python({"method": "ccpo", "version": "v1", "upstream": "thinker"})
    assert isinstance(cfg, CCPOConfig) and cfg.version == "v1" and cfg.upstream == "thinker"
    d = CCPOConfig()
    assert (d.version, d.lam, d.solo_samples, d.reward_sign, d.bonus, d.ema_decay, d.min_samples, d.alpha, d.eta) == ("v2", 0.2, 1, True, "event", 0.99, 10, 1.0, 1.0)
    for bad in ({"version": "v3"}, {"solo_samples": 0}, {"ema_decay": 0.0}, {"lamda": 0.2}):
        with pytest.raises(ValidationError):
            union.validate_python({"method": "ccpo", **bad})


# --- v2 [T] properties and hand examples ----------------------------------------------------------------


def test_bonus_table():
    """§6.3: bonus = 1[R_joint > 0 ∧ b < 0] − 1[R_joint < 0 ∧ b > 0], written out."""
    table = [  # (R_joint, b, bonus)
        (+1.0, -0.5, +1.0),  # the team succeeded where the solver alone usually fails
        (+1.0, +0.5, 0.0),
        (+1.0, 0.0, 0.0),
        (-1.0, +0.5, -1.0),  # the team failed where the solver alone usually succeeds
        (-1.0, -0.5, 0.0),
        (-1.0, 0.0, 0.0),
        (0.0, -1.0, 0.0),
        (0.0, +1.0, 0.0),
        (0.0, 0.0, 0.0),
    ]
    rj, b, expected = (torch.tensor(col, dtype=torch.float64) for col in zip(*table))
    assert event_bonus(rj, b).tolist() == expected.tolist()


def test_bonus_fires_only_when_the_signs_disagree():
    rng = random.Random(0)
    rj = torch.tensor([rng.choice([-1.0, 0.0, 1.0, rng.uniform(-1, 1)]) for _ in range(500)], dtype=torch.float64)
    b = torch.tensor([rng.choice([-1.0, 0.0, 1.0, rng.uniform(-1, 1)]) for _ in range(500)], dtype=torch.float64)
    bonus = event_bonus(rj, b)
    disagree = torch.sign(rj) * torch.sign(b) < 0
    assert torch.equal(bonus != 0, disagree)
    assert torch.equal(bonus[disagree], torch.sign(rj[disagree]))


def test_v2_hand_example():
    """Rewards 0/1 -> ±1.  Joint [1, 0, 1] -> [+1, −1, +1]; solo [0, 0, 1] -> [−1, −1, +1], b = −1/3.
    bonus = [+1, 0, +1] (only R_joint > 0 with b < 0 fires); r_thinker = [1.2, −1, 1.2] with λ = 0.2,
    r_solver = [1, −1, 1].  Centred per role: thinker 1.2 − 7/15 = 11/15, −1 − 7/15 = −22/15;
    solver 1 − 1/3 = 2/3, −1 − 1/3 = −4/3."""
    groups = dyad_groups([[1.0, 0.0, 1.0]])
    cfg = CCPOConfig()
    c = credit_of(groups, cfg, solo_results(groups, cfg, [0.0, 0.0, 1.0]))
    torch.testing.assert_close(c.advantages, torch.tensor([11 / 15, 2 / 3, -22 / 15, -4 / 3, 11 / 15, 2 / 3]))
    torch.testing.assert_close(c.breakdown["solo_baseline"], torch.full((3,), -1 / 3))
    assert c.breakdown["bonus"].tolist() == [1.0, 0.0, 1.0]
    torch.testing.assert_close(c.breakdown["r_upstream"], torch.tensor([1.2, -1.0, 1.2]))
    assert c.breakdown["upstream"].tolist() == [True, False] * 3


@pytest.mark.parametrize("seed", range(4))
def test_lambda_zero_gives_both_roles_the_joint_reward(seed):
    """§6.7 / §10 row 16: λ = 0 -> r_thinker = r_solver = R_joint, so both roles get the same advantage."""
    rng = random.Random(seed)
    groups = dyad_groups([[float(rng.choice([0.0, 1.0])) for _ in range(4)] for _ in range(2)])
    cfg = CCPOConfig(lam=0.0)
    c = credit_of(groups, cfg, solo_results(groups, cfg, [rng.choice([0.0, 1.0]) for _ in range(8)]))
    rj = torch.tensor([2 * ep.reward - 1 for g in groups for ep in g.episodes])
    assert torch.equal(c.breakdown["r_upstream"], rj) and torch.equal(c.breakdown["r_downstream"], rj)
    adv = c.advantages.view(8, 2)
    assert torch.equal(adv[:, 0], adv[:, 1])


def test_reward_sign_maps_zero_one_to_plus_minus_one():
    groups = dyad_groups([[1.0, 0.0]])
    for sign, expected in ((True, [1.0, -1.0]), (False, [1.0, 0.0])):
        cfg = CCPOConfig(reward_sign=sign)
        assert credit_of(groups, cfg, solo_results(groups, cfg, [0.0, 0.0])).breakdown["r_joint"].tolist() == expected
    # without the map, 0/1 rewards and a 0/1 solo baseline never disagree in sign: no bonus
    cfg = CCPOConfig(reward_sign=False)
    assert credit_of(groups, cfg, solo_results(groups, cfg, [0.0, 0.0])).breakdown["bonus"].tolist() == [0.0, 0.0]


def test_failed_counterfactuals_are_left_out_of_the_baseline():
    groups = dyad_groups([[1.0, 1.0, 1.0]])
    cfg = CCPOConfig()
    res = solo_results(groups, cfg, [0.0, 1.0, 1.0], failed={"ccpo/1/0", "ccpo/2/0"})
    c = credit_of(groups, cfg, res)
    assert c.breakdown["solo_baseline"].tolist() == [-1.0] * 3 and c.breakdown["bonus"].tolist() == [1.0] * 3
    assert c.breakdown["counterfactual_failures"].item() == 2 and c.breakdown["counterfactuals"].item() == 1
    res = solo_results(groups, cfg, [0.0, 0.0, 0.0], failed={"ccpo/0/0", "ccpo/1/0", "ccpo/2/0"})
    assert credit_of(groups, cfg, res).breakdown["bonus"].tolist() == [0.0] * 3  # b = 0 without solo runs


# --- v1 -----------------------------------------------------------------------------------------------


def test_shapley_fallback_is_efficient():
    """§6.2 / §10 row 20: φ₁ = ½(R_joint − R_solo), φ₂ = ½R_joint + ½R_solo, φ₁ + φ₂ = R_joint."""
    phi1, phi2 = shapley_two_player(torch.tensor([1.0, 1.0, -1.0, 0.5]), torch.tensor([-1.0, 1.0, 1.0, 0.25]))
    assert phi1.tolist() == [1.0, 0.0, -1.0, 0.125] and phi2.tolist() == [0.0, 1.0, 0.0, 0.375]
    rng = torch.Generator().manual_seed(0)
    rj, rs = torch.randn(100, generator=rng, dtype=torch.float64), torch.randn(100, generator=rng, dtype=torch.float64)
    phi1, phi2 = shapley_two_player(rj, rs)
    torch.testing.assert_close(phi1 + phi2, rj)


def test_v1_hand_example_warm_up_then_history():
    """reward_sign off, decay 0.5, min_samples 2.
    Step 1 (history empty -> pass-through, Shapley split): R_joint [1, 0], R_solo [0, 0], Δ [1, 0];
      r1 = Δ/2 = [.5, 0], r2 = (R_joint + R_solo)/2 = [.5, 0].  The history then copies the batch
      statistics: μ_Δ = .5, m2_Δ = .25; μ_J = .5, m2_J = .25; μ_S = 0, m2_S = 0 (-> σ_S = 1).
    Step 2, shaped with step 1's statistics: R_joint [1, 1], R_solo [1, 0], Δ [0, 1];
      r1 = tanh((Δ − .5)/(.5 + ε)) ≈ [−tanh 1, tanh 1]; g = sigmoid(.5/(.5 + ε)) ≈ sigmoid(1);
      z_J = (1 − .5)/(.5 + ε) ≈ 1, z_S = R_solo/(1 + ε); r2 = g·z_J + (1 − g)·z_S ≈ [1, g].
      Then μ_Δ = .5·.5 + .5·.5 = .5, m2_Δ = .5·.25 + .5·.25 = .25, μ_S = .5·0 + .5·.5 = .25."""
    cfg = CCPOConfig(version="v1", reward_sign=False, ema_decay=0.5, min_samples=2)
    g1 = dyad_groups([[1.0, 0.0]])
    c1 = credit_of(g1, cfg, solo_results(g1, cfg, [0.0, 0.0]))
    assert c1.breakdown["warmup"].item() == 1.0
    assert c1.breakdown["r_upstream"].tolist() == [0.5, 0.0] and c1.breakdown["r_downstream"].tolist() == [0.5, 0.0]
    h = ccpo_mod.history(cfg)
    assert (h.delta.mean, h.delta.m2, h.joint.mean, h.joint.m2, h.solo.mean, h.solo.m2, h.count) == (0.5, 0.25, 0.5, 0.25, 0.0, 0.0, 2)

    g2 = dyad_groups([[1.0, 1.0]])
    c2 = credit_of(g2, cfg, solo_results(g2, cfg, [1.0, 0.0]))
    e = 1e-6
    g = 1 / (1 + math.exp(-0.5 / (0.5 + e)))
    assert c2.breakdown["warmup"].item() == 0.0 and c2.breakdown["gate"].item() == pytest.approx(g)
    assert c2.breakdown["r_upstream"].tolist() == pytest.approx([math.tanh(-0.5 / (0.5 + e)), math.tanh(0.5 / (0.5 + e))])
    zj = 0.5 / (0.5 + e)
    assert c2.breakdown["r_downstream"].tolist() == pytest.approx([g * zj + (1 - g) / (1 + e), g * zj])
    assert (h.delta.mean, h.delta.m2, h.solo.mean, h.count) == (0.5, 0.25, 0.25, 4)
    # GRPO (with std, v1's default) per role: two distinct values -> ±1/√2 each
    torch.testing.assert_close(c2.advantages, torch.tensor([-1, 1, 1, -1]) / math.sqrt(2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("seed", range(3))
def test_v1_r1_is_inside_minus_one_one_and_the_gate_inside_zero_one(seed):
    """§6.7 / §10 row 17."""
    rng = random.Random(seed)
    cfg = CCPOConfig(version="v1", min_samples=4)
    for step in range(6):
        groups = dyad_groups([[rng.choice([0.0, 1.0]) for _ in range(4)] for _ in range(2)])
        c = credit_of(groups, cfg, solo_results(groups, cfg, [rng.choice([0.0, 1.0]) for _ in range(8)]))
        if step > 0:
            assert c.breakdown["warmup"].item() == 0.0
            assert c.breakdown["r_upstream"].abs().max().item() < 1.0
            assert 0.0 < c.breakdown["gate"].item() < 1.0


def test_a_solver_that_ignores_the_thought_gives_the_thinker_zero_advantage():
    """§6.7: R_solo ≡ R_joint -> Δ ≡ 0 -> r1 is constant -> the thinker's GRPO advantage is 0,
    in warm-up (r1 = Δ/2 = 0) and after it (r1 = tanh(−μ_Δ/(σ_Δ + ε)), the same for everyone)."""
    rng = random.Random(1)
    cfg = CCPOConfig(version="v1", min_samples=8)
    warm = []
    for _ in range(3):
        rewards = [[rng.choice([0.0, 1.0]) for _ in range(4)] for _ in range(2)]
        groups = dyad_groups(rewards)
        c = credit_of(groups, cfg, solo_results(groups, cfg, [r for rs in rewards for r in rs]))
        up = c.breakdown["upstream"]
        warm.append(c.breakdown["warmup"].item())
        assert c.breakdown["delta"].abs().max().item() == 0.0
        assert c.advantages[up].tolist() == [0.0] * 8
        assert c.advantages[~up].abs().max().item() > 0  # the solver's own outcome still counts
    assert warm == [1.0, 0.0, 0.0]


def test_v1_state_round_trips_through_state_dict():
    """What a checkpoint must save and a resume restore: the next step is reproduced exactly."""
    cfg = CCPOConfig(version="v1", min_samples=4)
    rng = random.Random(3)
    batches = []
    for _ in range(4):
        groups = dyad_groups([[rng.choice([0.0, 1.0]) for _ in range(3)] for _ in range(2)])
        batches.append((groups, solo_results(groups, cfg, [rng.choice([0.0, 1.0]) for _ in range(6)])))
    for groups, res in batches[:3]:
        credit_of(groups, cfg, res)
    saved = json.loads(json.dumps(ccpo_mod.state_dict()))  # JSON-serialisable
    straight = credit_of(*batches[3][:1], cfg, batches[3][1]).advantages
    ccpo_mod.reset_state()
    fresh = credit_of(*batches[3][:1], cfg, batches[3][1])
    assert fresh.breakdown["warmup"].item() == 1.0  # a reset forgets the history
    ccpo_mod.load_state_dict(saved)
    assert torch.equal(credit_of(*batches[3][:1], cfg, batches[3][1]).advantages, straight)
    # histories are per config
    other = CCPOConfig(version="v1", min_samples=4, alpha=2.0)
    assert credit_of(*batches[0][:1], other, batches[0][1]).breakdown["history_count"].item() == 0


# --- through the real engine -------------------------------------------------------------------------


def dyad_config(model_dir, credit: dict, **trainer) -> dict:
    """thinker -> solver chain, each agent on its own policy."""
    return _dyad(model_dir, credit, ("thinker", "You think."), ("solver", "You solve."), **trainer)


def test_v2_through_the_engine_with_scripted_agents(tiny_tokenizer):
    """The thinker alternates a good and a bad hint; the solver is right with the good hint only,
    and wrong alone.  Joint ±1 = [+1, −1, +1, −1], solo all −1 -> b = −1, bonus [1, 0, 1, 0];
    thinker rewards [1.2, −1, 1.2, −1] (mean .1), solver [1, −1, 1, −1] (mean 0)."""
    calls = {"thinker": 0}

    def respond(req):
        if req.agent == "thinker":
            calls["thinker"] += 1
            return "HINT good" if calls["thinker"] % 2 == 1 else "HINT bad"
        return "ANSWER: right" if "HINT good" in req.messages[-1]["content"] else "ANSWER: wrong"

    run_cfg = validate_config(dyad_config("m", {"method": "ccpo"}))
    backend = ScriptedBackend(respond, {p: tiny_tokenizer for p in run_cfg.policies})
    engine = Engine(build_topology(run_cfg.topology), build_agents(run_cfg.agents, run_cfg.team.name), {p: tiny_tokenizer for p in run_cfg.policies},
                    {p: True for p in run_cfg.policies}, backend, lambda ep: float(ep.answer == "right"))
    groups = engine.rollout([Task("t0", "2+2", "4")], group_size=4, seed=0)
    results = engine.execute(plan_credit(groups, run_cfg.credit), seed=1)
    assert backend.requests == 8 + 4  # G joint dyads + G solo solver runs (§6.5)
    for e in range(4):
        (solo,) = results[f"ccpo/{e}/0"]
        assert solo.turns[0].finish_reason == "removed" and "thinker" not in solo.turns[1].messages[-1]["content"]
        assert solo.reward == 0.0
    c = run_credit(build_credit_batch(groups, AGENTS), run_cfg.credit, results)
    torch.testing.assert_close(c.advantages, torch.tensor([1.1, 1.0, -1.1, -1.0, 1.1, 1.0, -1.1, -1.0]))


# --- training smoke runs ---------------------------------------------------------------------------------


def outcome_parity(episode) -> float:
    """A reward random models can earn that depends on every sampled turn (so solo runs vary)."""
    return float(sum(t.completion_ids[0] for t in episode.turns if t.completion_ids) % 2)


def snapshot(team):
    return {n: {k: v.detach().clone() for k, v in p.model.state_dict().items()} for n, p in team.policies.items()}


def moved(before, team) -> set[str]:
    return {n for n, p in team.policies.items() if any(not torch.equal(before[n][k], v) for k, v in p.model.state_dict().items())}


def test_v1_three_training_steps_change_both_policies(tiny_model_dir, tmp_path):
    team = build_team(validate_config(dyad_config(tiny_model_dir, {"method": "ccpo", "version": "v1", "min_samples": 4})))
    team.engine.score = outcome_parity
    before = snapshot(team)
    train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["credit_cost"]["interventions"] == 4
        for name in ("think", "solve"):
            assert math.isfinite(r["policies"][name]["loss"]) and r["policies"][name]["samples"] > 0
    assert moved(before, team) == {"think", "solve"}
    assert ccpo_mod.history(team.cfg.credit).count == 12  # 3 steps x 4 episodes


def test_v2_with_the_alternating_schedule_trains_one_policy_at_a_time(tiny_model_dir, tmp_path):
    """trainer.alternate [think, solve], switch_every 1: step 0 and 2 train the thinker, step 1 the solver."""
    # seed 1: random tiny models whose rewards vary in each of the three steps (a group without
    # variance gives the thinker no gradient, and AdamW then leaves it in place)
    team = build_team(validate_config(dyad_config(tiny_model_dir, {"method": "ccpo"}, alternate=["think", "solve"], switch_every=1, seed=1)))
    team.engine.score = outcome_parity
    before = snapshot(team)
    result = train_step(team, 0)
    assert set(result.metrics["policies"]) == {"think"} and math.isfinite(result.metrics["policies"]["think"]["loss"])
    assert moved(before, team) == {"think"}
    result = train_step(team, 1)
    assert set(result.metrics["policies"]) == {"solve"} and math.isfinite(result.metrics["policies"]["solve"]["loss"])
    assert moved(before, team) == {"think", "solve"}
    after_two = snapshot(team)
    train_step(team, 2)
    assert moved(after_two, team) == {"think"}
