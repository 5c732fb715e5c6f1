"""Safe answer extraction and checking for math tasks.

Model output is untrusted (DESIGN.md, "Errors and bad input"): nothing here calls ``eval``,
``exec`` or a symbolic parser. A number is read with one regular expression and converted
with :class:`fractions.Fraction`, so checking is exact (no float rounding: ``0.1 + 0.2``
style errors cannot make a right answer wrong or a wrong answer right).

Convention (the usual one for GSM8K-style outcome rewards): the prediction is the *last*
number in the text, so "3 + 4 = 7" reads as 7 and "The answer is $1,234.00." as 1234.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["extract_number", "gsm8k_final_answer", "numbers_match"]

# Longest number we convert; longer digit runs are not answers (and Python refuses to parse
# ints over 4300 digits anyway). Bounding it keeps Fraction() cheap on adversarial text.
_MAX_DIGITS = 256

_NUMBER = re.compile(
    r"""
    (?:(?<![\w.)\]])(?P<sign>[-\u2212]))?  # a sign only where it cannot be a binary minus
    \$?                                    # currency: "$18", "-$18"
    (?<![\d.])                             # never start inside another number ("1.5" is one)
    (?P<num>
        (?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?  # "1,234,567.5" or "1234567.5"
      | \.\d+                                 # ".5"
    )
    (?:/(?P<den>\d+))?                     # "3/4"
    """,
    re.VERBOSE | re.ASCII,  # ASCII: \d is 0-9 only, not every Unicode digit
)


def _to_fraction(m: re.Match[str]) -> Fraction | None:
    num, den = m.group("num").replace(",", ""), m.group("den")
    if len(num) + len(den or "") > _MAX_DIGITS:
        return None
    value = Fraction(num)
    if den is not None:
        if int(den) == 0:
            return None  # "1/0" has no value
        value /= int(den)
    return -value if m.group("sign") else value


def extract_number(text: str | None) -> Fraction | None:
    """The last number in ``text`` as an exact Fraction, or None when there is none.

    Handles thousands separators ("1,234"), signs ("-5", "-$5"), decimals ("18.00", ".5"),
    currency ("$18"), and simple fractions ("3/4"); ASCII digits only. A minus directly after a
    digit, letter or ")" is read as subtraction, not a sign: "3-5" ends in 5, not -5.
    If the last number-like token has no value ("1/0", or over 256 digits) the result is None
    rather than an earlier number, so the reward never comes from a number the text did not
    end on.
    """
    if not text:
        return None
    last: re.Match[str] | None = None
    for last in _NUMBER.finditer(text):
        pass
    return None if last is None else _to_fraction(last)


def gsm8k_final_answer(solution_text: str) -> str:
    """The final answer of a GSM8K solution: the text after the last "#### ", commas removed.

    Raises ValueError when the marker is missing or nothing follows it.
    """
    marker = "####"
    pos = solution_text.rfind(marker)
    if pos < 0:
        preview = solution_text[-80:].replace("\n", "\\n")
        raise ValueError(
            f"GSM8K solution has no final-answer line '#### <answer>' (ends with: {preview!r})"
        )
    answer = solution_text[pos + len(marker) :].strip().replace(",", "")
    if not answer:
        raise ValueError("GSM8K solution has an empty final answer after '####'")
    return answer


def numbers_match(pred_text: str | None, gold_text: str) -> bool:
    """True when the last number in ``pred_text`` equals the number in ``gold_text`` exactly.

    A prediction with no number never matches. A gold text with no number is a data error
    and raises ValueError (a silent False would make every episode look like a failure).
    """
    gold = extract_number(gold_text)
    if gold is None:
        raise ValueError(f"gold answer {gold_text!r} contains no number")
    pred = extract_number(pred_text)
    return pred is not None and pred == gold


def score_answer(episode) -> float:
    """Outcome reward of a math episode: 1.0 if the team's answer has the reference number, else 0.0
    (no answer: 0.0).  The ``score`` of both math envs."""
    if episode.answer is None:
        return 0.0
    return 1.0 if numbers_match(episode.answer, episode.task.answer) else 0.0
