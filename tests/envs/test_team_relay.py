"""The relay team task and the chain's ``parts`` option: what each specialist sees, the team's
answer, the reward, the designed ground truth (masked and removed turns, malformed answers),
splits and resume, the size-mismatch config error; and the designed ground truth of the other
team tasks (conjunctive, saboteur)."""

from __future__ import annotations

import copy

import pytest
from test_engine import scripted_engine

from mas.config.checks import check_config
from mas.config.schema import ConfigError, validate_config
from mas.envs import build_env
from mas.envs.team import TeamConjunctiveConfig, TeamConjunctiveEnv, TeamRelayConfig, TeamRelayEnv, TeamSaboteurConfig, TeamSaboteurEnv
from mas.types import Episode, InterventionRequest, Task, Turn


def relay_config(n: int, **env) -> dict:
    """A parts chain of n scripted specialists s1..sn on team_relay of size n."""
    return {
        "team": {"name": "relay"},
        "policies": {f"s{k}": {"model": "scripted"} for k in range(1, n + 1)},
        "agents": [{"name": f"s{k}", "policy": f"s{k}", "role": "You solve your part.", "parser": "answer"} for k in range(1, n + 1)],
        "topology": {"kind": "chain", "sequence": [f"s{k}" for k in range(1, n + 1)], "parts": True},
        "env": {"name": "team_relay", "size": n, **env},
        "credit": {"method": "grpo"},
    }


def relay_env(n: int) -> TeamRelayEnv:
    return TeamRelayEnv(TeamRelayConfig(name="team_relay", size=n))


def value_of(expr: str) -> int:
    """Left-to-right value of a chain like '3+4-2' (the env's own answers are checked against it)."""
    total, op, num = 0, "+", ""
    for ch in expr + "+":
        if ch in "+-" and num:
            total = total + int(num) if op == "+" else total - int(num)
            op, num = ch, ""
        else:
            num += ch
    return total


def relay_engine(n: int, respond, tokenizer):
    env = relay_env(n)
    engine, backend = scripted_engine(relay_config(n), respond, tokenizer, score=env.score)
    return engine, env


def solve_part(req) -> str:
    """A specialist that is always right on the part it sees."""
    return f"ANSWER: {value_of(req.messages[-1]['content'].removeprefix('Task: '))}"


# --- the chain's parts option ---------------------------------------------------------------------


def test_each_specialist_sees_only_its_part_and_the_team_answers_in_order(tiny_tokenizer):
    engine, env = relay_engine(3, solve_part, tiny_tokenizer)
    task = env.sample_tasks(1)[0]
    ep = engine.rollout([task], 1, seed=0)[0].episodes[0]
    assert [t.agent for t in ep.turns] == ["s1", "s2", "s3"]
    assert [t.parent for t in ep.turns] == [None, None, None]  # no other agent's message caused a turn
    for k, t in enumerate(ep.turns):
        # the whole prompt: the role, then its own part; no task line, no other agent's message
        assert t.messages == [{"role": "system", "content": "You solve your part."},
                              {"role": "user", "content": f"Task: {task.meta['parts'][k]}"}]
    assert ep.answer == task.answer == " ".join(str(value_of(p)) for p in task.meta["parts"])
    assert ep.reward == 1.0 and ep.status == "ok"
    assert ep.info["scores"] == {"part_1": 1.0, "part_2": 1.0, "part_3": 1.0, "at_once": 1.0}  # "ANSWER: v": no step
    assert ep.info["designed"] == {"s1": 1.0, "s2": 1.0, "s3": 1.0}
    assert ep.info["decisions"] == {"s1": "at_once", "s2": "at_once", "s3": "at_once"}


