"""A turn records the sampling it was drawn with, and the update reads it from there (not the config)."""

from __future__ import annotations

import pytest
from team_helpers import team_config

from mas.config.schema import validate_config
from mas.credit import build_credit_batch, run_credit
from mas.training.team import build_team
from mas.training.trainer import training_batches


@pytest.fixture(scope="module")
def team(tiny_model_dir):
    cfg = team_config(tiny_model_dir, "chain")
    cfg["agents"][0]["sampling"].update(temperature=0.7, top_p=0.9, top_k=20)
    return build_team(validate_config(cfg))


def test_sampled_and_greedy_turns_record_their_sampling(team):
    env_tasks = team.env.sample_tasks(1)
    sampled = team.engine.rollout(env_tasks, 2, seed=0)
    lead = [t for g in sampled for ep in g.episodes for t in ep.turns if t.agent == "lead"]
    assert lead and all((t.temperature, t.top_p, t.top_k) == (0.7, 0.9, 20) for t in lead)
    helper = [t for g in sampled for ep in g.episodes for t in ep.turns if t.agent == "helper"]
    assert helper and all(t.temperature == team.cfg.agent("helper").sampling.temperature for t in helper)
    greedy = team.engine.rollout(env_tasks, 1, seed=0, greedy=True)
    assert all(t.temperature == 0.0 for g in greedy for ep in g.episodes for t in ep.turns)


def test_the_update_trains_each_turn_at_its_recorded_temperature(team):
    groups = team.engine.rollout(team.env.sample_tasks(1), 2, seed=1)
    turns = [t for g in groups for ep in g.episodes for t in ep.turns]
    for t in turns:  # as if the config had changed after sampling: the turn's own record wins
        t.temperature = 0.25 if t.agent == "lead" else 0.5
    batch = build_credit_batch(groups, team.cfg.agent_names)
    credit = run_credit(batch, team.cfg.credit)
    samples, _ = training_batches(team, groups, credit, {"main": team.learners["main"]})
    expected = [0.25 if t.agent == "lead" else 0.5 for t in turns if t.policy == "main" and t.trainable and t.completion_ids]
    assert [s.temperature for s in samples["main"]] == expected
