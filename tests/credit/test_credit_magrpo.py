"""MAGRPO node advantage (CREDIT_SPEC §1.5): the [T] mode table, agent-independence, the
reference loop, the engine end to end and a 3-step training smoke run."""

from __future__ import annotations

import json
import math

import pytest
from team_helpers import team_config, train_smoke, varied_reward  # varied_reward: random models never solve the task
import torch
import yaml
from credit_reference import make_group, random_groups
from pydantic import TypeAdapter, ValidationError

from mas.credit import build_credit_batch, credit_config_union, run_credit
from mas.credit.baselines import GRPOConfig, RLOOConfig
from mas.credit.magrpo import MAGRPOConfig
from mas.types import Task

AGENTS = ["planner", "search", "answer"]
MODES = ["mean", "rloo", "max", "raw"]


def _node_batch(rewards, orders=None):
    """One task (node) whose episode j has reward rewards[j] and turns by orders[j]."""
    orders = orders or [["planner", "search", "answer"], ["search", "answer"], ["planner", "answer", "answer"], ["answer"]][: len(rewards)]
    return build_credit_batch([make_group(orders, rewards)], AGENTS)


def _per_episode(batch, adv):
    """The advantage of each episode's turns (asserting they are all equal)."""
    out = []
    for e in range(batch.num_episodes):
        a = adv[batch.episode_ids == e]
        assert torch.equal(a, a[:1].expand_as(a)), f"episode {e}: turns differ {a.tolist()}"
        out.append(float(a[0]) if a.numel() else None)
    return out


# --- [T] the mode table (§1.5, §10 row 4) ---------------------------------------------------------

NO_STD = dict(group_std=False, advantage_clip=None)  # CoMLRL's reinforce/magrpo.py: the baseline only


def test_modes_on_the_spec_vector_without_std():
    """R = [1, 0, 0, 1]: mean 1/2, max 1, leave-one-out means [1/3, 2/3, 2/3, 1/3]."""
    batch = _node_batch([1.0, 0.0, 0.0, 1.0])
    R = [1.0, 0.0, 0.0, 1.0]
    mean, mx = sum(R) / 4, max(R)
    expected = {
        "mean": [r - mean for r in R],  # [.5, -.5, -.5, .5]
        "max": [r - mx for r in R],  # [0, -1, -1, 0]
        "rloo": [R[j] - sum(R[k] for k in range(4) if k != j) / 3 for j in range(4)],  # 4/3 * [.5, -.5, -.5, .5]
        "raw": R,
    }
    assert expected["mean"] == [0.5, -0.5, -0.5, 0.5] and expected["max"] == [0.0, -1.0, -1.0, 0.0]
    assert expected["rloo"] == pytest.approx([4 / 3 * a for a in [0.5, -0.5, -0.5, 0.5]])
    for mode, exp in expected.items():
        credit = run_credit(batch, MAGRPOConfig(advantage_mode=mode, **NO_STD), dtype=torch.float64)
        assert _per_episode(batch, credit.advantages) == pytest.approx(exp, abs=1e-15), mode
        torch.testing.assert_close(credit.breakdown["node_advantage"], torch.tensor(exp, dtype=torch.float64), rtol=1e-15, atol=1e-15)


def test_default_divides_by_the_group_std_as_comlrl():
    """CoMLRL's MAGRPO trainer (comlrl/trainers/magrpo.py): (R - mean) / std, std = torch.std (ddof 1).
    R = [1, 0, 0, 1]: std = sqrt(4 * 0.25 / 3) = 1/sqrt(3), so A = ±0.5 * sqrt(3) = ±0.866 (not ±0.5)."""
    batch = _node_batch([1.0, 0.0, 0.0, 1.0])
    cfg = MAGRPOConfig()
    assert cfg.advantage_mode == "mean" and cfg.group_std and cfg.advantage_clip == 10.0 and cfg.normaliser == "none"
    credit = run_credit(batch, cfg, dtype=torch.float64)
    a = 0.5 * math.sqrt(3)
    assert _per_episode(batch, credit.advantages) == pytest.approx([a, -a, -a, a], abs=1e-15)
    assert credit.breakdown["node_std"].tolist() == pytest.approx([1 / math.sqrt(3)] * 4, abs=1e-15)
    # max mode: (R - max) / std
    mx = run_credit(batch, MAGRPOConfig(advantage_mode="max"), dtype=torch.float64).breakdown["node_advantage"]
    torch.testing.assert_close(mx, torch.tensor([0.0, -math.sqrt(3), -math.sqrt(3), 0.0], dtype=torch.float64), rtol=1e-15, atol=1e-15)