def test_one_wrong_part_fails_the_team_and_only_its_specialist(tiny_tokenizer):
    def respond(req):
        return "ANSWER: 99" if req.agent == "s2" else solve_part(req)

    engine, env = relay_engine(3, respond, tiny_tokenizer)
    ep = engine.rollout(env.sample_tasks(1), 1, seed=0)[0].episodes[0]
    assert ep.answer.split()[1] == "99" and ep.reward == 0.0
    assert ep.info["scores"] == {"part_1": 1.0, "part_2": 0.0, "part_3": 1.0, "at_once": 1.0}
    assert ep.info["designed"] == {"s1": 1.0, "s2": 0.0, "s3": 1.0}


@pytest.mark.parametrize("reply, word, part_right", [
    ("I think it is five", "?", False),        # no ANSWER and no number: no answer at all
    ("ANSWER: five", "five", False),           # an answer, but not a number
    ("ANSWER: {v} apples", "{v}", True),       # several words: the first one is the part's answer
    ("{w} then ANSWER: {v}", "{v}", True),     # working before the marker
])
def test_malformed_answers(tiny_tokenizer, reply, word, part_right):
    task = relay_env(2).sample_tasks(1)[0]
    v = value_of(task.meta["parts"][1])
    engine, _ = relay_engine(2, lambda req: solve_part(req) if req.agent == "s1" else reply.format(v=v, w=v + 1), tiny_tokenizer)
    ep = engine.rollout([task], 1, seed=0)[0].episodes[0]
    assert ep.answer.split() == [str(value_of(task.meta["parts"][0])), word.format(v=v)]  # always one word per part
    assert ep.reward == float(part_right) and ep.info["designed"] == {"s1": 1.0, "s2": float(part_right)}


@pytest.mark.parametrize("mode", ["mask", "remove"])
def test_a_masked_or_removed_specialist_leaves_a_question_mark_and_did_not_do_its_job(tiny_tokenizer, mode):
    engine, env = relay_engine(3, solve_part, tiny_tokenizer)
    source = engine.rollout(env.sample_tasks(1), 1, seed=0)[0].episodes[0]
    results = engine.execute([InterventionRequest("x", source, agents=("s2",), mode=mode)], seed=1)
    ep = results["x"][0]
    assert ep.turns[1].finish_reason == ("masked" if mode == "mask" else "removed")
    words = source.answer.split()
    assert ep.answer == f"{words[0]} ? {words[2]}" and ep.reward == 0.0
    assert ep.info["scores"] == {"part_1": 1.0, "part_2": 0.0, "part_3": 1.0, "at_once": 2 / 3}  # the masked one said nothing
    assert ep.info["decisions"]["s2"] == "none"
    assert ep.info["designed"] == {"s1": 1.0, "s2": 0.0, "s3": 1.0}


def test_a_parts_chain_on_an_env_without_parts_fails_its_episodes_saying_why(tiny_tokenizer):
    cfg = relay_config(2)
    cfg["env"] = {"name": "synthetic_math"}  # declares no parts: not caught before the run
    engine, _ = scripted_engine(cfg, solve_part, tiny_tokenizer)
    ep = engine.rollout([Task("t", "1+2", "3")], 1, seed=0)[0].episodes[0]
    assert ep.status == "error" and ep.reward == 0.0
    assert "topology.parts" in ep.error and "no meta['parts']" in ep.error and "2 agents" in ep.error


# --- config errors --------------------------------------------------------------------------------------


def test_a_size_mismatch_is_a_config_error_naming_both_yaml_paths():
    data = relay_config(3, size=4)
    with pytest.raises(ConfigError) as e:
        check_config(validate_config(data), "team.yaml")
    text = str(e.value)
    assert "topology.sequence" in text and "env.size gives 4 parts" in text and "3 agents" in text
    conj = relay_config(3)
    conj["env"] = {"name": "team_conjunctive"}  # always two parts
    with pytest.raises(ConfigError, match="env 'team_conjunctive' gives 2 parts per task; list 2 agents"):
        check_config(validate_config(conj))
    check_config(validate_config(relay_config(4, size=4)))  # equal: fine


