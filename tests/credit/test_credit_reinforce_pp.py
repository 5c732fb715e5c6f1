"""REINFORCE++ and REINFORCE++-baseline (CREDIT_SPEC §1.4) with MAPPA's per-agent normalisation
(§7.2): hand examples, the [T] token-weighted mean 0 / std 1 property (§7.5, §10 row 19), a
per-token reference, the engine end to end and a 3-step training smoke run."""

from __future__ import annotations

import json
import math
import random

import pytest
from team_helpers import team_config, train_smoke, varied_reward  # varied_reward: random models never solve the task
import torch
import yaml
from credit_reference import make_group, random_groups
from pydantic import TypeAdapter, ValidationError

from mas.credit import build_credit_batch, credit_config_union, run_credit
from mas.credit.reinforce_pp import ReinforcePPConfig, weighted_whiten
from mas.types import Task

AGENTS = ["solver", "coder", "verifier"]


def _with_lengths(groups, lengths):
    """Set each flattened turn's completion to ``lengths[n]`` tokens."""
    flat = [t for g in groups for ep in g.episodes for t in ep.turns]
    assert len(flat) == len(lengths)
    for t, n in zip(flat, lengths):
        t.completion_ids = [7] * n
        t.logprobs = [-0.5] * n
    return groups


def _random_batch(seed, **kw):
    rng = random.Random(seed)
    groups = random_groups(seed, 4, 5, 5, AGENTS, min_turns=1, **kw)
    n = sum(len(ep.turns) for g in groups for ep in g.episodes)
    _with_lengths(groups, [rng.choice([0, 1, 2, 5, 17, 40]) for _ in range(n)])
    return groups, build_credit_batch(groups, AGENTS)


def _token_stats(adv, w):
    """Token-weighted mean and population std of per-turn values ``adv`` with token counts ``w``."""
    adv, w = adv.double(), w.double()
    mean = (w * adv).sum() / w.sum()
    std = torch.sqrt((w * (adv - mean) ** 2).sum() / w.sum())
    return float(mean), float(std)


# --- hand examples -------------------------------------------------------------------------------


