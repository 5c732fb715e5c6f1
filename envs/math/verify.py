"""Math answers: what the final answer is, how it is read, and when it is right.

A policy under RL learns whatever earns reward, so the verifier reads exactly one value, and
only where the text states it as the answer.  Model output is untrusted (docs/architecture.md, "Errors
and bad input"): nothing here calls ``eval``; every scan is linear in the text's length.

**The final answer** of a text is, in order:

1. the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), if the text has one; a box
   that never closes (truncated output) makes the text unreadable rather than falling back to
   an earlier box;
2. otherwise the last non-empty line (the answer parsers already cut the line after
   ``ANSWER:``, see ``agents/parsers.py``).

That span is read as a value if it *is* a number, after removing:

* everything up to the last ``=``: "x = 3/4" is 3/4 and "3 + 4 = 7" is 7;
* up to twelve words before the number and four after it (units), with no digits among
  them and none of the words that change, hedge or reject a value ("not", "or", "half",
  "about", "wrong", "than", ... ``_STOP_WORDS``): "The answer is 18.", "She makes $18 a day";
* math delimiters (``$...$``, ``\\(...\\)``, ``\\[...\\]``), Markdown emphasis, one pair of
  enclosing brackets, a final full stop.

A number is: an optional sign (``-``, ``+``, ``\u2212``) and currency sign (``$``, ``\u20ac``,
``\u00a3``); an integer with optional thousands separators (all the same: ``,``, a space, a
thin or no-break space, LaTeX ``{,}`` or ``\\,``, groups of exactly three digits), with an
optional decimal part; or a fraction ``a/b``; or a mixed number ``1 1/2``; optionally in
scientific notation (``1.5e3``, ``1.5 x 10^3``, ``1.5 \\times 10^{3}``, ``10^3``); optionally
a percentage (``%``, ``\\%``, "percent"); optionally followed by up to four unit words
("18 dollars", "3.5 km/h").  Digits are ASCII: other scripts' digits are not read.  LaTeX
forms (``\\frac{3}{4}``, ``\\dfrac``, ``2\\frac{1}{2}``, ``18\\text{ dollars}``, ``\\left(...\\right)``)
are parsed by math-verify (Hugging Face's answer parser, no ``eval``) and accepted only if
they come out as a single number: an unevaluated expression (``3+4``, ``2^{10}``,
``\\sqrt{16}``) is a computation, not an answer, so "echo the question" earns nothing.

Anything else reads as no answer: "5, not 6", "5 or 6", "18 is wrong", "about 18", "half of
18", two numbers of any kind.  This is the fallback for
unmarked text too (``unmarked_answer``): it never picks one of several numbers, so a hedge or
a rejected value cannot earn reward.

**Matching** is exact (``fractions.Fraction``: 0.1 + 0.2 style float errors cannot make a
right answer wrong or a wrong answer right): the value equals the gold value.  A percentage
on one side only matches either reading of it: "50%" matches 0.5 and 50 (GSM8K asks "what
percent" and stores 50).  The gold must be a number in the same sense; a gold that is not
raises ValueError (a silent False would make every episode look like a failure).

**Bounds.** A span longer than ``MAX_ANSWER_CHARS`` or a number longer than ``MAX_DIGITS``
digits is not read.  math-verify's own time limit is ``signal.alarm``: it works only on the
main thread (elsewhere it raises), in whole seconds, and cannot stop work stuck in C
(big-integer arithmetic); so math-verify runs in a ``mas.process.sandbox.Sandbox`` worker process,
killed after ``LATEX_TIMEOUT_S`` (the answer then reads as none and scores 0), whatever
thread or event loop the reward is computed on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "Number",
    "answer_key",
    "extract_number",
    "final_answer",
    "gsm8k_final_answer",
    "numbers_match",
    "read_answer",
    "read_number",
    "score_answer",
    "unmarked_answer",
]

MAX_ANSWER_CHARS = 300  # an answer span longer than this is not an answer
MAX_DIGITS = 256  # digits of one number (and the largest power of ten) that are read
LATEX_TIMEOUT_S = 5.0  # math-verify's parse of one LaTeX answer, in its worker process
LATEX_MEMORY_MB = 1024

_DIGITS = frozenset("0123456789")
_THOUSANDS = (",", " ", "\u2009", "\u202f", "\u00a0")  # comma, space, thin / narrow no-break / no-break space
_CURRENCY = "$\u20ac\u00a3"
_SIGNS = {"-": True, "\u2212": True, "+": False}
# words around a number that change, hedge or reject it: "not 18", "half of 18", "18 or 19", "18 is wrong"
_STOP_WORDS = frozenset({
    "not", "no", "wrong", "incorrect", "false", "or", "nor", "and", "than", "more", "less", "fewer", "greater",
    "smaller", "larger", "except", "but", "minus", "plus", "times", "squared", "cubed", "divided", "over", "under",
    "above", "below", "approximately", "about", "around", "roughly", "maybe", "perhaps", "probably", "possibly",
    "nearly", "almost", "least", "most", "isn't", "wasn't", "aren't", "never", "if", "unless", "either", "neither",
    "half", "twice", "double", "triple", "quarter", "third", "fourth", "fifth", "tenth", "instead", "without",
    "sqrt", "square", "root", "log", "ln", "exp", "factorial", "power", "between", "excluding", "multiplied", "divide",
})
_MAX_UNIT_WORDS = 4  # words after the number ("dollars", "km per hour")
_MAX_PREFIX_WORDS = 12  # words before it ("She makes", "The answer is")
_LATEX_REPLACEMENTS = (
    ("\\$", "$"), ("\\%", "%"), ("{,}", ","), ("\\,", "\u2009"), ("\\!", ""), ("\\;", " "), ("\\:", " "),
    ("\\ ", " "), ("~", " "), ("\\left", ""), ("\\right", ""), ("\\displaystyle", ""), ("\\times", "\u00d7"),
    ("\\cdot", "\u00b7"), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
)
_TIMES = ("\u00d7", "\u00b7", "x", "X", "*")
_TEXT_COMMANDS = ("\\text{", "\\textrm{", "\\textbf{", "\\mathrm{", "\\mbox{", "\\operatorname{")


@dataclass(frozen=True)
class Number:
    """A value read from an answer: ``value`` as written ("50%" -> 50, percent=True), and its text."""

    value: Fraction
    percent: bool = False
    text: str = ""

    def readings(self) -> tuple[Fraction, ...]:
        """The values the number may stand for: a percentage is p/100 or, in "what percent" answers, p."""
        return (self.value / 100, self.value) if self.percent else (self.value,)

    def matches(self, gold: "Number") -> bool:
        if self.percent and gold.percent:
            return self.value == gold.value
        return any(a == b for a in self.readings() for b in gold.readings())

    def key(self) -> str:
        """A canonical text: equal numbers (18, 18.00, $18) give one key."""
        return f"{self.value}%" if self.percent else str(self.value)


# ------------------------------------------------------------------------------------------
# the final-answer span
# ------------------------------------------------------------------------------------------


def _boxed(text: str) -> str | None | bool:
    """Content of the last ``\\boxed{}``/``\\fbox{}``; False when there is none; None when the last never closes."""
    starts = [p for p in (text.rfind("\\boxed{"), text.rfind("\\fbox{")) if p >= 0]
    if not starts:
        return False
    start = max(starts)
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, min(len(text), i + MAX_ANSWER_CHARS + 1)):  # a longer box is no answer anyway
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None if len(text) - i <= MAX_ANSWER_CHARS else ""


def final_answer(text: str | None) -> str | None:
    """The span that holds the final answer (see the module docstring), or None."""
    if not text:
        return None
    box = _boxed(text)
    if box is None:
        return None
    if box is not False:
        span = box
    else:
        end = len(text.rstrip())
        start = text.rfind("\n", 0, end) + 1
        span = text[start:end]
    span = span.strip()
    return span if 0 < len(span) <= MAX_ANSWER_CHARS else None


def _unwrap(s: str) -> str:
    """Remove math delimiters, Markdown emphasis, one pair of brackets and final full stops."""
    for _ in range(3):
        before = s
        s = s.strip()
        for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"), ("*", "*"), ("__", "__"), ("`", "`")):
            if len(s) > len(a) + len(b) and s.startswith(a) and s.endswith(b):
                s = s[len(a) : len(s) - len(b)].strip()
        while s.endswith(".") and not s.endswith(".."):
            s = s[:-1].rstrip()
        if len(s) > 2 and s[0] + s[-1] in ("()", "[]") and s.count(s[0]) == 1 and s.count(s[-1]) == 1:
            s = s[1:-1].strip()
        if s == before:
            break
    return s


def _split_prefix(s: str) -> tuple[str, str] | None:
    """(words before the number, the rest) if the words may stand before an answer, else None."""
    start = -1
    for i, c in enumerate(s):
        nxt = s[i + 1 : i + 2]
        if c in _DIGITS or c == "\\" or (c in _CURRENCY and (nxt in _DIGITS or nxt in "-\\")) \
                or (c in "-+\u2212.$" and (nxt in _DIGITS or nxt in _CURRENCY or nxt == "\\")):
            start = i
            break
    if start < 0 or (start > 0 and (s[start - 1].isalnum() or s[start - 1] == "_")):  # "x2", "CO2": part of a word
        return None
    words = s[:start].replace(":", " ").replace(",", " ").split()
    if len(words) > _MAX_PREFIX_WORDS:
        return None
    for w in words:
        core = w.strip("\"'*_`").lower()
        if core in _STOP_WORDS or not all(c.isalpha() or c in "'\u2019-" for c in core):
            return None
    return s[:start], s[start:]


def _after_equals(s: str) -> str:
    """The text after the last "=" (not part of <=, >=, !=, ==), or the text."""
    i = s.rfind("=")
    if i < 0 or (i > 0 and s[i - 1] in "<>!=") or (i + 1 < len(s) and s[i + 1] == "="):
        return s
    return s[i + 1 :]


def _answer_text(text: str | None) -> str | None:
    """The text of the final answer's value: the span without "...=", the words before it and wrapping."""
    span = final_answer(text)
    if span is None:
        return None
    split = _split_prefix(_unwrap(_after_equals(_unwrap(span))))
    if split is None:
        return None
    s = _unwrap(split[1])
    return s or None