def test_parts_forbid_a_loop():
    data = relay_config(2)
    data["topology"]["loop_to"] = "s1"
    with pytest.raises(ConfigError, match="loop_to .*cannot be used with topology.parts"):
        validate_config(data)


def test_size_is_bounded():
    for size in (0, 17):
        with pytest.raises(ConfigError, match="env.size"):
            validate_config(relay_config(2, size=size))


# --- the env on its own --------------------------------------------------------------------------------------


def test_tasks_string_n_chains_and_held_out_tasks_only_held_out_chains():
    env = relay_env(4)
    train, held = env.sample_tasks(50), env.eval_tasks(100)
    for t in train + held:
        assert len(t.meta["parts"]) == 4 and t.answer.split() == [str(value_of(p)) for p in t.meta["parts"]]
        assert t.prompt == " ".join(f"{k + 1}: {p}" for k, p in enumerate(t.meta["parts"]))
    train_chains = {p for t in train for p in t.meta["parts"]}
    held_chains = [p for t in held for p in t.meta["parts"]]
    assert not train_chains & set(held_chains)
    assert len(set(held_chains)) == 400  # N·eval_size distinct held-out chains
    assert env.eval_tasks(10) == held[:10]  # a prefix
    with pytest.raises(ValueError, match="held-out tasks of 8 parts, which need"):
        relay_env(8).eval_tasks(200)
    assert len(relay_env(8).eval_tasks(100)) == 100  # the shipped configs' eval_size fits at N = 8


def test_resume_continues_the_same_stream():
    a = relay_env(3)
    a.sample_tasks(5)
    state = copy.deepcopy(a.state_dict())
    expected = a.sample_tasks(4)
    b = relay_env(3)
    b.load_state_dict(state)
    assert b.sample_tasks(4) == expected and state["cursor"] == 5
    with pytest.raises(ValueError, match="size"):
        relay_env(2).load_state_dict(state)


def test_describe_and_registry():
    env = build_env(TeamRelayConfig(name="team_relay", size=8))
    assert isinstance(env, TeamRelayEnv) and env.describe()["name"] == "team_relay" and "8" in env.describe()["source"]
    assert TeamRelayConfig(name="team_relay", size=5).num_parts == 5
    for field in TeamRelayConfig.model_fields.values():
        assert field.description


def turn(agent: str, index: int, text: str, answer: str | None = None, finish: str = "stop", verdict: str | None = None) -> Turn:
    parsed = {k: v for k, v in (("answer", answer), ("verdict", verdict)) if v is not None}
    return Turn(agent=agent, policy=agent, index=index, parent=None, messages=[], prompt_ids=[1], completion_ids=[2],
                logprobs=[0.0], text=text, parsed=parsed, finish_reason=finish)


def test_relay_score_of_hand_made_episodes():
    env = relay_env(3)
    task = Task("t", "1: 1+1 2: 2+2 3: 3+3", "2 4 6", meta={"parts": ["1+1", "2+2", "3+3"], "answers": ["2", "4", "6"]})
    turns = [turn("s1", 0, "ANSWER: 2", "2"), turn("s2", 1, "[masked]", finish="masked"), turn("s3", 2, "ANSWER: 6.0", "6.0")]
    ep = Episode(task, 0, 0, 0, turns=turns, answer="2 ? 6.0")
    assert env.score(ep) == 0.0
    assert ep.info["scores"] == {"part_1": 1.0, "part_2": 0.0, "part_3": 1.0, "at_once": 2 / 3}  # 6.0 has the value 6
    assert ep.info["designed"] == {"s1": 1.0, "s2": 0.0, "s3": 1.0}
    # an answer with a word too many has no part in place: every part is wrong, the reward 0
    ep = Episode(task, 0, 0, 0, turns=[], answer="2 4 6 8")
    assert env.score(ep) == 0.0 and set(ep.info["scores"].values()) == {0.0} and ep.info["designed"] == {}
    assert ep.info["decisions"] == {}
    ep = Episode(task, 0, 0, 0, turns=[], answer=None)
    assert env.score(ep) == 0.0
    ep = Episode(task, 0, 0, 0, turns=[], answer="2 4 6")
    assert env.score(ep) == 1.0


