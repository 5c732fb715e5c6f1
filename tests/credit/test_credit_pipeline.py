"""Credit pipelines (method + normaliser): identities between pipelines, hand examples of the
non-default normalisers, per-segment properties and the YAML section."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from credit_reference import make_group, random_groups
from pydantic import BaseModel, TypeAdapter, ValidationError

from mas.credit import build_credit_batch, credit_config_union, run_credit
from mas.credit.baselines import DrGRPOConfig, GRPOConfig, RLOOConfig
from mas.credit.dr_mas import DrMasConfig
from mas.credit.normalise import NORMALISER_NAMES

EPS = 1e-6
AGENTS = ["planner", "search", "answer"]
REPO = Path(__file__).resolve().parents[2]


def _heterogeneous_search_batch():
    """One successful rollout with 3 search calls, three failed ones with 1 (CREDIT_SPEC §2).

    Turn order: [search, search, search, answer] (R=1), then [search, answer] x 3 (R=0)."""
    groups = [make_group([["search", "search", "search", "answer"]] + [["search", "answer"]] * 3, [1.0, 0.0, 0.0, 0.0])]
    return build_credit_batch(groups, ["search", "answer"])


def _random_batch(seed, **kw):
    groups = random_groups(seed, 4, 5, 6, AGENTS, **kw)
    return groups, build_credit_batch(groups, AGENTS)


# --- identities ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("penalty", [0.0, 0.1, 0.7])
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_dr_mas_with_group_normaliser_is_grpo(seed, penalty, scale_by_std):
    """dr_mas's episode score is the mean of its per-row rewards, i.e. GRPO's trajectory
    score s_i, and group gives every turn its episode's value: the pipelines coincide."""
    _, batch = _random_batch(seed, ragged_groups=True)
    dr = run_credit(batch, DrMasConfig(normaliser="group", invalid_penalty=penalty, scale_by_std=scale_by_std))
    gr = run_credit(batch, GRPOConfig(invalid_penalty=penalty, scale_by_std=scale_by_std))
    assert torch.equal(dr.advantages, gr.advantages)
    assert torch.equal(dr.breakdown["episode_advantage"], gr.breakdown["episode_advantage"])


def test_dr_mas_with_group_normaliser_differs_from_default():
    """Heterogeneous invocation: group uses the trajectory mean 1/4 and std 1/2 for every turn,
    the default (agent) uses the search agent's own mean 1/2 over its 6 turns."""
    batch = _heterogeneous_search_batch()
    default = run_credit(batch, DrMasConfig(invalid_penalty=0.0))
    group = run_credit(batch, DrMasConfig(normaliser="group", invalid_penalty=0.0))
    R = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(group.advantages, torch.tensor([(r - 0.25) / (0.5 + EPS) for r in R]))
    search = batch.agent_ids == 0
    torch.testing.assert_close(default.breakdown["baseline_mean"][search], torch.full((6,), 0.5))
    assert not torch.allclose(group.advantages[search], default.advantages[search])
    # the once-per-rollout answer agent gets the same credit either way
    torch.testing.assert_close(group.advantages[~search], default.advantages[~search])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_with_agent_normaliser_is_dr_mas_without_penalty(seed, scale_by_std):
    """By hand: with invalid_penalty = 0, grpo's broadcast turn score is s_i = R_i and dr_mas's
    per-row reward is R_i - 0 = R_i; the agent normaliser then takes the same (task, agent)
    statistics of the same values, so the advantages are equal."""
    _, batch = _random_batch(seed, ragged_groups=True)
    gr = run_credit(batch, GRPOConfig(normaliser="agent", invalid_penalty=0.0, scale_by_std=scale_by_std))
    dr = run_credit(batch, DrMasConfig(invalid_penalty=0.0, scale_by_std=scale_by_std))
    assert torch.equal(gr.advantages, dr.advantages)


def test_grpo_with_agent_normaliser_differs_from_dr_mas_under_a_penalty():
    """With p > 0 grpo averages the penalty over the rollout, dr_mas puts it on the row:
    episode [a (invalid), b] with R=1 gives grpo the turn values [1 - p/2, 1 - p/2] and dr_mas
    [1 - p, 1].  Without invalid turns the two agree for any p."""
    p = 0.4
    groups = [make_group([["a", "b"], ["a", "b"], ["a", "b"]], [1.0, 0.0, 1.0], invalid={0: (0,)})]
    batch = build_credit_batch(groups, ["a", "b"])
    gr = run_credit(batch, GRPOConfig(normaliser="agent", invalid_penalty=p))
    dr = run_credit(batch, DrMasConfig(invalid_penalty=p))
    torch.testing.assert_close(gr.breakdown["episode_score"], torch.tensor([1 - p / 2, 0.0, 1.0]))
    # agent a: grpo values [1 - p/2, 0, 1], dr_mas [1 - p, 0, 1]; agent b: [1 - p/2, 0, 1] vs [1, 0, 1]
    assert not torch.allclose(gr.advantages, dr.advantages)
    clean = build_credit_batch([make_group([["a", "b"], ["a", "b"], ["a", "b"]], [1.0, 0.0, 1.0])], ["a", "b"])
    torch.testing.assert_close(
        run_credit(clean, GRPOConfig(normaliser="agent", invalid_penalty=p)).advantages, run_credit(clean, DrMasConfig(invalid_penalty=p)).advantages
    )


