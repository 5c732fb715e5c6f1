"""Turn verifiers (envs/verifiers.py): each built-in one on hand-made turns, right and wrong, and the registry."""

from __future__ import annotations

import pytest

from mas.envs import build_env
from mas.envs.math.gsm8k import GSM8KConfig
from mas.envs.math.synthetic import SyntheticMathConfig, make_task
from mas.envs.math.turns import evaluate_arithmetic, verify_math_turn
from mas.envs.research.turns import verify_search_turn
from mas.envs.team.relay import TeamRelayConfig, verify_part_turn
from mas.envs.team.saboteur import verify_saboteur_turn
from mas.envs.verifiers import check_score, get_verifier, register_verifier, resolve_verifier, verifier_names
from mas.types import Episode, Task, Turn


def turn(agent: str, index: int, text: str, parsed: dict, parent: int | None = None, **kw) -> Turn:
    return Turn(agent, f"{agent}_p", index, parent, [], [1], [2], [0.0], text, parsed=parsed, **kw)


def call(index: int, callee: str, sub: str) -> Turn:
    return turn("orchestrator", index, f"CALL {callee}: {sub}", {"call": callee, "subtask": sub, "label": "call"})


def reply(index: int, agent: str, value: str, parent: int) -> Turn:
    return turn(agent, index, f"ANSWER: {value}", {"answer": value, "label": "answer"}, parent=parent)


def answer(index: int, value: str, agent: str = "orchestrator") -> Turn:
    return turn(agent, index, f"ANSWER: {value}", {"answer": value, "label": "answer"})


def verdict(index: int, word: str, agent: str = "checker") -> Turn:
    return turn(agent, index, word.upper(), {"verdict": word, "label": word})


def step(index: int, text: str, agent: str = "worker") -> Turn:
    return turn(agent, index, text, {"answer": text, "label": "answer"})


def episode(task: Task, turns: list[Turn]) -> Episode:
    return Episode(task=task, group_id=0, sample_id=0, seed=0, turns=turns)


def scores(ep: Episode, fn=verify_math_turn) -> list[float | None]:
    return [fn(ep, t) for t in ep.turns]


TASK = make_task([7, 5, 3], ["+", "-"])  # 7+5-3 = 9: steps 7+5=12, 12-3=9


# --- synthetic math: the orchestrator and its specialists ------------------------------------------


def test_a_correct_delegation_scores_every_turn():
    ep = episode(TASK, [call(0, "adder", "7+5"), reply(1, "adder", "12", 0), call(2, "subtractor", "12-3"),
                        reply(3, "subtractor", "9", 2), answer(4, "9")])
    assert scores(ep) == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_each_wrong_job_is_blamed_on_its_own_turn():
    # the adder's 7+5 = 13 is wrong; the orchestrator then rightly copies 13 into the next step
    ep = episode(TASK, [call(0, "adder", "7 + 5"), reply(1, "adder", "13", 0), call(2, "subtractor", "13-3"),
                        reply(3, "subtractor", "10", 2), answer(4, "10")])
    assert scores(ep) == [1.0, 0.0, 1.0, 1.0, 1.0]  # the answer copies the result the conversation's steps reached


def test_a_call_is_checked_for_operands_operation_and_the_callee():
    for sub, callee, want in (("7+5", "adder", 1.0), ("5+7", "adder", 1.0),  # + commutes
                              ("7+6", "adder", 0.0), ("7-5", "subtractor", 0.0), ("7+5", "subtractor", 0.0),
                              ("7+5", "calculator", 1.0),  # a callee whose name says nothing is not checked
                              ("7+5-3", "adder", 0.0),  # the whole task repeated: no step
                              ("seven plus five", "adder", 0.0)):
        assert verify_math_turn(episode(TASK, [call(0, callee, sub)]), call(0, callee, sub)) == want, (sub, callee)
    # subtraction does not commute
    ep = episode(TASK, [call(0, "adder", "7+5"), reply(1, "adder", "12", 0), call(2, "subtractor", "3-12")])
    assert scores(ep)[2] == 0.0


