"""Output parsers: hand-written cases for every parser (answer, orchestrator, verdict, raw)."""

from __future__ import annotations

import builtins
import os
import subprocess

import pytest

from mas.agents.parsers import (PARSER_LABELS, PARSERS, parse_answer, parse_orchestrator, parse_raw, parse_verdict,
                                parsers_giving, register_parser)


def test_registry_names_every_parser():
    assert PARSERS == {"answer": parse_answer, "orchestrator": parse_orchestrator, "verdict": parse_verdict, "raw": parse_raw}
    assert list(PARSER_LABELS) == list(PARSERS)  # each built-in registers its labels beside its function
    assert PARSER_LABELS["orchestrator"] == {"call", "answer"} and PARSER_LABELS["verdict"] == {"accept", "reject", "answer"}
    assert parsers_giving("answer") == ["answer", "orchestrator", "raw", "verdict"] and parsers_giving("call") == ["orchestrator"]


@pytest.fixture
def registry_restored():
    before, labels = dict(PARSERS), dict(PARSER_LABELS)
    yield
    PARSERS.clear()
    PARSERS.update(before)
    PARSER_LABELS.clear()
    PARSER_LABELS.update(labels)


def test_register_parser_adds_after_the_built_ins_and_refuses_a_name_twice(registry_restored):
    def shout(text):
        return {"answer": text.upper(), "label": "answer"}, True

    register_parser("shout", shout)  # a plugin without labels: its routing is not checked
    assert list(PARSERS)[-1] == "shout" and "shout" not in PARSER_LABELS
    register_parser("whisper", shout, labels=["answer"])
    assert PARSER_LABELS["whisper"] == {"answer"} and "whisper" in parsers_giving("answer")
    with pytest.raises(ValueError, match="'answer' is already registered"):
        register_parser("answer", shout)
    with pytest.raises(TypeError, match="must be a function"):
        register_parser("loud", "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="labels is a collection"):
        register_parser("loud", shout, labels="answer")
    assert "loud" not in PARSERS


# --------------------------------------------------------------------------------------------
# orchestrator
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("CALL adder: 3+4", {"call": "adder", "subtask": "3+4", "label": "call"}),
        ("  CALL subtractor:   9-2  \n", {"call": "subtractor", "subtask": "9-2", "label": "call"}),
        ("call adder: 1+2", {"call": "adder", "subtask": "1+2", "label": "call"}),
        ("I need help. CALL checker: is 7 right?", {"call": "checker", "subtask": "is 7 right?", "label": "call"}),
        ("CALL code-runner: x", {"call": "code-runner", "subtask": "x", "label": "call"}),
        # the agent name is taken as written; the topology decides whether it exists
        ("CALL nobody: 2+2", {"call": "nobody", "subtask": "2+2", "label": "call"}),
    ],
)
def test_orchestrator_call(text, parsed):
    assert parse_orchestrator(text) == (parsed, True)


@pytest.mark.parametrize(
    "text, answer",
    [("ANSWER: 12", "12"), ("answer: -3", "-3"), ("So the total is 18.\nANSWER: 18\n", "18"), ("ANSWER :  7 apples", "7 apples")],
)
def test_orchestrator_answer(text, answer):
    assert parse_orchestrator(text) == ({"answer": answer, "label": "answer"}, True)


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        "",
        "   \n",
        "ANSWER:",
        "ANSWER:   ",  # used to raise IndexError
        "CALL adder:",  # empty subtask
        "CALL adder:    ",
        "CALL : 3+4",  # no agent
        "CALL 3+4",  # no colon
        "12",  # a bare number is no answer for the orchestrator
    ],
)
def test_orchestrator_invalid(text):
    assert parse_orchestrator(text) == ({}, False)


def test_orchestrator_empty_call_line_does_not_take_the_next_line_as_subtask():
    assert parse_orchestrator("CALL adder:\nANSWER: 5") == ({"answer": "5", "label": "answer"}, True)
    assert parse_orchestrator("CALL adder:   \nmore text") == ({}, False)


def test_orchestrator_first_marker_wins():
    parsed, valid = parse_orchestrator("ANSWER: 7\nCALL adder: 3+4")
    assert (parsed, valid) == ({"answer": "7", "label": "answer"}, True)
    parsed, valid = parse_orchestrator("CALL adder: 3+4\nANSWER: 7")
    assert valid and parsed["label"] == "call" and parsed["call"] == "adder" and parsed["subtask"].startswith("3+4")


def test_orchestrator_word_answer_before_call_is_not_a_marker():
    # "answer" in prose before the CALL must not make a later ANSWER marker win
    parsed, valid = parse_orchestrator("The answer needs a sum. CALL adder: 3+4\nANSWER: 7")
    assert valid and parsed["label"] == "call" and parsed["call"] == "adder"


def test_orchestrator_call_inside_a_word_is_not_a_call():
    # "Recall" contains "call"; it must not swallow the answer that follows
    assert parse_orchestrator("Recall the rule: add them. ANSWER: 7") == ({"answer": "7", "label": "answer"}, True)
    assert parse_orchestrator("Recall that: 3+4") == ({}, False)