def test_longer_responses_weigh_more():
    """Two turns, returns [1, 0], 3 and 1 tokens.
    Token-weighted: mean = 3/4, var = (3·(1/4)² + 1·(3/4)²)/4 = 3/16, A = [(1/4)/(√3/4), (−3/4)/(√3/4)] = [1/√3, −√3].
    Sequence-weighted (each turn once): mean 1/2, population std 1/2, A = [1, −1]."""
    groups = _with_lengths([make_group([["solver"], ["solver"]], [1.0, 0.0])], [3, 1])
    batch = build_credit_batch(groups, AGENTS)
    tok = run_credit(batch, ReinforcePPConfig())
    seq = run_credit(batch, ReinforcePPConfig(token_weighted=False))
    torch.testing.assert_close(tok.advantages, torch.tensor([1 / math.sqrt(3), -math.sqrt(3)]))
    torch.testing.assert_close(seq.advantages, torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(tok.breakdown["norm_mean"], torch.tensor([0.75, 0.75]))
    torch.testing.assert_close(tok.breakdown["norm_std"], torch.full((2,), math.sqrt(3) / 4))
    assert tok.breakdown["norm_tokens"].tolist() == [4.0, 4.0]


def test_reinforce_pp_hand_example_no_grouping():
    """Two tasks, no per-prompt grouping: task 1's rewards are all 5, task 0's are [1, 0];
    one mean over the 4 turns of 2 tokens each: (1 + 0 + 5 + 5)/4 = 11/4."""
    groups = _with_lengths([make_group([["solver"], ["coder"]], [1.0, 0.0], group_id=0), make_group([["solver"], ["coder"]], [5.0, 5.0], group_id=1)], [2, 2, 2, 2])
    batch = build_credit_batch(groups, AGENTS)
    x = [1.0, 0.0, 5.0, 5.0]
    mu = sum(x) / 4
    sd = math.sqrt(sum((v - mu) ** 2 for v in x) / 4)
    torch.testing.assert_close(run_credit(batch, ReinforcePPConfig()).advantages, torch.tensor([(v - mu) / sd for v in x]))
    # -baseline: subtract the task mean first -> [.5, -.5, 0, 0]; mean 0, population std sqrt(1/8)
    y = [0.5, -0.5, 0.0, 0.0]
    sd_b = math.sqrt(sum(v * v for v in y) / 4)
    base = run_credit(batch, ReinforcePPConfig(baseline=True))
    torch.testing.assert_close(base.advantages, torch.tensor([v / sd_b for v in y]))
    torch.testing.assert_close(base.breakdown["baseline"], torch.tensor([0.5, 0.5, 5.0, 5.0]))
    torch.testing.assert_close(base.breakdown["return"], torch.tensor(y))


def test_baseline_group_mean_is_per_episode_not_per_token():
    """OpenRLHF's reinforce_baseline subtracts rewards.mean over the n samples of a prompt: one
    sample per episode, however long.  Episode 0 (R=1) has 10 tokens, episode 1 (R=0) has 1:
    the baseline is 1/2, not 10/11."""
    groups = _with_lengths([make_group([["solver"], ["solver"]], [1.0, 0.0])], [10, 1])
    credit = run_credit(build_credit_batch(groups, AGENTS), ReinforcePPConfig(baseline=True))
    torch.testing.assert_close(credit.breakdown["baseline"], torch.tensor([0.5, 0.5]))


def test_per_agent_hand_example():
    """MAPPA: each agent whitened over its own turns (all tasks).  solver: returns [1, 0] with
    [1, 3] tokens -> mean 1/4, var 3/16; verifier: [1, 1, 0] with [2, 2, 4] tokens -> mean 1/2, var 1/4."""
    groups = [
        make_group([["solver", "verifier"], ["solver", "verifier"]], [1.0, 0.0], group_id=0),
        make_group([["verifier"]], [1.0], group_id=1),
    ]
    _with_lengths(groups, [1, 2, 3, 4, 2])
    batch = build_credit_batch(groups, AGENTS)
    credit = run_credit(batch, ReinforcePPConfig(per_agent=True))
    s_mu, s_sd = 1 / 4, math.sqrt(3) / 4
    v_mu, v_sd = 1 / 2, 1 / 2
    expected = [(1 - s_mu) / s_sd, (1 - v_mu) / v_sd, (0 - s_mu) / s_sd, (0 - v_mu) / v_sd, (1 - v_mu) / v_sd]
    torch.testing.assert_close(credit.advantages, torch.tensor(expected))
    glob = run_credit(batch, ReinforcePPConfig())
    assert not torch.allclose(glob.advantages, credit.advantages)


def test_constant_returns_and_empty_turns_give_zero():
    """A constant batch gives exactly 0 (no float residue times rsqrt(1e-8)); a turn with no
    completion tokens has nothing to train and gets 0 without moving the statistics."""
    groups = _with_lengths([make_group([["solver", "coder"], ["solver"]], [0.9, 0.9])], [3, 5, 2])
    batch = build_credit_batch(groups, AGENTS)
    for cfg in (ReinforcePPConfig(), ReinforcePPConfig(eps=1e-300), ReinforcePPConfig(per_agent=True), ReinforcePPConfig(baseline=True)):
        assert torch.equal(run_credit(batch, cfg).advantages, torch.zeros(3))
    groups = _with_lengths([make_group([["solver", "coder"], ["solver"]], [1.0, 0.0])], [0, 1, 1])
    batch = build_credit_batch(groups, AGENTS)
    adv = run_credit(batch, ReinforcePPConfig()).advantages
    torch.testing.assert_close(adv, torch.tensor([0.0, 1.0, -1.0]))  # the empty turn neither counts nor gets credit


def test_centring_only_and_the_variance_floor():
    groups = _with_lengths([make_group([["solver"], ["solver"], ["coder"]], [1.0, 0.0, 0.0])], [1, 1, 2])
    batch = build_credit_batch(groups, AGENTS)
    torch.testing.assert_close(run_credit(batch, ReinforcePPConfig(scale_by_std=False)).advantages, torch.tensor([0.75, -0.25, -0.25]))
    # var = 3/16; a floor above it divides by sqrt(floor) instead (OpenRLHF var.clamp(min=1e-8))
    torch.testing.assert_close(run_credit(batch, ReinforcePPConfig(eps=1.0)).advantages, torch.tensor([0.75, -0.25, -0.25]))


# --- [T] token-weighted mean 0 and population std 1 (§7.5, §10 row 19) ---------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("baseline", [False, True])
def test_global_token_weighted_mean_zero_std_one(seed, baseline):
    groups, batch = _random_batch(seed)
    credit = run_credit(batch, ReinforcePPConfig(baseline=baseline))
    w = batch.completion_lengths
    mean, std = _token_stats(credit.advantages, w)
    assert abs(mean) < 1e-6
    assert std == pytest.approx(1.0, abs=1e-5)
    # the sequence-weighted statistics of the same advantages are not normalised
    seq_mean = float(credit.advantages[w > 0].double().mean())
    assert abs(seq_mean) > 1e-4


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("baseline", [False, True])
def test_per_agent_token_weighted_mean_zero_std_one(seed, baseline):
    groups, batch = _random_batch(seed)
    credit = run_credit(batch, ReinforcePPConfig(per_agent=True, baseline=baseline))
    checked = 0
    for k in range(len(AGENTS)):
        sel = batch.agent_ids == k
        w = batch.completion_lengths[sel]
        r = credit.breakdown["return"][sel]
        live = r[w > 0]
        if live.numel() < 2 or float(live.max() - live.min()) == 0.0:
            continue
        mean, std = _token_stats(credit.advantages[sel], w)
        assert abs(mean) < 1e-6 and std == pytest.approx(1.0, abs=1e-5)
        checked += 1
    assert checked >= 2


def test_per_agent_keeps_a_frozen_agents_turns_out_of_the_others_statistics():
    """With per_agent, changing the verifier's turns (e.g. a frozen critic) leaves the solver's credit unchanged."""
    base = [["solver", "verifier"], ["solver"], ["solver", "verifier", "verifier"]]
    a = _with_lengths([make_group(base, [1.0, 0.0, 0.5])], [3, 1, 2, 4, 9, 9])
    b = _with_lengths([make_group(base, [1.0, 0.0, 0.5])], [3, 40, 2, 4, 1, 1])
    ba, bb = build_credit_batch(a, AGENTS), build_credit_batch(b, AGENTS)
    solver = ba.agent_ids == 0
    pa = run_credit(ba, ReinforcePPConfig(per_agent=True)).advantages
    pb = run_credit(bb, ReinforcePPConfig(per_agent=True)).advantages
    torch.testing.assert_close(pa[solver], pb[solver])
    ga = run_credit(ba, ReinforcePPConfig()).advantages
    gb = run_credit(bb, ReinforcePPConfig()).advantages
    assert not torch.allclose(ga[solver], gb[solver])


def test_baseline_removes_per_task_offsets():
    """Adding c_b to every reward of task b changes REINFORCE++ but not REINFORCE++-baseline."""
    g = lambda off: [make_group([["solver"], ["coder"], ["solver"]], [1.0 + off, 0.0 + off, 0.5 + off], group_id=0),
                     make_group([["coder"], ["solver"]], [0.25, 1.0], group_id=1)]
    lens = [2, 3, 1, 5, 4]
    a = build_credit_batch(_with_lengths(g(0.0), lens), AGENTS)
    b = build_credit_batch(_with_lengths(g(3.0), lens), AGENTS)
    torch.testing.assert_close(run_credit(a, ReinforcePPConfig(baseline=True)).advantages, run_credit(b, ReinforcePPConfig(baseline=True)).advantages)
    assert not torch.allclose(run_credit(a, ReinforcePPConfig()).advantages, run_credit(b, ReinforcePPConfig()).advantages)


# --- the slow per-token reference (STYLE 3) ----------------------------------------------------------


def ref_reinforce_pp(groups, baseline=False, per_agent=False, token_weighted=True, scale_by_std=True, eps=1e-8):
    """OpenRLHF per token: reward on the last token, γ = 1 returns (so every token of a turn
    holds R - b), then (x - mean) * rsqrt(max(var, eps)) over the list of all tokens (of the
    agent).  A turn's advantage is that of its tokens (0 for a turn without tokens)."""
    rows = []  # (agent, return, tokens)
    for g in groups:
        b = sum(ep.reward for ep in g.episodes) / len(g.episodes) if baseline else 0.0
        if baseline and len({ep.reward for ep in g.episodes}) == 1:
            b = g.episodes[0].reward
        for ep in g.episodes:
            for t in ep.turns:
                n = len(t.completion_ids) if token_weighted else 1
                per_token = [0.0] * len(t.completion_ids)
                if per_token:
                    per_token[-1] = ep.reward - b  # reward on the last token
                returns = [sum(per_token[i:]) for i in range(len(per_token))]  # γ = 1
                assert all(abs(r - (ep.reward - b)) < 1e-12 for r in returns)
                rows.append((t.agent if per_agent else "*", ep.reward - b, n if t.completion_ids else 0))
    out = []
    for agent, x, n in rows:
        tokens = [v for a, v, m in rows if a == agent for _ in range(m)]
        if n == 0 or not tokens:
            out.append(0.0)
            continue
        mu = sum(tokens) / len(tokens)
        if max(tokens) == min(tokens):
            out.append(0.0)
            continue
        var = sum((v - mu) ** 2 for v in tokens) / len(tokens)
        out.append((x - mu) / math.sqrt(max(var, eps)) if scale_by_std else x - mu)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("per_agent", [False, True])
@pytest.mark.parametrize("token_weighted", [True, False])
def test_matches_per_token_reference(seed, baseline, per_agent, token_weighted):
    groups, batch = _random_batch(seed, ragged_groups=seed % 2 == 1)
    cfg = ReinforcePPConfig(baseline=baseline, per_agent=per_agent, token_weighted=token_weighted, scale_by_std=seed % 3 != 0)
    expected = ref_reinforce_pp(groups, baseline, per_agent, token_weighted, cfg.scale_by_std)
    torch.testing.assert_close(run_credit(batch, cfg).advantages, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-5)


def test_weighted_whiten_segments():
    """The flat helper: two segments with integer weights equal the expanded lists' statistics."""
    x = torch.tensor([1.0, 2.0, 4.0, -1.0, 3.0])
    w = torch.tensor([2.0, 1.0, 1.0, 3.0, 1.0])
    seg = torch.tensor([0, 0, 0, 1, 1])
    out = weighted_whiten(x, w, seg)
    s0 = [1.0, 1.0, 2.0, 4.0]
    s1 = [-1.0, -1.0, -1.0, 3.0]
    for vals, idx in ((s0, [0, 1, 2]), (s1, [3, 4])):
        mu = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
        torch.testing.assert_close(out.values[idx].float(), torch.tensor([(float(x[i]) - mu) / sd for i in idx]))
    with pytest.raises(ValueError, match="equal 1-d shapes"):
        weighted_whiten(x, w[:2], seg)


def test_config_section():
    ta = TypeAdapter(credit_config_union())
    cfg = ta.validate_python({"method": "reinforce_pp", "baseline": True, "per_agent": True})
    assert isinstance(cfg, ReinforcePPConfig) and cfg.baseline and cfg.per_agent and cfg.token_weighted
    with pytest.raises(ValidationError, match="kl_coef"):  # the KL term lives in trainer.kl_coef
        ta.validate_python({"method": "reinforce_pp", "kl_coef": 0.01})
    with pytest.raises(ValidationError):
        ta.validate_python({"method": "reinforce_pp", "eps": -1.0})


# --- through the real engine with scripted agents --------------------------------------------------


def _team(model_dir, topology, credit):
    return team_config(model_dir, topology, credit=credit)


def test_end_to_end_chain_with_scripted_agents(tiny_tokenizer):
    """Scripted chain: the helper's reply length varies by episode, so the token weights differ
    from turn counts; the advantages equal the per-token reference on the engine's episodes."""
    from mas.agents.agent import build_agents
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.config.schema import validate_config
    from mas.rollout.engine import Engine
    from mas.topologies import build_topology

    counter = {"helper": 0}

    def respond(req):
        if req.agent == "lead":
            return f"ANSWER: {req.messages[-1]['content'].split('Task: ')[1].split()[0]}" if "Task: " in req.messages[-1]["content"] else "ANSWER: 1"
        if req.agent == "helper":
            counter["helper"] += 1
            return "so " * (counter["helper"] % 4) + "ANSWER: 7"
        return "ACCEPT"

    run = validate_config(_team("m", "chain", {"method": "reinforce_pp"}))
    toks = {p: tiny_tokenizer for p in run.policies}
    engine = Engine(build_topology(run.topology), build_agents(run.agents, run.team.name), toks, {p: True for p in run.policies},
                    ScriptedBackend(respond, toks), lambda ep: float(len(ep.turns[1].completion_ids) % 2))
    groups = engine.rollout([Task("t0", "1+1", "2"), Task("t1", "2+2", "4")], group_size=4, seed=0)
    batch = build_credit_batch(groups, ["lead", "helper", "checker"])
    assert len(set(batch.completion_lengths.tolist())) >= 3 and len(set(batch.episode_rewards.tolist())) == 2
    for cfg in (ReinforcePPConfig(), ReinforcePPConfig(baseline=True, per_agent=True)):
        expected = ref_reinforce_pp(groups, cfg.baseline, cfg.per_agent)
        torch.testing.assert_close(run_credit(batch, cfg).advantages, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-5)


# --- 3 training steps on a tiny random model --------------------------------------------------------


@pytest.mark.parametrize("credit", [{"method": "reinforce_pp"}, {"method": "reinforce_pp", "baseline": True, "per_agent": True}], ids=["plain", "baseline-per-agent"])
def test_three_training_steps_on_a_tiny_model(tmp_path, tiny_model_dir, credit):
    team, rows = train_smoke(tmp_path, _team(tiny_model_dir, "chain", credit))