# ------------------------------------------------------------------------------------------
# numbers
# ------------------------------------------------------------------------------------------


def _digits(s: str, i: int) -> int:
    """End of the run of ASCII digits starting at ``i``."""
    while i < len(s) and s[i] in _DIGITS:
        i += 1
    return i


def _integer(s: str, i: int) -> tuple[str, int] | None:
    """An integer with optional thousands separators at ``i``: (its digits, end)."""
    j = _digits(s, i)
    if j == i:
        return None
    digits = s[i:j]
    if j - i <= 3 and j < len(s) and s[j] in _THOUSANDS:
        sep, groups, k = s[j], [digits], j
        while k < len(s) and s[k] == sep and _digits(s, k + 1) == k + 4:
            groups.append(s[k + 1 : k + 4])
            k += 4
        if len(groups) > 1:
            return "".join(groups), k
    return digits, j


def _exponent(s: str, i: int) -> tuple[int, int] | None:
    """``3``, ``-2``, ``{3}`` or ``{-2}`` at ``i``: (value, end)."""
    braced = i < len(s) and s[i] == "{"
    j = i + 1 if braced else i
    neg = j < len(s) and s[j] in "-\u2212+"
    k = _digits(s, j + 1 if neg else j)
    if k == (j + 1 if neg else j):
        return None
    value = int(s[j + 1 if neg else j : k]) if k - j < 6 else MAX_DIGITS + 1
    if neg and s[j] != "+":
        value = -value
    if braced:
        if k >= len(s) or s[k] != "}":
            return None
        k += 1
    return value, k