def test_a_specialist_is_judged_on_what_it_was_asked():
    """Asked the wrong sum, the adder that answers it right did its job; the call did not."""
    ep = episode(TASK, [call(0, "adder", "7+6"), reply(1, "adder", "13", 0)])
    assert scores(ep) == [0.0, 1.0]
    ep = episode(TASK, [call(0, "adder", "7+6"), reply(1, "adder", "12", 0)])
    assert scores(ep) == [0.0, 0.0]  # the task's right value, but not what it was asked
    # a sub-problem that is not plain arithmetic cannot be checked
    ep = episode(TASK, [call(0, "adder", "the first two numbers"), reply(1, "adder", "12", 0)])
    assert scores(ep) == [0.0, None]


def test_a_miscopied_step_does_not_advance_the_chain():
    """After 7+6 (not a step of the task) the right next call is still 7+5."""
    ep = episode(TASK, [call(0, "adder", "7+6"), reply(1, "adder", "13", 0), call(2, "adder", "7+5"),
                        reply(3, "adder", "12", 2), call(4, "subtractor", "13-3")])
    assert scores(ep) == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_answers_at_once_and_after_the_steps():
    assert scores(episode(TASK, [answer(0, "9")])) == [1.0]  # at once and right
    assert scores(episode(TASK, [answer(0, "12")])) == [0.0]
    # a call after every step is done is no step
    ep = episode(TASK, [call(0, "adder", "7+5"), reply(1, "adder", "12", 0), call(2, "subtractor", "12-3"),
                        reply(3, "subtractor", "9", 2), call(4, "adder", "9+0")])
    assert scores(ep)[4] == 0.0
    # an unparsed orchestrator turn did no step
    assert scores(episode(TASK, [turn("orchestrator", 0, "hmm", {})])) == [0.0]


def test_masked_turns_and_tasks_without_steps_get_none():
    masked = turn("adder", 0, "[masked]", {}, finish_reason="masked")
    assert verify_math_turn(episode(TASK, [masked]), masked) is None
    plain = Task("t", "What is it?", "4")
    a = answer(0, "4")
    assert verify_math_turn(episode(plain, [a]), a) is None


# --- chain, graph and debate -----------------------------------------------------------------------


def test_a_verdict_is_right_when_it_matches_the_standing_answer():
    for said, word, want in (("9", "accept", 1.0), ("9", "reject", 0.0), ("8", "reject", 1.0), ("8", "accept", 0.0)):
        ep = episode(TASK, [answer(0, said, "solver"), verdict(1, word, "verifier")])
        assert scores(ep) == [float(said == "9"), want], (said, word)
    # with nothing to accept yet, rejecting is right
    assert scores(episode(TASK, [verdict(0, "reject")])) == [1.0]
    assert scores(episode(TASK, [verdict(0, "accept")])) == [0.0]


def test_graph_worker_steps_and_checker():
    ep = episode(TASK, [verdict(0, "reject"), step(1, "7+5=12"), verdict(2, "reject"), step(3, "12-3=9"),
                        verdict(4, "accept"), answer(5, "9", "answerer")])
    assert scores(ep) == [1.0] * 6
    # a wrong result, the wrong operand, a step without its result, a repeated step
    for text in ("7+5=13", "7+4=11", "7+5", "7+5-3"):
        ep = episode(TASK, [step(0, text)])
        assert scores(ep) == [0.0], text
    ep = episode(TASK, [step(0, "7+5=12"), step(1, "7+5=12")])
    assert scores(ep) == [1.0, 0.0]
    # accepting after only the first step (12 is not the answer) is wrong
    ep = episode(TASK, [step(0, "7+5=12"), verdict(1, "accept")])
    assert scores(ep) == [1.0, 0.0]


def test_debaters_are_checked_against_the_gold_answer():
    ep = episode(TASK, [answer(0, "9", "alpha"), answer(1, "10", "beta"), answer(2, "9", "alpha"), answer(3, "9", "beta")])
    assert scores(ep) == [1.0, 0.0, 1.0, 1.0]


def test_arithmetic_is_read_without_eval():
    assert evaluate_arithmetic("7 + 5 =") == 12
    assert evaluate_arithmetic("(3+4)*2") == 14 and evaluate_arithmetic("3+4*2") == 11
    assert evaluate_arithmetic("12 \u2212 3") == 9 and evaluate_arithmetic("-3+4") == 1
    for bad in ("__import__('os')", "3/4", "3**4", "7+", "", None, "1" * 200, "((((1))))" + ")"):
        assert evaluate_arithmetic(bad) is None


# --- the team tasks -----------------------------------------------------------------------------