def test_tiny_spread_is_not_divided_and_the_clamp_holds():
    """std <= 1e-8 is not divided by (CoMLRL's threshold); advantages are clamped to ±clip.
    R = [1, 1 + 2e-9]: std = sqrt(2) * 1e-9 < 1e-8, so A = R - mean = ∓1e-9.  R = [0]*20 + [1]:
    mean 1/21, ddof-1 variance (20/21² + 20²/21²)/20 = 1/21, so the outlier gets
    (20/21)·sqrt(21) = 20/sqrt(21) = 4.36 and the others −1/sqrt(21); clip 2 cuts the outlier to 2."""
    tiny = run_credit(_node_batch([1.0, 1.0 + 2e-9], [["planner"], ["planner"]]), MAGRPOConfig(), dtype=torch.float64)
    torch.testing.assert_close(tiny.advantages, torch.tensor([-1e-9, 1e-9], dtype=torch.float64), rtol=1e-6, atol=1e-18)
    R = [0.0] * 20 + [1.0]
    batch = build_credit_batch([make_group([["planner"]] * 21, R)], AGENTS)
    free = run_credit(batch, MAGRPOConfig(), dtype=torch.float64).advantages
    assert float(free[-1]) == pytest.approx(20 / math.sqrt(21), rel=1e-12)
    clipped = run_credit(batch, MAGRPOConfig(advantage_clip=2.0), dtype=torch.float64).advantages
    assert float(clipped[-1]) == 2.0 and float(clipped[0]) == pytest.approx(-1 / math.sqrt(21), rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_every_agent_at_a_node_gets_the_same_advantage(mode, seed):
    """[T] No per-agent credit: all turns of episode j, whatever their agent, carry A_j."""
    groups = random_groups(seed, 3, 5, 6, AGENTS, min_turns=1)
    batch = build_credit_batch(groups, AGENTS)
    credit = run_credit(batch, MAGRPOConfig(advantage_mode=mode))
    node_adv = credit.breakdown["node_advantage"]  # [E]
    assert torch.equal(credit.advantages, node_adv[batch.episode_ids])
    for e in range(batch.num_episodes):
        sel = batch.episode_ids == e
        assert len(set(credit.advantages[sel].tolist())) <= 1
        assert len(set(batch.agent_ids[sel].tolist())) >= 1


def test_std_scaling_makes_it_scale_free_and_the_option_keeps_the_scale():
    """Scaling the rewards by c: the default (std) leaves mean/rloo/max unchanged; without std
    every mode's advantage scales by c."""
    R = [0.2, 0.9, 0.4, 0.4]
    c = 3.0
    small, big = _node_batch(R), _node_batch([c * r for r in R])
    for mode in MODES:
        a = run_credit(small, MAGRPOConfig(advantage_mode=mode, **NO_STD), dtype=torch.float64).advantages
        torch.testing.assert_close(run_credit(big, MAGRPOConfig(advantage_mode=mode, **NO_STD), dtype=torch.float64).advantages, c * a)
        if mode != "raw":
            torch.testing.assert_close(run_credit(big, MAGRPOConfig(advantage_mode=mode), dtype=torch.float64).advantages,
                                       run_credit(small, MAGRPOConfig(advantage_mode=mode), dtype=torch.float64).advantages)


def test_rloo_is_k_over_k_minus_one_times_mean_and_equals_the_rloo_baseline():
    """K/(K−1) = 5/4 is an integer ratio: computed in float64 the two agree to round-off."""
    R = [0.3, 1.0, 0.0, 0.7, 0.25]
    batch = _node_batch(R, [["planner"], ["search", "answer"], ["answer"], ["planner", "planner"], ["search"]])
    mean = run_credit(batch, MAGRPOConfig(advantage_mode="mean", **NO_STD), dtype=torch.float64).breakdown["node_advantage"]
    rloo = run_credit(batch, MAGRPOConfig(advantage_mode="rloo", **NO_STD), dtype=torch.float64)
    torch.testing.assert_close(rloo.breakdown["node_advantage"], 5 / 4 * mean, rtol=1e-15, atol=1e-15)
    assert abs(float(rloo.breakdown["node_advantage"].sum())) < 1e-15
    torch.testing.assert_close(rloo.advantages, run_credit(batch, RLOOConfig(), dtype=torch.float64).advantages, rtol=1e-15, atol=1e-15)
    loo = [sum(R[k] for k in range(5) if k != j) / 4 for j in range(5)]
    torch.testing.assert_close(rloo.breakdown["node_baseline"], torch.tensor(loo, dtype=torch.float64), rtol=1e-15, atol=1e-15)


def test_singleton_and_constant_nodes():
    """A node of one episode: mean, rloo and max give 0, raw gives R (CoMLRL's rloo falls back to
    R - mean for K <= 1).  A constant node gives exactly 0 (0.9 three times: no float residue)."""
    g0 = make_group([["planner", "answer"]], [0.7], group_id=0)
    g1 = make_group([["planner"], ["answer"], ["search", "answer"]], [0.9, 0.9, 0.9], group_id=1)
    batch = build_credit_batch([g0, g1], AGENTS)
    for mode in ("mean", "rloo", "max"):
        for opts in ({}, NO_STD):
            assert torch.equal(run_credit(batch, MAGRPOConfig(advantage_mode=mode, **opts)).advantages, torch.zeros(batch.num_turns)), mode
    raw = run_credit(batch, MAGRPOConfig(advantage_mode="raw", **NO_STD)).advantages
    torch.testing.assert_close(raw, torch.tensor([0.7, 0.7, 0.9, 0.9, 0.9, 0.9]))


def test_nodes_are_separate_tasks():
    g0 = make_group([["planner"], ["answer"]], [1.0, 0.0], group_id=0)
    g1 = make_group([["planner"], ["answer"], ["search"]], [5.0, 2.0, 2.0], group_id=1)
    batch = build_credit_batch([g0, g1], AGENTS)
    adv = run_credit(batch, MAGRPOConfig(advantage_mode="max", **NO_STD)).advantages
    torch.testing.assert_close(adv, torch.tensor([0.0, -1.0, 0.0, -3.0, -3.0]))
    # with std: node 0 std sqrt(1/2), node 1 std sqrt(3)
    std = run_credit(batch, MAGRPOConfig(advantage_mode="max"), dtype=torch.float64).advantages
    torch.testing.assert_close(std, torch.tensor([0.0, -math.sqrt(2), 0.0, -math.sqrt(3), -math.sqrt(3)], dtype=torch.float64))


def test_default_mean_equals_grpo_and_group_normaliser_gives_grpo():
    """C3's MAGRPO reimplementation divides the centred reward by the group std: the default is
    GRPO up to eps (and the 1e-8 threshold), and magrpo + group is GRPO for every mode."""
    groups = random_groups(3, 4, 5, 4, AGENTS, ragged_groups=True)
    batch = build_credit_batch(groups, AGENTS)
    want = run_credit(batch, GRPOConfig(eps=1e-300), dtype=torch.float64).advantages
    torch.testing.assert_close(run_credit(batch, MAGRPOConfig(), dtype=torch.float64).advantages, want, rtol=1e-12, atol=1e-12)
    for mode in ("mean", "rloo", "max"):
        for opts in ({}, NO_STD):
            got = run_credit(batch, MAGRPOConfig(advantage_mode=mode, normaliser="group", eps=1e-300, **opts), dtype=torch.float64).advantages
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


# --- the slow reference (STYLE 3) ------------------------------------------------------------------


def ref_magrpo(groups, mode, group_std=True, clip=10.0):
    """CoMLRL per node, broadcast to every turn of each episode: the baseline of
    ``_compute_advantages`` (reinforce/magrpo.py), then the std division (std > 1e-8) and the
    clamp of ``_compute_loss_with_gradients`` (magrpo.py)."""
    out = []
    for g in groups:
        R = [ep.reward for ep in g.episodes]
        K = len(R)
        mean = sum(R) / K
        std = 0.0 if len(set(R)) == 1 else math.sqrt(sum((r - mean) ** 2 for r in R) / (K - 1))
        for j, ep in enumerate(g.episodes):
            if mode == "mean":
                a = 0.0 if len(set(R)) == 1 else R[j] - mean
            elif mode == "raw":
                a = R[j]
            elif mode == "max":
                a = R[j] - max(R)
            else:
                a = 0.0 if len(set(R)) == 1 else (R[j] * K - sum(R)) / (K - 1)
            if group_std and std > 1e-8:
                a = a / std
            if clip is not None:
                a = max(-clip, min(clip, a))
            out += [a] * len(ep.turns)
    return out


CASES = [(1, 1, 1, 0), (1, 4, 3, 1), (3, 5, 4, 2), (4, 8, 6, 3), (6, 3, 5, 4), (8, 8, 8, 5)]


@pytest.mark.parametrize("case", CASES, ids=[f"B{c[0]}-G{c[1]}-T{c[2]}-s{c[3]}" for c in CASES])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("std", [True, False])
def test_matches_reference(case, mode, std):
    B, G, T, seed = case
    groups = random_groups(seed, B, G, T, AGENTS, ragged_groups=seed % 2 == 1)
    batch = build_credit_batch(groups, AGENTS)
    opts = {} if std else NO_STD
    credit = run_credit(batch, MAGRPOConfig(advantage_mode=mode, **opts), dtype=torch.float64)
    ref = ref_magrpo(groups, mode, group_std=std, clip=10.0 if std else None)
    torch.testing.assert_close(credit.advantages, torch.tensor(ref, dtype=torch.float64), rtol=1e-12, atol=1e-12)


# --- config --------------------------------------------------------------------------------------


def test_yaml_section():
    ta = TypeAdapter(credit_config_union())
    cfg = ta.validate_python(yaml.safe_load("method: magrpo\nadvantage_mode: rloo\n"))
    assert isinstance(cfg, MAGRPOConfig) and cfg.advantage_mode == "rloo"
    with pytest.raises(ValidationError, match="advantage_mode"):
        ta.validate_python({"method": "magrpo", "advantage_mode": "median"})
    with pytest.raises(ValidationError, match="discount"):
        ta.validate_python({"method": "magrpo", "discount": 0.9})  # single-level rollouts: no γ key


# --- through the real engine with scripted agents --------------------------------------------------


def _scripted_engine(cfg, respond, tokenizer, score):
    from mas.agents.agent import build_agents
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.config.schema import validate_config
    from mas.rollout.engine import Engine
    from mas.topologies import build_topology

    run = validate_config(cfg)
    backend = ScriptedBackend(respond, {p: tokenizer for p in run.policies})
    toks = {p: tokenizer for p in run.policies}
    return Engine(build_topology(run.topology), build_agents(run.agents, run.team.name), toks, {p: True for p in run.policies}, backend, score)


def _team(model_dir, topology, credit, **extra):
    """A 3-agent team (lead and helper train on 'main', checker is frozen) on tiny models."""
    return team_config(model_dir, topology, credit=credit, **extra)


def test_end_to_end_debate_with_scripted_agents(tiny_tokenizer):
    """Debaters answer by script; episode j of a task is correct iff the lead's first answer is.
    Every turn of episode j (lead, helper, checker, both rounds) gets R_j − mean R."""
    counts: dict[str, int] = {}

    def respond(req):
        content = req.messages[-1]["content"]
        if req.agent == "lead" and "Other answers" not in content:  # round 1: episodes arrive in order
            counts[content] = counts.get(content, 0) + 1
            return "ANSWER: 2" if counts[content] % 2 else "ANSWER: 3"
        return "ANSWER: 2"

    def score(ep):  # correct iff the first turn said 2
        return float(ep.turns[0].text.strip() == "ANSWER: 2")

    engine = _scripted_engine(_team("m", "debate", {"method": "magrpo"}), respond, tiny_tokenizer, score)
    tasks = [Task("t0", "1+1", "2"), Task("t1", "2+0", "2")]
    groups = engine.rollout(tasks, group_size=4, seed=0)
    batch = build_credit_batch(groups, ["lead", "helper", "checker"])
    R = batch.episode_rewards.tolist()
    assert sorted(set(R)) == [0.0, 1.0]  # the script made the node non-degenerate
    credit = run_credit(batch, MAGRPOConfig(**NO_STD))
    per_ep = _per_episode(batch, credit.advantages)
    for b in range(2):
        Rb = [R[e] for e in range(batch.num_episodes) if int(batch.episode_group_ids[e]) == b]
        mb = sum(Rb) / len(Rb)
        assert [per_ep[e] for e in range(batch.num_episodes) if int(batch.episode_group_ids[e]) == b] == pytest.approx([r - mb for r in Rb])
    assert {batch.agent_names[i] for i in batch.agent_ids.tolist()} == {"lead", "helper", "checker"}


# --- 3 training steps on a tiny random model --------------------------------------------------------


def _smoke(tmp_path, model_dir, credit, topology):
    return train_smoke(tmp_path, _team(model_dir, topology, credit))[1]


def test_three_training_steps_on_a_tiny_model(tmp_path, tiny_model_dir):
    rows = _smoke(tmp_path, tiny_model_dir, {"method": "magrpo"}, "debate")
    assert any(r["advantage"]["max"] > 0.0 for r in rows)  # the parity reward gave the nodes variance