def _skip_spaces(s: str, i: int) -> int:
    while i < len(s) and s[i] == " ":
        i += 1
    return i


def _unit_tail(s: str) -> bool:
    """True if ``s`` is empty or up to four unit words ("dollars", "km/h", "cm^2"), none of them a stop word."""
    words = s.split()
    if len(words) > _MAX_UNIT_WORDS:
        return False
    for w in words:
        core = w.rstrip(".,")
        if core.lower() in _STOP_WORDS or not core:
            return False
        for p in ("^2", "^3", "^{2}", "^{3}", "\u00b2", "\u00b3"):
            if core.endswith(p):
                core = core[: -len(p)]
        if not all(c.isalpha() or c in "/'\u00b0-" + _CURRENCY for c in core) or any(c in _DIGITS for c in core):
            return False
    return True


def _untext(s: str) -> str:
    """``\\text{dollars}`` (and \\mathrm, \\mbox, ...) -> `` dollars ``: units and words in LaTeX are text."""
    if "\\" not in s:
        return s
    out, pos = [], 0
    while True:
        hits = [(i, c) for c in _TEXT_COMMANDS for i in (s.find(c, pos),) if i >= 0]
        if not hits:
            break
        i, command = min(hits)
        close = s.find("}", i + len(command))
        if close < 0:
            break
        out += [s[pos:i], " ", s[i + len(command) : close], " "]
        pos = close + 1
    out.append(s[pos:])
    return "".join(out)