@pytest.mark.parametrize("normaliser", NORMALISER_NAMES)
@pytest.mark.parametrize("seed", range(3))
def test_dr_grpo_is_grpo_without_std_for_every_normaliser(normaliser, seed):
    _, batch = _random_batch(seed, ragged_groups=True)
    assert DrGRPOConfig().scale_by_std is False
    torch.testing.assert_close(
        run_credit(batch, DrGRPOConfig(normaliser=normaliser, invalid_penalty=0.2)).advantages,
        run_credit(batch, GRPOConfig(normaliser=normaliser, scale_by_std=False, invalid_penalty=0.2)).advantages,
    )


@pytest.mark.parametrize("seed", range(4))
def test_rloo_with_group_normaliser_is_grpo_for_groups_of_two_or_more(seed):
    """RLOO's A_i = G/(G-1) (s_i - mean s) has mean 0 and std G/(G-1) std s per group, so
    group-normalising it with a negligible eps gives (s_i - mean s) / std s: GRPO with that eps
    (in float64 the integer ratio G/(G-1) cancels to round-off)."""
    groups, batch = _random_batch(seed, min_turns=1)
    rl = run_credit(batch, RLOOConfig(normaliser="group", eps=1e-300, invalid_penalty=0.1), dtype=torch.float64).advantages
    gr = run_credit(batch, GRPOConfig(eps=1e-300, invalid_penalty=0.1), dtype=torch.float64).advantages
    assert all(len(g.episodes) >= 2 for g in groups)
    torch.testing.assert_close(rl, gr, atol=1e-12, rtol=1e-12)


def test_default_normalisers_are_the_spec_methods():
    """Naming the default explicitly changes nothing (and it is the default)."""
    _, batch = _random_batch(0, ragged_groups=True)
    for cfg, default in ((GRPOConfig(), "group"), (DrGRPOConfig(), "group"), (RLOOConfig(), "none"), (DrMasConfig(), "agent")):
        assert cfg.normaliser == default
        explicit = type(cfg)(normaliser=default)
        assert explicit == cfg
        assert torch.equal(run_credit(batch, explicit).advantages, run_credit(batch, cfg).advantages)


# --- hand examples of none and global ---------------------------------------------------------------


def test_global_pools_every_turn_of_every_agent():
    """Turn rewards [1, 1, 1, 1, 0 x 6]: one mean 0.4 and one std over all ten turns, for dr_mas
    and grpo alike (same turn values when p = 0), unlike grpo's per-episode group mean 1/4."""
    batch = _heterogeneous_search_batch()
    R = torch.tensor([1.0] * 4 + [0.0] * 6)
    mean, std = 0.4, math.sqrt((4 * 0.6**2 + 6 * 0.4**2) / 9)
    expected = (R - mean) / (std + EPS)
    for cfg in (DrMasConfig(normaliser="global"), GRPOConfig(normaliser="global")):
        credit = run_credit(batch, cfg)
        torch.testing.assert_close(credit.advantages, expected)
        assert credit.breakdown["norm_count"].tolist() == [10] * 10
        torch.testing.assert_close(credit.breakdown["norm_mean"], torch.full((10,), mean))
    torch.testing.assert_close(run_credit(batch, DrGRPOConfig(normaliser="global")).advantages, R - mean)


def test_global_pools_across_tasks():
    """Unlike group and agent, global statistics mix tasks: task 1 shifted by +10 moves task 0."""
    g0 = make_group([["a"], ["a"]], [1.0, 0.0], group_id=0)
    g1 = make_group([["a"], ["a"]], [11.0, 10.0], group_id=1)
    both = run_credit(build_credit_batch([g0, g1], ["a"]), GRPOConfig(normaliser="global", scale_by_std=False)).advantages
    torch.testing.assert_close(both, torch.tensor([1.0, 0.0, 11.0, 10.0]) - 5.5)
    for normaliser in ("group", "agent"):
        both = run_credit(build_credit_batch([g0, g1], ["a"]), GRPOConfig(normaliser=normaliser)).advantages
        alone = run_credit(build_credit_batch([g0], ["a"]), GRPOConfig(normaliser=normaliser)).advantages
        torch.testing.assert_close(both[:2], alone)


