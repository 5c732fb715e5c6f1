"""The fork team task: every specialist decides to answer at once or to work its part out; the
reward is the share of parts right.  Its decision points and per-agent ground truth on hand-made
and scripted episodes, its tasks (the relay's), its verifier and its resume."""

from __future__ import annotations

import copy

import pytest
from test_engine import scripted_engine
from test_team_relay import relay_config, solve_part, turn, value_of

from mas.config.schema import validate_config
from mas.envs import build_env
from mas.envs.team import TeamForkConfig, TeamForkEnv, TeamRelayConfig, TeamRelayEnv
from mas.envs.team.relay import decision_of
from mas.envs.verifiers import resolve_verifier
from mas.types import Episode, Task


def fork_env(n: int) -> TeamForkEnv:
    return TeamForkEnv(TeamForkConfig(name="team_fork", size=n))


def fork_config(n: int) -> dict:
    cfg = relay_config(n)
    cfg["env"] = {"name": "team_fork", "size": n}
    return cfg


TASK = Task("t", "1: 3+4-2 2: 8-5+1 3: 6-1-1", "5 4 4",
            meta={"parts": ["3+4-2", "8-5+1", "6-1-1"], "answers": ["5", "4", "4"]})


def test_a_hand_made_episode_scores_the_share_of_parts_and_records_each_decision():
    env = fork_env(3)
    turns = [turn("s1", 0, "3+4=7 7-2=5 ANSWER: 5", "5"),   # worked out, right
             turn("s2", 1, "ANSWER: 6", "6"),                # at once, wrong
             turn("s3", 2, "ANSWER: 4", "4")]                # at once, right
    ep = Episode(TASK, 0, 0, 0, turns=turns, answer="5 6 4")
    assert env.score(ep) == pytest.approx(2 / 3)  # two parts of three
    assert ep.info["designed"] == {"s1": 1.0, "s2": 0.0, "s3": 1.0}
    assert ep.info["decisions"] == {"s1": "worked", "s2": "at_once", "s3": "at_once"}
    assert ep.info["scores"] == {"part_1": 1.0, "part_2": 0.0, "part_3": 1.0, "all_parts": 0.0, "at_once": pytest.approx(2 / 3)}


def test_every_part_right_scores_one_and_the_and_is_recorded_beside_it():
    env = fork_env(3)
    turns = [turn(f"s{k + 1}", k, f"{p} ANSWER: {a}", a) for k, (p, a) in enumerate([("3+4=7 7-2=5", "5"), ("8-5=3 3+1=4", "4"),
                                                                                      ("6-1=5 5-1=4", "4")])]
    ep = Episode(TASK, 0, 0, 0, turns=turns, answer="5 4 4")
    assert env.score(ep) == 1.0 and ep.info["scores"]["all_parts"] == 1.0 and ep.info["scores"]["at_once"] == 0.0


@pytest.mark.parametrize("answer", ["5 4", "5 4 4 4", None])
def test_an_answer_with_a_word_too_many_or_too_few_has_no_part_in_place(answer):
    ep = Episode(TASK, 0, 0, 0, turns=[], answer=answer)
    assert fork_env(3).score(ep) == 0.0 and ep.info["decisions"] == {}


@pytest.mark.parametrize("text, finish, decision", [
    ("ANSWER: 5", "stop", "at_once"),
    ("  answer: 5", "stop", "at_once"),             # the marker in any case
    ("5", "stop", "at_once"),                        # no step at all, no marker either
    ("3+4=7 7-2=5 ANSWER: 5", "stop", "worked"),
    ("3+4=7 7-2=5", "length", "worked"),             # cut off while working: it chose to work
    ("ANSWER: 5 (3+4=7)", "stop", "at_once"),        # a step after the answer does not make it worked
    ("[masked]", "masked", "none"),
    ("", "removed", "none"),
])
def test_decision_of_a_turn(text, finish, decision):
    assert decision_of(turn("s1", 0, text, finish=finish)) == decision


def test_scripted_specialists_through_the_real_chain(tiny_tokenizer):
    """s1 works its part out, s2 answers at once and is wrong, s3 answers at once and is right."""
    def respond(req):
        part = req.messages[-1]["content"].removeprefix("Task: ")
        if req.agent == "s1":
            return f"{part}={value_of(part)} ANSWER: {value_of(part)}"
        return "ANSWER: 99" if req.agent == "s2" else solve_part(req)

    env = fork_env(3)
    engine, _ = scripted_engine(fork_config(3), respond, tiny_tokenizer, score=env.score)
    ep = engine.rollout(env.sample_tasks(1), 1, seed=0)[0].episodes[0]
    assert ep.reward == pytest.approx(2 / 3)
    assert ep.info["decisions"] == {"s1": "worked", "s2": "at_once", "s3": "at_once"}
    assert ep.info["designed"] == {"s1": 1.0, "s2": 0.0, "s3": 1.0}
    verify = resolve_verifier("auto", env)  # the per-agent ceiling: each turn by its own part
    assert [verify(ep, t) for t in ep.turns] == [1.0, 0.0, 1.0]


def test_tasks_and_splits_are_the_relays():
    fork, relay = fork_env(4), TeamRelayEnv(TeamRelayConfig(name="team_relay", size=4))
    assert fork.sample_tasks(20) == relay.sample_tasks(20)
    assert fork.eval_tasks(50) == relay.eval_tasks(50)


def test_resume_continues_the_same_stream_and_refuses_another_envs_state():
    a = fork_env(3)
    a.sample_tasks(5)
    state = copy.deepcopy(a.state_dict())
    expected = a.sample_tasks(4)
    b = fork_env(3)
    b.load_state_dict(state)
    assert b.sample_tasks(4) == expected and state["env"] == "team_fork"
    relay_state = TeamRelayEnv(TeamRelayConfig(name="team_relay", size=3)).state_dict()
    with pytest.raises(ValueError):
        fork_env(3).load_state_dict(relay_state)


def test_registered_with_a_parts_config_and_described():
    cfg = validate_config(fork_config(2))
    env = build_env(cfg.env)
    assert isinstance(env, TeamForkEnv) and cfg.env.num_parts == 2
    assert "fraction of parts" in env.describe()["source"]
    for field in TeamForkConfig.model_fields.values():
        assert field.description