def read_number(text: str | None) -> Number | None:
    """``text`` as one number (the whole of it; see the module docstring), or None.

    Plain text only: a span with LaTeX commands is read by ``read_answer`` (math-verify).
    """
    if not text or len(text) > MAX_ANSWER_CHARS:
        return None
    s = _untext(text.strip()).strip()
    for a, b in _LATEX_REPLACEMENTS:
        if a in s:
            s = s.replace(a, b)
    if "\\" in s:
        return None
    i, neg = 0, False
    if i < len(s) and s[i] in _SIGNS:
        neg, i = _SIGNS[s[i]], i + 1
    if i < len(s) and s[i] in _CURRENCY:
        i += 1
        if i < len(s) and s[i] in _SIGNS and s[0] not in _SIGNS:  # "$-18"
            neg, i = _SIGNS[s[i]], i + 1
    start = i
    whole = _integer(s, i)
    if whole is not None:
        digits, i = whole
    elif i < len(s) and s[i] == "." and _digits(s, i + 1) > i + 1:
        digits = "0"
    else:
        return None
    value: Fraction
    frac = ""
    if i < len(s) and s[i] == "." and _digits(s, i + 1) > i + 1:
        j = _digits(s, i + 1)
        frac, i = s[i + 1 : j], j
    if len(digits) + len(frac) > MAX_DIGITS:
        return None
    value = Fraction(int(digits + frac), 10 ** len(frac))
    k = _skip_spaces(s, i)
    if not frac and k < len(s) and s[k] == "/":  # a fraction "3/4" (or "3 / 4")
        den = _integer(s, _skip_spaces(s, k + 1))
        if den is None or "," in s[start:i] or int(den[0]) == 0 or len(den[0]) > MAX_DIGITS:
            return None
        value, i = value / int(den[0]), den[1]
    elif not frac and k > i and k < len(s) and s[k] in _DIGITS:  # a mixed number "1 1/2"
        num = _integer(s, k)
        if num is not None and num[1] < len(s) and s[num[1]] == "/":
            den = _integer(s, num[1] + 1)
            if den is not None and 0 < int(num[0]) < int(den[0]) and len(num[0]) + len(den[0]) <= MAX_DIGITS:
                value, i = value + Fraction(int(num[0]), int(den[0])), den[1]
    # scientific notation: 1.5e3, 1.5 x 10^3, 10^3
    exp = None
    if i < len(s) and s[i] in "eE" and i + 1 < len(s) and (s[i + 1] in _DIGITS or s[i + 1] in "+-"):
        exp = _exponent(s, i + 1)
    elif digits == "10" and not frac and i < len(s) and s[i] == "^" and s[start:i] == "10":
        e = _exponent(s, i + 1)
        if e is not None:
            value, exp = Fraction(1), e
    else:
        k = _skip_spaces(s, i)
        if k < len(s) and s[k] in _TIMES:
            k = _skip_spaces(s, k + 1)
            if s.startswith("10^", k):
                exp = _exponent(s, k + 3)
    if exp is not None:
        power, i = exp
        if abs(power) > MAX_DIGITS:
            return None
        value *= Fraction(10) ** power
    k = _skip_spaces(s, i)
    percent = False
    if k < len(s) and s[k] == "%":
        percent, i = True, k + 1
    elif s[k : k + 7].lower() == "percent" and (k + 7 == len(s) or not s[k + 7].isalpha()):
        percent, i = True, k + 7
    if i < len(s) and (s[i] in _DIGITS or s[i] in "./^,"):
        return None  # "1.5.3", "3/4/5", "2^10", "5, 6": not one number
    if not _unit_tail(s[i:]):
        return None
    return Number(-value if neg else value, percent, text.strip())


