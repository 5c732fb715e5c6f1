"""The math verifier (envs/math/verify.py): a labelled table of answers, hand cases, bounds.

``tests/data/math_answers.jsonl`` holds one case per line: a prediction, a gold answer, the
expected verdict, a category (fractions, LaTeX, mixed numbers, percentages, thousands
separators, scientific notation, units, negatives, boxes, several answers, prose,
adversarial strings) and, where it matters, why.  Every case must hold.
"""

import asyncio
import builtins
import json
import threading
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from mas.envs.math import verify
from mas.envs.math.verify import (
    answer_key,
    extract_number,
    final_answer,
    gsm8k_final_answer,
    numbers_match,
    read_answer,
    read_number,
)
from mas.process.sandbox import Sandbox

TABLE = [json.loads(line) for line in (Path(__file__).parents[1] / "data" / "math_answers.jsonl").read_text(encoding="utf-8").splitlines()]
CATEGORIES = {"plain", "fraction", "latex_frac", "dfrac", "mixed", "percent", "thousands_comma", "thousands_space", "thousands_thin",
              "scientific", "units", "negative", "boxed", "several", "prose", "adversarial"}


def test_the_table_covers_every_category_with_80_cases_or_more():
    counts = Counter(row["category"] for row in TABLE)
    assert len(TABLE) >= 80 and set(counts) == CATEGORIES
    assert all(n >= 3 for n in counts.values()), counts
    assert sum(row["match"] for row in TABLE) >= 30 and sum(not row["match"] for row in TABLE) >= 30


@pytest.mark.parametrize("row", TABLE, ids=[f"{r['category']}-{i}" for i, r in enumerate(TABLE)])
def test_labelled_answers(row):
    assert numbers_match(row["pred"], row["gold"]) is row["match"], row.get("why", "")


@pytest.mark.parametrize(
    "pred, gold",
    [  # the false positives of issue 15: each earned reward 1.0
        ("ANSWER: \\frac{3}{4}", "4"), ("ANSWER: 1 000", "0"), ("ANSWER: 10^3", "3"), ("x = 3/4", "4"),
        ("The answer is 5, not 6", "6"),
    ],
)
def test_issue_false_positives_earn_nothing(pred, gold):
    from mas.agents.parsers import parse_answer

    answer = parse_answer(pred)[0].get("answer")  # what the answer parser hands the verifier
    assert not numbers_match(answer, gold) and not numbers_match(pred, gold)


@pytest.mark.parametrize("pred, gold", [("\\frac{3}{4}", "0.75"), ("1 000", "1000"), ("50%", "0.5")])
def test_issue_false_negatives_are_right(pred, gold):
    assert numbers_match(f"ANSWER: {pred}", gold) and numbers_match(pred, gold)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", Fraction(42)),
        ("The answer is 7.", Fraction(7)),
        ("3 + 4 = 7", Fraction(7)),
        ("1,234", Fraction(1234)),
        ("It costs $1,234,567.50 in total", Fraction(123456750, 100)),
        ("x = -5", Fraction(-5)),
        ("\u22127", Fraction(-7)),
        ("-$18", Fraction(-18)),
        (".5", Fraction(1, 2)),
        ("-3/4 of a pie", Fraction(-3, 4)),
        ("48/2 = 24", Fraction(24)),
        ("50%", Fraction(50)),  # as written; the match reads both 0.5 and 50
        ("3-5", None),  # a computation, not its last number
        ("(3+4)-2", None),
        ("1,2345", None),
        ("1.5.3", None),
        ("x2", None),
        ("2*3", None),
        ("1/0", None),
        ("\u0663", None),
        ("$", None),
        ("-", None),
        ("no digits here", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_number_hand_cases(text, expected):
    got = extract_number(text)
    assert got == expected
    assert got is None or isinstance(got, Fraction)


def test_final_answer_is_the_last_box_or_the_last_line():
    assert final_answer("work\n\n  ANSWER: 5  \n\n") == "ANSWER: 5"
    assert final_answer("\\boxed{1} and then \\boxed{\\frac{3}{4}} done") == "\\frac{3}{4}"
    assert final_answer("\\boxed{1} then \\boxed{2") is None  # a box that never closes: nothing
    assert final_answer("x" * (verify.MAX_ANSWER_CHARS + 1)) is None


def test_vote_keys_follow_the_verifier():
    assert answer_key("18") == answer_key("18.00") == answer_key("$18") == answer_key("\\boxed{18}") == answer_key("1.8e1")
    assert answer_key("1 000") == answer_key("1,000") != answer_key("0")
    assert answer_key("5, not 6") == "5, not 6"  # not a number: its own text


def test_gold_answers_must_be_numbers():
    with pytest.raises(ValueError, match="no number"):
        numbers_match("1", "unknown")
    assert read_number("1,234") is not None and read_number("$5") is not None and read_number("5 or 6") is None


def test_numbers_are_exact_and_bounded():
    assert extract_number("0.3") == Fraction(3, 10)
    assert extract_number("0.30000000000000004") != Fraction(3, 10)
    assert extract_number("9" * (verify.MAX_DIGITS + 1)) is None  # too long to be an answer; no int() overflow
    assert extract_number("1e300") is None and extract_number("1e200") == Fraction(10) ** 200


def test_nothing_is_evaluated(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the verifier must never eval/exec model output")

    texts = ["2*3", "2**2", "__import__('os').getpid()", "3+4", "6"]
    read_answer("0")  # warm up anything lazily imported
    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "compile", refuse)
    results = [extract_number(t) for t in texts]
    matches = [numbers_match(t, "6") for t in texts]
    monkeypatch.undo()
    assert results == [None, None, None, None, Fraction(6)] and matches == [False, False, False, False, True]


def test_latex_answers_are_verified_off_the_main_thread_and_inside_an_event_loop():
    """math-verify's own time limit (signal.alarm) raises off the main thread; here it runs in
    a worker process, so a reward computed on any thread or loop is the same."""
    out: dict[str, bool] = {}
    thread = threading.Thread(target=lambda: out.update(thread=numbers_match("\\dfrac{3}{4}", "0.75")))
    thread.start()
    thread.join()

    async def in_loop():
        return numbers_match("2\\frac{1}{2}", "2.5")

    assert out == {"thread": True} and asyncio.run(in_loop()) is True


def hang(_latex):
    threading.Event().wait()


def test_a_latex_answer_that_hangs_the_parser_reads_as_no_answer(monkeypatch):
    stuck = Sandbox({"latex_number": hang}, timeout_s=0.5, memory_mb=None, name="math verifier")
    monkeypatch.setitem(verify._LATEX, "sandbox", stuck)
    try:
        assert read_answer("\\frac{3}{4}") is None and not numbers_match("\\frac{3}{4}", "0.75")
        assert numbers_match("3/4", "0.75")  # plain numbers never need the parser
    finally:
        stuck.close()


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("She has 2+3=<<2+3=5>>5.\n#### 5") == "5"
    assert gsm8k_final_answer("so\n#### 1,234") == "1234"
    assert gsm8k_final_answer("#### -7 \n") == "-7"
    assert gsm8k_final_answer("a #### 1\n#### 2") == "2"  # the last marker counts


@pytest.mark.parametrize("bad", ["She has 5 apples.", "#### ", "####\n  "])
def test_gsm8k_final_answer_missing_raises(bad):
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer(bad)