# --------------------------------------------------------------------------------------------
# answer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("ANSWER: 12", "12"),
        ("answer: 1,234", "1,234"),
        ("Work: 3+4=7.\nANSWER: 7\nThanks", "7"),
        ("ANSWER: 5\nANSWER: 6", "5"),
        ("ANSWER:\n42", "42"),
        ("ANSWER: -3.5", "-3.5"),
        # what real instruct models write (tests/agents/test_real_outputs.py has a few hundred)
        ("**ANSWER:** 71.", "71"), ("**Answer**: 71", "71"), ("### Final Answer: 71", "71"), ("ANSWER = 71", "71"),
        ("The answer is 18.", "18"), ("So the final answer is: 1995", "1995"), ("the answer is:\n 7", "7"),
        ("The answer is **9**.", "9"), ("ANSWER: 9. Then 8+4=12", "9"), ("\\boxed{12}", "12"), ("so x = \\boxed{3/4}.", "3/4"),
        ("ANSWER: St. Louis", "St. Louis"), ("ANSWER: Paris. It is the capital.", "Paris"), ("ANSWER: U.S.", "U.S."),
        # the answer as stated: a hedge is the verifier's to read (it reads none, envs/math/verify.py)
        ("The answer is 5, not 6", "5, not 6"),
    ],
)
def test_answer_marker(text, answer):
    assert parse_answer(text) == ({"answer": answer, "label": "answer"}, True)


@pytest.mark.parametrize(
    "text, number",
    [("x = -1,000.50", "-1,000.50"), ("7", "7"), ("x = 3/4", "3/4"), ("Thus 18.", "18"),
     ("work\nSo the total is $18", "$18"),
     # a hedge, a rejected value or a computation is no answer: never one of several numbers
     ("the result is 12 or 13", None), ("So it is 5, not 6", None), ("3 5", None), ("2*3", None),
     # "answer is" without a value after it is no marker
     ("The answer is correct.", None), ("I know what the answer is.", None), ("The answer is not 8.", None),
     ("ANSWER:   \n", None), ("ANSWER:", None), ("I got 9. ANSWER:", None)],
)
def test_answer_without_marker_reads_one_stated_number_and_is_invalid(text, number):
    """The unmarked fallback reads what the math verifier reads (envs/math/verify.py)."""
    parsed, valid = parse_answer(text)
    assert valid is False
    assert parsed == ({"answer": number, "label": "answer"} if number is not None else {})


@pytest.mark.parametrize("text", ["garbage", "", "ANSWER:", "no digits here"])
def test_answer_invalid(text):
    assert parse_answer(text) == ({}, False)


# --------------------------------------------------------------------------------------------
# verdict
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, verdict",
    [("ACCEPT", "accept"), ("REJECT", "reject"), ("accept", "accept"), ("Looks right. ACCEPT.", "accept"),
     ("REJECT: 3+4 is not 8", "reject"), ("ACCEPTED", "accept"), ("**Rejected.**", "reject")],
)
def test_verdict_without_answer(text, verdict):
    assert parse_verdict(text) == ({"verdict": verdict, "label": verdict}, True)


@pytest.mark.parametrize(
    "text, verdict, answer",
    [("ACCEPT\nANSWER: 12", "accept", "12"), ("REJECT. The sum is wrong.\nANSWER: 7", "reject", "7"),
     ("ANSWER: 4\nACCEPT", "accept", "4")],
)
def test_verdict_with_answer(text, verdict, answer):
    assert parse_verdict(text) == ({"answer": answer, "verdict": verdict, "label": verdict}, True)


def test_verdict_first_word_wins():
    assert parse_verdict("REJECT, I cannot ACCEPT this")[0]["verdict"] == "reject"


@pytest.mark.parametrize("text", ["garbage", "", "UNACCEPTABLE", "rejects", "ANSWER:  ", "Acceptance"])
def test_verdict_invalid(text):
    assert parse_verdict(text) == ({}, False)


def test_verdict_answer_without_verdict_is_invalid_but_keeps_the_answer():
    assert parse_verdict("ANSWER: 4") == ({"answer": "4", "label": "answer"}, False)


# --------------------------------------------------------------------------------------------
# raw
# --------------------------------------------------------------------------------------------


def test_raw():
    assert parse_raw("  The answer is 4.\n") == ({"answer": "The answer is 4.", "label": "answer"}, True)
    assert parse_raw("") == ({}, False)
    assert parse_raw(" \n\t") == ({}, False)


# --------------------------------------------------------------------------------------------
# no evaluation of model output
# --------------------------------------------------------------------------------------------


def test_python_in_output_is_never_executed(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    calls: list[str] = []

    def forbidden(name):
        def f(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"parser called {name}")
        return f

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, forbidden(name))
    monkeypatch.setattr(os, "system", forbidden("os.system"))
    monkeypatch.setattr(subprocess, "run", forbidden("subprocess.run"))
    monkeypatch.setattr(subprocess, "Popen", forbidden("subprocess.Popen"))

    payload = f"__import__('os').system('touch {marker}')"
    texts = [payload, f"ANSWER: {payload}", f"CALL adder: {payload}", f"ACCEPT {payload}", f"open('{marker}', 'w')",
             "ANSWER: {{7*7}}", "ANSWER: ${7*7}"]
    results = {(name, text): parse(text) for name, parse in PARSERS.items() for text in texts}
    monkeypatch.undo()

    assert calls == [] and not marker.exists()
    # the payload is either rejected or returned verbatim as a string, never evaluated
    payload = "__import__('os').system('x')"
    assert parse_answer(payload) == ({}, False)
    assert parse_orchestrator(payload) == ({}, False)
    assert parse_verdict(payload) == ({}, False)
    assert parse_answer(f"ANSWER: {payload}") == ({"answer": payload, "label": "answer"}, True)
    assert parse_orchestrator(f"CALL adder: {payload}") == ({"call": "adder", "subtask": payload, "label": "call"}, True)
    assert parse_answer("ANSWER: {{7*7}}")[0]["answer"] == "{{7*7}}"
    for parsed, valid in results.values():
        assert isinstance(valid, bool)
        assert all(isinstance(v, str) for v in parsed.values())