# ------------------------------------------------------------------------------------------
# LaTeX numbers through math-verify, in a worker process
# ------------------------------------------------------------------------------------------


def _latex_number_local(latex: str) -> tuple[int, int] | None:
    """(numerator, denominator) of ``latex`` if math-verify parses it to one number, else None.

    Runs in the sandbox worker (math-verify's own alarm-based timeout works there: it is the
    worker's main thread); the sandbox's kill is the hard bound.
    """
    import sympy
    from math_verify import LatexExtractionConfig, parse

    parsed = parse(f"${latex}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=max(1, int(LATEX_TIMEOUT_S) - 1))
    if not parsed or not isinstance(parsed[0], sympy.Basic):
        return None
    value = parsed[0]
    if isinstance(value, (sympy.Integer, sympy.Rational)):
        return int(value.p), int(value.q)
    if isinstance(value, sympy.Float) and value.is_finite:
        number = read_number(parsed[1]) if len(parsed) > 1 and isinstance(parsed[1], str) else None
        exact = number.value if number is not None and not number.percent else Fraction(str(value))
        return exact.numerator, exact.denominator
    return None


_LATEX: dict[str, object] = {}
_LATEX_LOCK = threading.Lock()


def _latex_sandbox():
    """The math-verify worker, started on first use (math-verify is imported here first, so
    every worker forked later has it loaded)."""
    with _LATEX_LOCK:
        if "sandbox" not in _LATEX:
            import math_verify  # noqa: F401 - loaded once in this process, inherited by the workers

            from mas.process.sandbox import Sandbox

            _LATEX["sandbox"] = Sandbox({"latex_number": _latex_number_local}, timeout_s=LATEX_TIMEOUT_S,
                                        memory_mb=LATEX_MEMORY_MB, workers=1, name="math verifier")
        return _LATEX["sandbox"]


def _latex_number(latex: str) -> Fraction | None:
    from mas.process.sandbox import SandboxError

    try:
        out = _latex_sandbox()("latex_number", latex)
    except (SandboxError, Exception):  # noqa: BLE001 - over the limits, or math-verify failed: no answer
        return None
    return None if out is None else Fraction(out[0], out[1])


# ------------------------------------------------------------------------------------------
# answers
# ------------------------------------------------------------------------------------------


def read_answer(text: str | None) -> Number | None:
    """The value of ``text``'s final answer (see the module docstring), or None."""
    s = _answer_text(text)
    if s is None:
        return None
    number = read_number(s)
    if number is not None or "\\" not in s:
        return number
    body, percent = s, False
    for mark in ("\\%", "%"):
        if body.endswith(mark):
            body, percent = body[: -len(mark)].rstrip(), True
            break
    value = _latex_number(body)
    return None if value is None else Number(value, percent, s)


def unmarked_answer(text: str | None) -> str | None:
    """What the answer parser takes from text without an ``ANSWER:`` marker: the text of its final
    answer if that reads as one number (LaTeX answers are left to the verifier), else None."""
    s = _answer_text(text)
    if s is None:
        return None
    if "\\" in s:
        return s
    return s if read_number(s) is not None else None


def extract_number(text: str | None) -> Fraction | None:
    """The value of ``text``'s final answer as written ("50%" -> 50), or None."""
    number = read_answer(text)
    return None if number is None else number.value


def answer_key(text: str) -> str:
    """A vote key: answers with equal values ("18", "18.00", "$18", "\\boxed{18}") share one."""
    number = read_answer(text)
    return number.key() if number is not None else text.strip().lower()


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
    """True when the final answer of ``pred_text`` has the gold's value (exactly; see the module docstring).

    A prediction without a readable answer never matches. A gold text that is not a number
    is a data error and raises ValueError (a silent False would make every episode look
    like a failure).
    """
    gold = read_answer(gold_text)
    if gold is None:
        raise ValueError(f"gold answer {gold_text!r} contains no number")
    pred = read_answer(pred_text)
    return pred is not None and pred.matches(gold)


def score_answer(episode) -> float:
    """Outcome reward of a math episode: 1.0 if the team's answer has the reference value, else 0.0
    (no answer: 0.0).  The ``score`` of both math envs."""
    if episode.answer is None:
        return 0.0
    return 1.0 if numbers_match(episode.answer, episode.task.answer) else 0.0