# --- designed ground truth of the other team tasks ---------------------------------------------------------------


def test_conjunctive_designed_reads_each_specialists_own_answer():
    env = TeamConjunctiveEnv(TeamConjunctiveConfig(name="team_conjunctive"))
    task = Task("t", "A: 1+1 B: 2+2", "2 4", meta={"parts": ["1+1", "2+2"]})
    ep = Episode(task, 0, 0, 0, turns=[turn("left", 0, "ANSWER: 2", "2"), turn("right", 1, "ANSWER: 5", "5")], answer="2 5")
    assert env.score(ep) == 0.0 and ep.info["scores"] == {"part_a": 1.0, "part_b": 0.0}
    assert ep.info["designed"] == {"left": 1.0, "right": 0.0}
    ep = Episode(task, 0, 0, 0, turns=[turn("left", 0, "", finish="removed"), turn("right", 1, "ANSWER: 4", "4")], answer="? 4")
    assert env.score(ep) == 0.0 and ep.info["scores"] == {"part_a": 0.0, "part_b": 1.0}  # '?' keeps part B in place
    assert ep.info["designed"] == {"left": 0.0, "right": 1.0}
    ep = Episode(task, 0, 0, 0, turns=[turn("left", 0, "ANSWER: two", "two"), turn("right", 1, "ANSWER: 4", "4")], answer="two 4")
    assert env.score(ep) == 0.0 and ep.info["scores"] == {"part_a": 0.0, "part_b": 1.0}
    # the earlier layout's reporter: its answer is the team's; it has no designed job
    turns = [turn("left", 0, "ANSWER: 2", "2"), turn("right", 1, "ANSWER: 4", "4"), turn("reporter", 2, "ANSWER: 2, 4", "2, 4")]
    ep = Episode(task, 0, 0, 0, turns=turns, answer="2, 4")
    assert env.score(ep) == 1.0 and ep.info["designed"] == {"left": 1.0, "right": 1.0}


@pytest.mark.parametrize("solver, reviewer, reward, designed", [
    ("5", None, 1.0, (1.0, 1.0)),   # right, accepted
    ("5", "4", 0.0, (1.0, 0.0)),    # right, overruled wrongly: the saboteur
    ("5", "5", 1.0, (1.0, 1.0)),    # right, "overruled" with the same value: no harm
    ("4", None, 0.0, (0.0, 0.0)),   # wrong, let stand
    ("4", "5", 1.0, (0.0, 1.0)),    # wrong, corrected
    ("4", "3", 0.0, (0.0, 1.0)),    # wrong, overruled (the verdict was right, the replacement wrong too)
    (None, None, 0.0, (0.0, 0.0)),  # no answer, nothing said after it
])
def test_saboteur_designed_judges_the_solver_by_its_answer_and_the_reviewer_by_its_verdict(solver, reviewer, reward, designed):
    env = TeamSaboteurEnv(TeamSaboteurConfig(name="team_saboteur"))
    task = Task("t", "2+3", "5")
    turns = [turn("solver", 0, f"ANSWER: {solver}", solver),
             turn("reviewer", 1, "x", reviewer, verdict="accept" if reviewer is None else "reject")]
    ep = Episode(task, 0, 0, 0, turns=turns, answer=reviewer or solver)
    assert env.score(ep) == reward
    assert ep.info["designed"] == {"solver": designed[0], "reviewer": designed[1]}
    turns[1] = turn("reviewer", 1, "[masked]", finish="masked")  # a masked reviewer did not do its job
    ep = Episode(task, 0, 0, 0, turns=turns, answer=solver)
    env.score(ep)
    assert ep.info["designed"]["reviewer"] == 0.0