def test_none_returns_the_raw_scores():
    p = 0.1
    groups = [make_group([["a", "b"], ["a"]], [1.0, 0.0], invalid={0: (1,)})]
    batch = build_credit_batch(groups, ["a", "b"])
    # dr_mas: per-row rewards; grpo: the episode score s_0 = 1 - p/2 broadcast; rloo: the LOO advantage
    torch.testing.assert_close(run_credit(batch, DrMasConfig(normaliser="none", invalid_penalty=p)).advantages, torch.tensor([1.0, 1 - p, 0.0]))
    torch.testing.assert_close(run_credit(batch, GRPOConfig(normaliser="none", invalid_penalty=p)).advantages, torch.tensor([1 - p / 2, 1 - p / 2, 0.0]))
    torch.testing.assert_close(
        run_credit(batch, RLOOConfig(invalid_penalty=p)).advantages, torch.tensor([1 - p / 2, 1 - p / 2, -(1 - p / 2)])
    )


# --- per-segment properties of the non-default normalisers -----------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cfg", [GRPOConfig(normaliser="global"), DrMasConfig(normaliser="global"), RLOOConfig(normaliser="global")], ids=["grpo", "dr_mas", "rloo"])
def test_global_gives_mean_zero_std_one_over_the_batch(seed, cfg):
    _, batch = _random_batch(seed, min_turns=1)
    adv = run_credit(batch, cfg).advantages.double()
    assert abs(float(adv.mean())) < 1e-5
    assert float(adv.std()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cfg", [GRPOConfig(normaliser="agent"), RLOOConfig(normaliser="agent")], ids=["grpo", "rloo"])
def test_agent_gives_mean_zero_std_one_per_task_and_agent(seed, cfg):
    _, batch = _random_batch(seed, min_turns=1)
    credit = run_credit(batch, cfg)
    checked = 0
    for b in range(int(batch.group_ids.max()) + 1):
        for k in range(len(AGENTS)):
            sel = (batch.group_ids == b) & (batch.agent_ids == k)
            if int(sel.sum()) < 2:
                continue
            a = credit.advantages[sel].double()
            if float(a.abs().max()) == 0.0:  # constant segment
                continue
            assert abs(float(a.mean())) < 1e-5
            assert float(a.std()) == pytest.approx(1.0, abs=1e-4)
            checked += 1
    assert checked > 0


def test_breakdown_per_normaliser():
    _, batch = _random_batch(1, min_turns=1)
    N, E = batch.num_turns, batch.num_episodes
    for name in ("grpo", "dr_grpo", "rloo", "dr_mas"):
        for normaliser in NORMALISER_NAMES:
            cfg = TypeAdapter(credit_config_union()).validate_python({"method": name, "normaliser": normaliser})
            bd = run_credit(batch, cfg).breakdown
            for key in ("norm_mean", "norm_std", "norm_count", "turn_reward", "baseline_mean", "baseline_count"):
                assert bd[key].shape == (N,), (name, normaliser, key)
            assert bd["episode_score"].shape == (E,)
            has_episode_adv = normaliser in ("group", "group_batch_std") or (normaliser == "none" and name != "dr_mas")
            assert ("episode_advantage" in bd) == has_episode_adv, (name, normaliser)
            if has_episode_adv:
                torch.testing.assert_close(run_credit(batch, cfg).advantages, bd["episode_advantage"][batch.episode_ids])


# --- the YAML section -------------------------------------------------------------------------------


class _RunConfig(BaseModel):
    credit: credit_config_union()


def test_yaml_section_names_a_pipeline():
    text = "credit:\n  method: dr_mas\n  normaliser: global\n  scale_by_std: false\n"
    cfg = _RunConfig.model_validate(yaml.safe_load(text)).credit
    assert cfg == DrMasConfig(normaliser="global", scale_by_std=False)
    assert cfg.invalid_penalty == 0.1  # the method's other defaults stay
    dumped = cfg.model_dump()
    assert list(dumped) == ["method", "normaliser", "scale_by_std", "eps", "invalid_penalty"]
    assert list(DrGRPOConfig().model_dump()) == ["method", "normaliser", "eps", "invalid_penalty"]


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "dr_mas"])
def test_bad_normaliser_lists_the_choices(method):
    with pytest.raises(ValidationError) as info:
        _RunConfig.model_validate({"credit": {"method": method, "normaliser": "batch"}})
    msg = str(info.value)
    assert "normaliser" in msg and "'batch'" in msg
    assert "'none', 'group', 'group_batch_std', 'global' or 'agent'" in msg


def test_bad_normaliser_in_a_run_config_names_path_and_choices():
    from mas.config.schema import ConfigError, validate_config

    data = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    data["credit"]["normaliser"] = "per_agent"
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    line = next(line for line in info.value.lines if line.startswith("credit.normaliser"))
    assert "'per_agent'" in line
    for name in NORMALISER_NAMES:
        assert f"'{name}'" in line


def test_dr_grpo_has_no_scale_by_std_key():
    with pytest.raises(ValidationError, match="Extra inputs"):
        _RunConfig.model_validate({"credit": {"method": "dr_grpo", "scale_by_std": True}})
