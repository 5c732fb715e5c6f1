"""Output parsers: read an agent's text into a small dict, never with eval.

Every parser returns ``(parsed, valid)``.  ``parsed`` may hold:
    answer   the agent's answer string
    call     the specialist an orchestrator delegates to, with ``subtask``
    verdict  "accept" or "reject"
    label    the routing label used by graph edges: "answer", "call", "accept" or "reject"

Formats (also documented in the README):
    answer        ``ANSWER: <answer>``; without the marker, the text's final answer if it reads
                  as one number (the math verifier's reading, ``envs/math/verify.py``: "x = 3/4"
                  gives 3/4, "5, not 6" gives nothing), and the turn is invalid
    orchestrator  ``CALL <agent>: <subtask>`` or ``ANSWER: <answer>``
    verdict       ``ACCEPT`` or ``REJECT``, optionally followed by ``ANSWER: <answer>``
    raw           the whole text is the answer

Markers are words (``\\b``: "Recall that: ..." is no CALL) in any case.  The answer is the
first non-blank line after the first ``ANSWER:``; a subtask starts on its CALL line.

Model output is untrusted and may be degenerate (megabytes of whitespace, 10^5 repeated
markers), so every parser runs in linear time: each pattern's quantifiers are separated by
characters they cannot share (whitespace, then a name, then whitespace, then ":"), so a
failed attempt gives each character back at most once and a match starts only at a marker
word; everything else is plain string slicing.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from mas.envs.math.verify import unmarked_answer

_ANSWER = re.compile(r"\bANSWER\s*:", re.IGNORECASE)
_CALL = re.compile(r"\bCALL\s+([A-Za-z_][\w-]*)\s*:[ \t]*(?=\S)", re.IGNORECASE)
_VERDICT = re.compile(r"\b(?:ACCEPT|REJECT)\b", re.IGNORECASE)

Parsed = tuple[dict[str, Any], bool]


def _answer_marker(text: str) -> tuple[int, str] | None:
    """(position, answer) of the first ANSWER marker: the first non-blank line after it ("" if none)."""
    m = _ANSWER.search(text)
    if m is None:
        return None
    rest = text[m.end() :].lstrip()
    end = rest.find("\n")
    return m.start(), (rest if end < 0 else rest[:end]).strip()


def _call_marker(text: str) -> tuple[int, str, str] | None:
    """(position, agent, subtask) of the first well-formed ``CALL <agent>: <subtask>``."""
    m = _CALL.search(text)
    return None if m is None else (m.start(), m.group(1), text[m.end() :].strip())


def parse_answer(text: str) -> Parsed:
    marker = _answer_marker(text)
    if marker is not None and marker[1]:
        return {"answer": marker[1], "label": "answer"}, True
    fallback = unmarked_answer(text)
    if fallback is not None:
        return {"answer": fallback, "label": "answer"}, False
    return {}, False


def parse_orchestrator(text: str) -> Parsed:
    call = _call_marker(text)
    marker = _answer_marker(text)
    if call is not None and (marker is None or call[0] < marker[0]):  # the first marker wins
        return {"call": call[1], "subtask": call[2], "label": "call"}, True
    if marker is not None and marker[1]:
        return {"answer": marker[1], "label": "answer"}, True
    return {}, False


def parse_verdict(text: str) -> Parsed:
    m = _VERDICT.search(text)
    out: dict[str, Any] = {}
    marker = _answer_marker(text)
    if marker is not None and marker[1]:
        out["answer"] = marker[1]
    if not m:
        if "answer" in out:
            out["label"] = "answer"
        return out, False
    out["verdict"] = m.group(0).lower()
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
