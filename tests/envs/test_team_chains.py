"""What the team envs share (envs/team/chains.py): one chain stream, its state dict and description.

The state dicts' keys and order are what checkpoints hold, so they are written out here by hand."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from mas.envs import build_env
from mas.envs.team import TeamConjunctiveConfig, TeamForkConfig, TeamRelayConfig, TeamSaboteurConfig
from mas.envs.verifiers import resolve_verifier

STREAM = ["seed", "num_ops", "max_operand", "ops", "heldout_fraction"]
CASES = [
    (TeamConjunctiveConfig(name="team_conjunctive"), ["env", *STREAM, "cursor"], 2),
    (TeamSaboteurConfig(name="team_saboteur"), ["env", *STREAM, "cursor"], 1),
    (TeamRelayConfig(name="team_relay", size=3), ["env", "size", *STREAM, "cursor"], 3),
    (TeamForkConfig(name="team_fork", size=3), ["env", "size", *STREAM, "cursor"], 3),
]


@pytest.mark.parametrize("cfg, keys, chains", CASES, ids=lambda c: getattr(c, "name", ""))
def test_state_dict_counts_tasks_and_names_the_env(cfg, keys, chains):
    env = build_env(cfg)
    env.sample_tasks(4)
    state = copy.deepcopy(env.state_dict())
    assert list(state) == keys and state["env"] == cfg.name and state["cursor"] == 4
    assert env.chains.state_dict()["cursor"] == 4 * chains  # the chain stream behind the tasks
    expected = env.sample_tasks(3)
    resumed = build_env(cfg)
    resumed.load_state_dict(state)
    assert resumed.sample_tasks(3) == expected
    with pytest.raises(ValueError, match="seed"):
        build_env(cfg).load_state_dict({**state, "seed": 7})


@pytest.mark.parametrize("cfg, keys, chains", CASES, ids=lambda c: getattr(c, "name", ""))
def test_described_with_the_chains_settings(cfg, keys, chains):
    described = build_env(cfg).describe()
    assert list(described) == ["name", "source", "train_size", "eval_size"] and described["name"] == cfg.name
    assert "(2 ops over 0..9, ops +-" in described["source"]


def test_a_too_large_eval_names_what_it_asked_for():
    with pytest.raises(ValueError, match=r"^asked for 5000 held-out pairs, which need 10000 held-out chains: "):
        build_env(TeamConjunctiveConfig(name="team_conjunctive")).eval_tasks(5000)
    with pytest.raises(ValueError, match=r"^asked for 5000 held-out tasks of 3 parts, which need 15000 held-out chains: "):
        build_env(TeamRelayConfig(name="team_relay", size=3)).eval_tasks(5000)
    with pytest.raises(ValueError, match=r"^asked for 5000 eval tasks but the held-out split has only"):  # one chain a task
        build_env(TeamSaboteurConfig(name="team_saboteur")).eval_tasks(5000)
    for cfg, _, _ in CASES:
        with pytest.raises(ValueError, match="n must be >= 0, got -1"):
            build_env(cfg).sample_tasks(-1)


def test_each_team_env_verifies_its_turns_with_its_registered_verifier():
    for cfg, _, _ in CASES:
        assert resolve_verifier("auto", build_env(cfg)) is resolve_verifier(cfg.name, None)


def test_the_fork_config_is_the_relays_with_its_own_name():
    assert list(TeamForkConfig.model_fields) == list(TeamRelayConfig.model_fields)  # name first, then the relay's
    fork, relay = TeamForkConfig(name="team_fork"), TeamRelayConfig(name="team_relay")
    assert fork.model_dump(exclude={"name"}) == relay.model_dump(exclude={"name"}) and fork.num_parts == 2
    with pytest.raises(ValidationError, match="team_fork"):
        TeamForkConfig(name="team_relay")
    with pytest.raises(ValidationError, match="extra"):
        TeamForkConfig(name="team_fork", colour="red")
    with pytest.raises(ValidationError, match="frozen"):
        fork.size = 3  # type: ignore[misc]