def test_relay_parts_are_scored_turn_by_turn():
    env = build_env(TeamRelayConfig(name="team_relay", size=3))
    task = env.sample_tasks(1)[0]
    gold = task.meta["answers"]
    wrong = str(int(gold[1]) + 1)
    turns = [answer(0, gold[0], "s1"), answer(1, wrong, "s2"), answer(2, f"{gold[2]} because", "s3")]
    ep = episode(task, turns)
    assert [env.verify_turn(ep, t) for t in turns] == [1.0, 0.0, 1.0]
    assert verify_part_turn(ep, turn("s4", 3, "extra", {})) is None  # no part of its own


def test_saboteur_reviewer_is_judged_by_its_verdict():
    task = make_task([7, 5], ["+"])
    # a right answer overruled by a wrong one: the solver did its job, the reviewer did not
    ep = episode(task, [answer(0, "12", "solver"), turn("reviewer", 1, "REJECT ANSWER: 13", {"verdict": "reject", "answer": "13"})])
    assert scores(ep, verify_saboteur_turn) == [1.0, 0.0]
    # a wrong answer let stand
    ep = episode(task, [answer(0, "11", "solver"), verdict(1, "accept", "reviewer")])
    assert scores(ep, verify_saboteur_turn) == [0.0, 0.0]
    # a wrong answer overruled: right verdict, even with a wrong replacement
    ep = episode(task, [answer(0, "11", "solver"), turn("reviewer", 1, "REJECT ANSWER: 10", {"verdict": "reject", "answer": "10"})])
    assert scores(ep, verify_saboteur_turn) == [0.0, 1.0]


# --- research ---------------------------------------------------------------------------------------


def test_a_search_turn_is_scored_by_whether_it_reached_a_supporting_paragraph():
    task = Task("q", "Who founded X?", "Ann", meta={"answers": ["Ann"], "supporting": ["Acme Corp", "Ann Lee"]})
    hit = turn("researcher", 0, "...", {}, tool_calls=[{"name": "search"}],
               observations=['search("acme", k=2): 2 result(s)\n1. Acme Corp: Acme was founded by ...\n2. Other: ...'])
    read = turn("researcher", 1, "...", {}, tool_calls=[{"name": "read"}], observations=["Ann Lee: Ann Lee is ..."])
    miss = turn("researcher", 2, "...", {}, tool_calls=[{"name": "search"}],
                observations=['search("x", k=1): 1 result(s)\n1. Acme Corporation History: not the one ...'])
    talk = answer(3, "Ann", "answerer")
    ep = episode(task, [hit, read, miss, talk])
    assert scores(ep, verify_search_turn) == [1.0, 1.0, 0.0, None]


def test_gsm8k_has_no_verifier_and_auto_gives_none():
    env = build_env(GSM8KConfig(name="gsm8k", source="sample"))
    assert resolve_verifier("auto", env) is None
    math_env = build_env(SyntheticMathConfig(name="synthetic_math"))
    assert resolve_verifier("auto", math_env) == math_env.verify_turn
    assert resolve_verifier("none", math_env) is None
    assert resolve_verifier("team_relay", math_env) is verify_part_turn


# --- the registry ------------------------------------------------------------------------------------


def test_registry_names_and_errors(monkeypatch):
    from mas.envs import verifiers

    monkeypatch.setattr(verifiers, "_VERIFIERS", dict(verifiers._VERIFIERS))
    assert verifier_names()[:2] == ["auto", "none"] and "synthetic_math" in verifier_names()
    register_verifier("mine", lambda ep, t: 1.0)
    assert get_verifier("mine")(None, None) == 1.0
    with pytest.raises(ValueError, match="already registered"):
        register_verifier("mine", lambda ep, t: 1.0)
    for reserved in ("auto", "none"):
        with pytest.raises(ValueError, match="reserved"):
            register_verifier(reserved, lambda ep, t: 1.0)
    with pytest.raises(KeyError, match="valid: auto, none, .*mine"):
        get_verifier("nope")


def test_scores_are_checked():
    assert check_score(None) is None and check_score(True) == 1.0 and check_score(0) == 0.0 and check_score(0.25) == 0.25
    for bad in (1.7, -0.1, float("nan"), float("inf"), "high", [1]):
        with pytest.raises(ValueError, match=r"\[0, 1\] or None"):
            check_score(bad)
