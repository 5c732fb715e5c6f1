"""Output parsers: read an agent's text into a small dict, never with eval.

Every parser returns ``(parsed, valid)``.  ``parsed`` may hold:
    answer   the agent's answer string
    call     the specialist an orchestrator delegates to, with ``subtask``
    verdict  "accept" or "reject"
    label    the routing label used by graph edges: "answer", "call", "accept" or "reject"

Formats (also documented in docs/topologies.md):
    answer        an answer marker, then the answer; without one, the text's final answer if it
                  reads as one number (the math verifier's reading, ``envs/math/verify.py``: "x =
                  3/4" gives 3/4, "the sum of 3 and 4 is 7" gives 7, "5, not 6" gives nothing),
                  and the turn is invalid
    orchestrator  ``CALL <agent>: <subtask>`` or an answer marker and the answer
    verdict       ``ACCEPT`` or ``REJECT`` (also ``Accepted``, ``Rejected``), optionally with an answer
    raw           the whole text is the answer

What real instruct models write is read as they mean it (tests/agents/test_real_outputs.py
holds over 300 labelled outputs of SmolLM2-135M-Instruct and the rules they were labelled by).  Answer
markers, in any case: ``ANSWER: 7``, ``Final answer: 7``, ``ANSWER = 7``, Markdown around them
(``**ANSWER:** 7.``, ``### Answer: 7``), an answer stated in a sentence (``The answer is 7.``, ``so
the final answer is: 7``, ``The answer to this puzzle is 7.``), and LaTeX ``\\boxed{7}``.  The
answer is the rest of the line after the first marker (the first non-blank line when the marker
ends its line), without Markdown emphasis around it, without a full stop after a number or a
word, and without a new clause or more sums after the value (``18, and 2 pizzas cost ...``, ``18
18-9 = 17``).  An answer that is not the writer's is none (``Your answer is correct``, ``the
offered answer is``), nor is a marker copied from the prompt (``end with ANSWER: and the
result``).  ``CALL <agent>: <subtask>`` may carry Markdown emphasis too (``**CALL Adder:** 3 +
4``); the name is taken as written (the topology matches it without regard to case); the subtask
is the rest of its line, without a plan of the next step copied from the prompt's example
(``CALL adder: 8+4, then after ...``).  Markers are words (``\\b``: "Recall that: ..." is no CALL).
Prose that merely mentions a number is no answer, and an unmarked number is never a valid one.
A verdict word in prose after "to", "be" or a modal (``to be accepted``) is no verdict.

Model output is untrusted and may be degenerate (megabytes of whitespace, 10^5 repeated
markers), so every parser runs in linear time: each pattern's quantifiers are separated by
characters they cannot share (whitespace, then a name, then emphasis, then ":") or bounded
("answer to <at most 60 characters> is"), so a failed attempt gives each character back at
most once, or a bounded number of times, and a match starts only at a marker word; what is read
around a marker is read from a bounded window; everything else is plain string slicing.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

from mas.envs.math.verify import MAX_ANSWER_CHARS, unmarked_answer

# "ANSWER:" / "ANSWER =" (emphasis around the word), or "answer is" in a sentence (group 1), also
# "answer to <what, up to 60 characters of one sentence> is"; the bound keeps a failed attempt short
_ANSWER = re.compile(r"\b(?:ANSWER[*_]*\s*[:=]|"
                     r"(answer(?:[ \t]+to[ \t](?:[^\n.:;!?]|\.(?=\S)){0,60}?[ \t]|[ \t]+)is)\b)", re.IGNORECASE)
# "the answer is correct", "... is a retelling of ...": a judgement or a description, not a value
_NOT_ANSWERS = ("not", "correct", "incorrect", "right", "wrong", "true", "false", "as follows", "a", "an",
                "the same")
# "your answer is", "the offered answer is", "an alternative to the answer is": not the writer's answer
_OTHERS = frozenset({"your", "this", "that", "offered", "proposed", "previous", "other", "their", "his", "her", "its"})
_PREPOSITIONS = frozenset({"to", "of", "for", "with", "from", "about"})
_FILLERS = ("indeed ", "actually ", "simply ")  # "the answer is indeed 9"
_WORD = re.compile(r"[^\W_]")  # a letter or a digit: an answer has one
_NUMBER_CHARS = frozenset("0123456789.,$%-")
_CALL = re.compile(r"\bCALL\s+[*`]*([A-Za-z_][\w-]*)[*`]*\s*:[*`]*[ \t]*(?=\S)", re.IGNORECASE)
_VERDICT = re.compile(r"\b(?:ACCEPT|REJECT)(?:ED)?\b", re.IGNORECASE)
_JUDGEMENT = re.compile(r"[ \t]*(?:(?:yes|no)\b[,.!]?[ \t]*)?(?:that'?s|that is|this is|it'?s|it is|the (?:answer|solution|solver|"
                        r"result) is)[ \t]+(not[ \t]+)?(correct|right|wrong|incorrect)\b", re.IGNORECASE)
# "Right.", "Wrong!": a one-word judgement that is the whole first sentence of a reply
_BARE_JUDGEMENT = re.compile(r"[ \t*_]*(correct|right|wrong|incorrect)[*_]*(?:[.!]|[ \t\r\n]*\Z)", re.IGNORECASE)
# "to be accepted", "cannot accept": a verdict word in prose, hypothetical or negated, is no verdict
_NOT_VERDICTS = frozenset({"to", "be", "been", "being", "not", "cannot", "can't", "could", "would", "should", "might",
                           "may", "won't"})
_EMPHASIS = "*_"  # Markdown emphasis around a marker
# a line that quotes another agent as a debate transcript shows them ("- alpha: ..."); bounded length
_QUOTE = re.compile(r"[ \t]*-[ \t]+[A-Za-z][\w-]{0,30}:")
# "<value> is the answer", "<value>, which is also the answer": the value named the answer, without a marker
_NAMED = re.compile(r" is (?:also |indeed )?the (?:final |correct )?answer\b", re.IGNORECASE)

Parsed = tuple[dict[str, Any], bool]

# Every parser by name: the built-ins below register themselves beside their functions, in this
# order (answer, orchestrator, verdict, raw), before any plugin's.
PARSERS: dict[str, Callable[[str], Parsed]] = {}

# The routing labels each parser can give a turn, where its registration says; a topology's routing
# (a graph edge's ``when``, an orchestrator's CALL, a chain's REJECT) reads these, and its kind
# checks that an agent's parser can give what its place in the topology needs.  A parser not
# listed here (a plugin's registered without labels) is not checked.
PARSER_LABELS: dict[str, frozenset[str]] = {}


def register_parser(name: str, fn: Callable[[str], Parsed], labels: Iterable[str] | None = None) -> None:
    """Add a parser ``fn(text) -> (parsed, valid)`` under ``name`` (a plugin's, see mas/config/plugins.py),
    with the routing ``labels`` it can give, if known (``PARSER_LABELS``).  Registering a name twice is a
    ValueError."""
    if name in PARSERS:
        raise ValueError(f"parser {name!r} is already registered")
    if not callable(fn):
        raise TypeError(f"parser {name!r} must be a function text -> (parsed dict, valid), got {type(fn).__name__}")
    if isinstance(labels, str):
        raise TypeError(f"parser {name!r}: labels is a collection of labels, e.g. {{{labels!r}}}, got the string {labels!r}")
    PARSERS[name] = fn
    if labels is not None:
        PARSER_LABELS[name] = frozenset(labels)


def parser_names() -> list[str]:
    """Registered parser names (built-in first)."""
    return list(PARSERS)


def parsers_giving(label: str) -> list[str]:
    """The parsers registered with ``label`` among their labels (the built-ins), sorted."""
    return sorted(p for p, labels in PARSER_LABELS.items() if label in labels)


def _clean(answer: str) -> str:
    """An answer without what follows it in its sentence ("1, but ..." -> "1", "18, and 2 pizzas ..." ->
    "18"; "5, not 6" stays a hedge), without sums written after a number ("18 18-9 = 17" -> "18") or
    after its sentence ("9. 8+4=12" -> "9"; "St. Louis" and "U.S." keep their stops), without
    Markdown emphasis around it and a full stop after it ("**71.**" -> "71")."""
    for clause in (", but ", ", so ", ", which ", ", and "):  # a new clause after the value: "1, but to you ..."
        at = answer.find(clause)
        if at > 0:
            answer = answer[:at]
    head = answer.split(None, 1)
    if len(head) == 2 and "=" in head[1] and _NUMBER_CHARS.issuperset(head[0]) and _WORD.search(head[0]):
        answer = head[0]  # "18 18-9 = 17 ...": a number, then more sums after it
    end = answer.find(". ")
    while end > 0:
        word = (answer[max(0, end - 40) : end].rsplit(None, 1) or [""])[-1].strip("*_`")  # bounded: linear over many stops
        if word[-1:].isdigit() or (len(word) >= 4 and word.isalpha()):  # a sentence ends here, not an abbreviation
            answer = answer[:end]
            break
        end = answer.find(". ", end + 2)
    answer = _unemphasise(answer)
    if answer.endswith("."):
        body = answer[:-1].rstrip("*")
        if body[-1:].isdigit() or (body[-1:].isalpha() and "." not in body[-3:]):  # "U.S." keeps its stop
            answer = body
    return _unemphasise(answer)


def _unemphasise(s: str) -> str:
    """``s`` without Markdown emphasis around it: asterisks at either end, or a pair of ``_``/`````."""
    s = s.strip().strip("*").strip()
    for mark in ("__", "_", "`"):
        if len(s) > 2 * len(mark) and s.startswith(mark) and s.endswith(mark):
            s = s[len(mark) : -len(mark)].strip()
    return s.strip("*").strip()


def _skip(text: str, i: int, chars: str) -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i


def _others_answer(text: str, at: int) -> bool:
    """Whether the "answer" at ``at`` is not the writer's answer but another's or a part of one
    ("your answer is", "an alternative to the answer is"): the two words before it, read from a
    bounded window."""
    words = text[max(0, at - 30) : at].lower().split()
    if words and words[-1] in _OTHERS:
        return True
    return len(words) >= 2 and words[-1] == "the" and words[-2] in _PREPOSITIONS


def _answer_marker(text: str) -> tuple[int, str] | None:
    """(position, answer) of the answer marker: the rest of its line, or the first non-blank line
    after it when the marker ends its line ("" if none); else the last ``\\boxed{}``.

    The first ``ANSWER:`` is the protocol's answer (what follows it may be degenerate repetition);
    in prose a model reasons towards its answer, so of several "the answer is" sentences the last
    is its conclusion.  "answer is" counts only where a value follows it (not "the answer is
    correct", "what the answer is.", "the answer is indeed (") and where the answer is the
    writer's own (not "your answer is", "an alternative to the answer is").  A marker copied from
    the prompt ("end with ANSWER: and the result") is none.
    """
    found = None
    line_start = scanned = 0
    quoted = -1  # where the current line's quote prefix ends (-1: none), read once per line
    for m in _ANSWER.finditer(text):
        newline = text.rfind("\n", scanned, m.start())  # each character is scanned once over all markers
        if newline >= 0 or scanned == 0:
            line_start = newline + 1
            quote = _QUOTE.match(text, line_start)
            quoted = quote.end() if quote is not None else -1
        scanned = m.start()
        if 0 <= quoted <= m.start():  # "- alpha: The answer is 2": another agent's answer
            continue
        i = _skip(text, m.end(), _EMPHASIS)
        if m.group(1):  # in a sentence: "is", "is:", "is **"
            if _others_answer(text, m.start()):
                continue
            i = _skip(text, i, " \t" + _EMPHASIS)
            i = _skip(text, i + 1 if text.startswith(":", i) else i, " \t\r\n" + _EMPHASIS)
            head = text[i : i + 12].lower()
            filler = next((w for w in _FILLERS if head.startswith(w)), "")
            if filler:
                i = _skip(text, i + len(filler), " \t" + _EMPHASIS)
                head = text[i : i + 12].lower()
            line_end = text.find("\n", i, i + MAX_ANSWER_CHARS)  # bounded: a value within an answer's length
            if i == len(text) or text[i] in ".,;:!?" or any(
                    head.startswith(w) and not head[len(w) : len(w) + 1].isalpha() for w in _NOT_ANSWERS) or (
                    _WORD.search(text, i, i + MAX_ANSWER_CHARS if line_end < 0 else line_end) is None):
                continue
        i = _skip(text, i, " \t\r\n")
        if text[i : i + 4].lower() == "and ":  # the prompt's instruction, copied: "end with ANSWER: and the result"
            continue
        found = m.start(), i  # read once, after the loop: a line end sought per marker would be quadratic
        if not m.group(1):
            break
    if found is not None:
        at, i = found
        end = text.find("\n", i)
        answer = _clean(text[i : len(text) if end < 0 else end])
        return at, answer if _WORD.search(answer) else ""  # "ANSWER: (" was cut off
    box = _boxed(text)
    return None if box is None else (len(text), box)


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (closed on its line), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    end = text.find("}", start)
    line = text.find("\n", start)
    if end < 0 or (0 <= line < end):
        return None
    return text[start + len("\\boxed{") : end].strip() or None


def _call_marker(text: str) -> tuple[int, str, str] | None:
    """(position, agent, subtask) of the first well-formed ``CALL <agent>: <subtask>``.  The subtask
    is the rest of its line (a reply is one line) up to the plan of a next step that a model copies
    from the prompt's worked example: "CALL adder: 8+4, then after "adder: ..." gives "8+4"."""
    m = _CALL.search(text)
    if m is None:
        return None
    end = text.find("\n", m.end())
    subtask = text[m.end() : len(text) if end < 0 else end]
    at = subtask.find(", then ")
    while at >= 0:
        if subtask[at + 7 : at + 13].lower() in ("after ", "after\"") or subtask[at + 7 : at + 12].lower() == "call ":
            subtask = subtask[:at]
            break
        at = subtask.find(", then ", at + 7)
    return m.start(), m.group(1), subtask.strip().rstrip("*").strip()


def _unmarked(text: str) -> str | None:
    """The final answer of text without a marker, as the math verifier reads its last line
    (``unmarked_answer``); failing that, that line's value named the answer ("1 is the answer to
    the question. 2. 3" -> 1), before a remark in brackets ("10 (doubling)"), after a relative
    clause is cut ("540, which is the answer"), in its last sentence, or after its last "is" ("the
    sum of 2 and 3 is 5", "... is indeed 9").  A last line quoting another debater ("- beta: 19")
    is theirs, not an answer."""
    end = len(text.rstrip())
    line = text[text.rfind("\n", 0, end) + 1 : end]
    if _QUOTE.match(line):
        return None
    got = unmarked_answer(text)
    if got is not None:
        return got
    if len(line) > MAX_ANSWER_CHARS:
        return None
    spans = []
    named = None
    for named in _NAMED.finditer(line):  # the last "<value> is the answer" (a line is short: bounded)
        pass
    if named is not None:
        value = line[: named.start()].removesuffix(", which")
        spans.append(value[value.rfind(". ") + 1 :])
    if line.endswith(")") and re.search(r"[A-Za-z]", line[line.rfind("(") :]):  # "10 (doubling)": a remark
        spans.append(line[: line.rfind("(")])
    which = line.rfind(", which")
    spans += [line[:which]] if which > 0 else []
    stop = line.rstrip(" .").rfind(". ")  # its last sentence: "... You end up with 11.15 dollars."
    spans += [line[stop + 2 :]] if stop > 0 else []
    for s in [line, *spans]:  # "... is 5": the value ends the clause (not "there is only 1 end of it")
        at = max(s.rfind(" is "), s.rfind(" is:"))
        if at >= 0 and s[at + 4 :].rstrip(" .*")[-1:].isdigit():
            spans.append(s[at + 4 :])
    for s in spans:
        got = unmarked_answer(s)
        if got is not None:
            return got
    return None


def parse_answer(text: str) -> Parsed:
    marker = _answer_marker(text)
    if marker is not None and marker[1]:
        return {"answer": marker[1], "label": "answer"}, True
    fallback = _unmarked(text)
    if fallback is not None:
        return {"answer": fallback, "label": "answer"}, False
    return {}, False


register_parser("answer", parse_answer, labels={"answer"})


def parse_orchestrator(text: str) -> Parsed:
    call = _call_marker(text)
    marker = _answer_marker(text)
    if call is not None and (marker is None or call[0] < marker[0]):  # the first marker wins
        return {"call": call[1], "subtask": call[2], "label": "call"}, True
    if marker is not None and marker[1]:
        return {"answer": marker[1], "label": "answer"}, True
    return {}, False


register_parser("orchestrator", parse_orchestrator, labels={"call", "answer"})


def _judgement(text: str) -> str | None:
    """A verdict in words at the very start of a reply: "Yes, that's correct." -> accept, "The answer
    is wrong" -> reject ("not" turns it round), "Right." -> accept (the prompts ask to accept a right
    answer); anywhere later, prose about correctness is no verdict."""
    m = _JUDGEMENT.match(text)
    if m is not None:
        good = m.group(2).lower() in ("correct", "right")
        return "accept" if good != bool(m.group(1)) else "reject"
    m = _BARE_JUDGEMENT.match(text)
    if m is not None:
        return "accept" if m.group(1).lower() in ("correct", "right") else "reject"
    return None


def _verdict_word(text: str) -> str | None:
    """The first verdict word, "accept" or "reject" ("Accepted" -> accept): in capitals anywhere, else
    not after "to", "be" or a modal ("advocacy to be accepted", "I cannot accept this"); the word
    before is read from a bounded window."""
    for m in _VERDICT.finditer(text):
        word = m.group(0)
        before = text[max(0, m.start() - 12) : m.start()].lower().split()
        if word.isupper() or not before or before[-1] not in _NOT_VERDICTS:
            return word[:6].lower()
    return None


def parse_verdict(text: str) -> Parsed:
    out: dict[str, Any] = {}
    marker = _answer_marker(text)
    if marker is not None and marker[1]:
        out["answer"] = marker[1]
    verdict = _verdict_word(text) or _judgement(text)
    if verdict is None:
        if "answer" in out:
            out["label"] = "answer"
        return out, False
    out["verdict"] = verdict
    out["label"] = out["verdict"]
    return out, True


register_parser("verdict", parse_verdict, labels={"accept", "reject", "answer"})


def parse_raw(text: str) -> Parsed:
    text = text.strip()
    return ({"answer": text, "label": "answer"}, True) if text else ({}, False)


register_parser("raw", parse_raw, labels={"answer"})
