"""Hand cases for the safe math verifier (envs/math/verify.py)."""

import builtins
import time
from fractions import Fraction

import pytest

from mas.envs.math.verify import extract_number, gsm8k_final_answer, numbers_match


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", Fraction(42)),
        ("The answer is 7.", Fraction(7)),  # trailing full stop is not a decimal point
        ("3 + 4 = 7", Fraction(7)),  # last number wins
        ("1,234", Fraction(1234)),
        ("It costs $1,234,567.50 in total", Fraction(123456750, 100)),
        ("-5", Fraction(-5)),
        ("x = -5", Fraction(-5)),
        ("\u22127", Fraction(-7)),  # Unicode minus sign
        ("3-5", Fraction(5)),  # binary minus, not a sign
        ("(3+4)-2", Fraction(2)),
        ("-$18", Fraction(-18)),
        ("$18", Fraction(18)),
        ("18.00", Fraction(18)),
        (".5", Fraction(1, 2)),
        ("3/4", Fraction(3, 4)),
        ("-3/4 of a pie", Fraction(-3, 4)),
        ("48/2 = 24", Fraction(24)),
        ("1,2345", Fraction(2345)),  # not a thousands group: two numbers
        ("1.5.3", Fraction(3, 2)),  # a version string is not two numbers
        ("50%", Fraction(50)),
        ("x2", Fraction(2)),
    ],
)
def test_extract_number_hand_cases(text, expected):
    got = extract_number(text)
    assert got == expected
    assert isinstance(got, Fraction)


@pytest.mark.parametrize(
    "text",
    [None, "", "no digits here", "__import__('os').system('true')", "1/0", "\u0663", "$", "-"],
)
def test_extract_number_none(text):
    assert extract_number(text) is None


def test_extract_number_is_exact_not_float():
    # 0.1 + 0.2 != 0.3 in floats; the verifier must not care.
    assert extract_number("0.3") == Fraction(3, 10)
    assert extract_number("0.30000000000000004") != Fraction(3, 10)


def test_extract_number_huge_input_is_bounded():
    start = time.perf_counter()
    assert extract_number("9" * 100_000) is None  # too long to be an answer; no int() overflow
    assert extract_number("1" * 300 + " so the answer is 12") == Fraction(12)
    assert time.perf_counter() - start < 1.0


def test_nothing_is_evaluated(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the verifier must never eval/exec model output")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "compile", refuse)
    monkeypatch.setattr(builtins, "__import__", refuse)  # also catches lazy imports
    # An evaluator would answer 6 / 2; reading the last number gives 3 / 4.
    assert extract_number("2*3") == 3
    assert extract_number("2**2") == 2
    assert not numbers_match("2*3", "6")
    assert numbers_match("2*3", "3")
    assert extract_number("__import__('os').getpid()") is None


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("She has 2+3=<<2+3=5>>5.\n#### 5") == "5"
    assert gsm8k_final_answer("so\n#### 1,234") == "1234"
    assert gsm8k_final_answer("#### -7 \n") == "-7"
    assert gsm8k_final_answer("a #### 1\n#### 2") == "2"  # the last marker counts


@pytest.mark.parametrize("bad", ["She has 5 apples.", "#### ", "####\n  "])
def test_gsm8k_final_answer_missing_raises(bad):
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer(bad)


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("18", "18", True),
        ("18.00", "18", True),
        ("$18", "18", True),
        ("The total is $1,234.", "1234", True),
        ("0.75", "3/4", True),
        ("3/4", "0.75", True),
        ("17", "18", False),
        ("-5", "5", False),
        ("18.5", "18", False),
        ("I don't know", "18", False),
        ("", "18", False),
        (None, "18", False),
        ("18 or maybe 19", "18", False),  # last number is the prediction
    ],
)
def test_numbers_match(pred, gold, expected):
    assert numbers_match(pred, gold) is expected


def test_numbers_match_gold_without_number_raises():
    with pytest.raises(ValueError, match="no number"):
        numbers_match("1", "unknown")
