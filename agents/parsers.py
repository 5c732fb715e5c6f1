"""Output parsers: read an agent's text into a small dict, never with eval.

Every parser returns ``(parsed, valid)``.  ``parsed`` may hold:
    answer   the agent's answer string
    call     the specialist an orchestrator delegates to, with ``subtask``
    verdict  "accept" or "reject"
    label    the routing label used by graph edges: "answer", "call", "accept" or "reject"

Formats (also documented in the README):
    answer        ``ANSWER: <answer>``; without the marker the last number counts, but the turn is invalid
    orchestrator  ``CALL <agent>: <subtask>`` or ``ANSWER: <answer>``
    verdict       ``ACCEPT`` or ``REJECT``, optionally followed by ``ANSWER: <answer>``
    raw           the whole text is the answer
"""

from __future__ import annotations

import re
from typing import Any, Callable

# \b: the markers are words ("Recall that: ..." is no CALL); the subtask starts on the CALL line
_ANSWER = re.compile(r"\bANSWER\s*:\s*(.+)", re.IGNORECASE)
_CALL = re.compile(r"\bCALL\s+([A-Za-z_][\w-]*)\s*:[ \t]*(\S.*)", re.IGNORECASE | re.DOTALL)
_VERDICT = re.compile(r"\b(ACCEPT|REJECT)\b", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

Parsed = tuple[dict[str, Any], bool]


def _answer_marker(text: str) -> str | None:
    """The first line after the first ANSWER marker; "" for a marker with only blanks after it."""
    m = _ANSWER.search(text)
    if m is None:
        return None
    lines = m.group(1).strip().splitlines()  # [] for "ANSWER:  " (the old [0] raised IndexError)
    return lines[0].strip() if lines else ""


def _answer_start(text: str) -> int | None:
    m = _ANSWER.search(text)
    return m.start() if m else None


def parse_answer(text: str) -> Parsed:
    ans = _answer_marker(text)
    if ans is not None and ans:
        return {"answer": ans, "label": "answer"}, True
    nums = _NUMBER.findall(text)
    if nums:
        return {"answer": nums[-1], "label": "answer"}, False
    return {}, False


def parse_orchestrator(text: str) -> Parsed:
    call = _CALL.search(text)
    ans = _answer_marker(text)
    if call and (ans is None or call.start() < _answer_start(text)):  # the first marker wins
        subtask = call.group(2).strip()
        if subtask:
            return {"call": call.group(1), "subtask": subtask, "label": "call"}, True
    if ans:
        return {"answer": ans, "label": "answer"}, True
    return {}, False


def parse_verdict(text: str) -> Parsed:
    m = _VERDICT.search(text)
    out: dict[str, Any] = {}
    ans = _answer_marker(text)
    if ans:
        out["answer"] = ans
    if not m:
        if ans:
            out["label"] = "answer"
        return out, False
    out["verdict"] = m.group(1).lower()
    out["label"] = out["verdict"]
    return out, True


def parse_raw(text: str) -> Parsed:
    text = text.strip()
    return ({"answer": text, "label": "answer"}, True) if text else ({}, False)


PARSERS: dict[str, Callable[[str], Parsed]] = {
    "answer": parse_answer,
    "orchestrator": parse_orchestrator,
    "verdict": parse_verdict,
    "raw": parse_raw,
}


def register_parser(name: str, fn: Callable[[str], Parsed]) -> None:
    """Add a parser ``fn(text) -> (parsed, valid)`` under ``name`` (a plugin's, see mas/plugins.py).
    Registering a name twice is a ValueError."""
    if name in PARSERS:
        raise ValueError(f"parser {name!r} is already registered")
    if not callable(fn):
        raise TypeError(f"parser {name!r} must be a function text -> (parsed dict, valid), got {type(fn).__name__}")
    PARSERS[name] = fn


def parser_names() -> list[str]:
    """Registered parser names (built-in first)."""
    return list(PARSERS)
