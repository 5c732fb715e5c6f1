"""The turn verifier of arithmetic chains: each turn's own step, checked without the outcome.

A synthetic task carries its left-to-right steps (``task.meta["steps"]``: ``[a, op, b, a op b]``
each, ``envs/math/synthetic.py``).  Whatever the topology, a turn does one of a few jobs, and
each can be checked against the task and the turns before it (``envs/verifiers.py``):

* **a call** (``CALL adder: 7+5``, an orchestrator's): the correct *next step given the
  conversation*: the operands and the operation of the next step the conversation has not
  done yet, where the accumulated value is what the specialists reported for the steps asked
  correctly so far (an orchestrator that copies a specialist's wrong sum is right to; the
  specialist is the one who erred).  ``+`` and ``*`` may take their operands in either order;
  a callee whose name says its operation (adder, subtractor, multiplier) must be the one for
  this step's.  A call after every step is done is no step: 0.
* **a reply to a call** (the specialist's): its answer against the value of the sub-problem
  it was *asked*, whether or not that was the right sub-problem to ask.  A sub-problem that
  is not plain arithmetic (``+ - *``, parentheses, integers) cannot be checked: ``None``.
* **a step** written as ``a op b = c`` (a graph worker's, ``parser: raw``): the correct next
  step and its correct result.
* **a verdict** (ACCEPT/REJECT): accepting is right iff the answer standing before it (the
  latest answer or step result of the conversation) is the gold answer; rejecting iff not.
* **an answer**: right iff it is the gold answer, or, once the conversation has done every
  step, the value those steps reached (copying the team's result is the answering turn's job).
  An answer written without the steps in the conversation (a chain's solver, a debater, an
  orchestrator answering at once) is checked against the gold: for a debate that is
  privileged information only training has (docs/credit.md).
* anything else (no answer, no call, no verdict) did no step: 0.

A turn that repeats the task's numbers without doing a step earns nothing: ``3+4-2`` as a
call is not the step ``3+4``, and as an answer it is not a number.  Masked and removed turns
(interventions) said nothing: ``None``.  A task without ``steps`` (not a synthetic chain)
gives ``None`` for every turn.
"""

from __future__ import annotations

import re
from fractions import Fraction

from mas.types import Episode, Turn

from ..base import spoke
from .verify import extract_number, numbers_match

__all__ = ["evaluate_arithmetic", "verify_math_turn"]

_MAX_EXPR = 120  # characters of a sub-problem that are read
_TOKEN = re.compile(r"\s*(?:(\d{1,12})|([-+*()]))")
_MINUS = str.maketrans({"\u2212": "-", "\u00d7": "*", "x": "*", "X": "*"})
_STEP = re.compile(r"\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*=\s*(-?\d{1,12})\s*\.?\s*")
# a callee's name that says its operation
_OP_NAMES = (("add", "+"), ("plus", "+"), ("sum", "+"), ("sub", "-"), ("minus", "-"), ("mul", "*"), ("times", "*"),
             ("product", "*"))


def _tokens(text: str) -> list[str] | None:
    """Integers, operators and parentheses of ``text``, or None if anything else is in it."""
    out, i = [], 0
    text = text.rstrip()
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            return None
        out.append(m.group(1) or m.group(2))
        i = m.end()
    return out


def _parse(tokens: list[str]) -> tuple | None:
    """A left-to-right arithmetic tree (``("num", n)`` or ``(op, left, right)``) with the usual
    precedence, or None: recursive descent over at most ``_MAX_EXPR`` characters' tokens."""
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def atom(depth: int) -> tuple | None:
        nonlocal pos
        tok = peek()
        if tok is None or depth > 20:
            return None
        if tok == "-":  # a negative number or a negated group
            pos += 1
            inner = atom(depth + 1)
            return None if inner is None else ("neg", inner)
        if tok == "(":
            pos += 1
            inner = expr(depth + 1)
            if inner is None or peek() != ")":
                return None
            pos += 1
            return inner
        if tok.isdigit():
            pos += 1
            return ("num", int(tok))
        return None

    def term(depth: int) -> tuple | None:
        nonlocal pos
        left = atom(depth)
        while left is not None and peek() == "*":
            pos += 1
            right = atom(depth)
            left = None if right is None else ("*", left, right)
        return left

    def expr(depth: int) -> tuple | None:
        nonlocal pos
        left = term(depth)
        while left is not None and peek() in ("+", "-"):
            op = tokens[pos]
            pos += 1
            right = term(depth)
            left = None if right is None else (op, left, right)
        return left

    tree = expr(0)
    return tree if tree is not None and pos == len(tokens) else None


def _value(tree: tuple) -> int:
    kind = tree[0]
    if kind == "num":
        return tree[1]
    if kind == "neg":
        return -_value(tree[1])
    a, b = _value(tree[1]), _value(tree[2])
    return a + b if kind == "+" else a - b if kind == "-" else a * b


def _clean(text: str) -> str:
    """A sub-problem without what commonly surrounds it: a trailing ``=``, ``?`` or full stop."""
    text = text.translate(_MINUS).strip()
    return text.rstrip("=?. \t").strip()


def _tree(text: str | None) -> tuple | None:
    if not text or len(text) > _MAX_EXPR:
        return None
    tokens = _tokens(_clean(text))
    return _parse(tokens) if tokens else None


def evaluate_arithmetic(text: str | None) -> int | None:
    """The value of a plain integer expression (``+ - *``, parentheses; ``7 + 5 =`` reads as 12),
    or None for anything else (words, division, more than 120 characters).  Never ``eval``."""
    tree = _tree(text)
    return None if tree is None else _value(tree)


def _binary(text: str | None) -> tuple[int, str, int] | None:
    """``(a, op, b)`` for a sub-problem that is exactly one operation on two numbers."""
    tree = _tree(text)
    if tree is None or tree[0] not in "+-*":
        return None
    left, right = tree[1], tree[2]
    values = []
    for side in (left, right):
        if side[0] == "num":
            values.append(side[1])
        elif side[0] == "neg" and side[1][0] == "num":
            values.append(-side[1][1])
        else:
            return None
    return values[0], tree[0], values[1]


def _is_step(a: int, op: str, b: int, step: list) -> bool:
    """Whether ``a op b`` is the step ``[value, op, operand, result]`` (commuted for + and *)."""
    want_a, want_op, want_b = Fraction(step[0]), step[1], Fraction(step[2])
    if op != want_op:
        return False
    if (Fraction(a), Fraction(b)) == (want_a, want_b):
        return True
    return op in "+*" and (Fraction(a), Fraction(b)) == (want_b, want_a)


def _callee_op(name: str) -> str | None:
    low = name.lower()
    return next((op for hint, op in _OP_NAMES if hint in low), None)


class _Conversation:
    """What the turns before the judged one established: how many steps are done, the value
    they reached (as reported), and the latest standing answer."""

    def __init__(self, steps: list) -> None:
        self.steps = steps
        self.done = 0
        self.value: Fraction = Fraction(steps[0][0]) if steps else Fraction(0)
        self.standing: Fraction | None = None  # latest answer or step result, for a verdict

    def next_step(self) -> list | None:
        """The next step with the reported value in place of its first operand (None: all done)."""
        if self.done >= len(self.steps):
            return None
        _, op, b, _ = self.steps[self.done]
        return [self.value, op, b, None]

    def advance(self, result: Fraction) -> None:
        self.done += 1
        self.value = result
        self.standing = result


def _judge_call(turn: Turn, conv: _Conversation) -> float:
    step = conv.next_step()
    asked = _binary(turn.parsed.get("subtask"))
    if step is None or asked is None or not _is_step(*asked, step):
        return 0.0
    op = _callee_op(str(turn.parsed.get("call", "")))
    return float(op is None or op == step[1])


def _judge_reply(turn: Turn, call: Turn) -> float | None:
    want = evaluate_arithmetic(call.parsed.get("subtask"))
    if want is None:
        return None
    return float(numbers_match(turn.parsed.get("answer"), str(want)))


def _step_turn(turn: Turn) -> tuple[int, str, int, int] | None:
    """``(a, op, b, c)`` of a turn whose whole text is one step ``a op b = c``."""
    if "call" in turn.parsed or "verdict" in turn.parsed:
        return None
    m = _STEP.fullmatch(turn.text or "")
    return None if m is None else (int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)))


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _judge(turn: Turn, conv: _Conversation, calls: dict[int, Turn], gold: str) -> float | None:
    if not spoke(turn):
        return None
    p = turn.parsed
    if "call" in p:
        return _judge_call(turn, conv)
    if turn.parent in calls:
        return _judge_reply(turn, calls[turn.parent])
    if "verdict" in p:
        standing_right = conv.standing is not None and numbers_match(str(conv.standing), gold)
        return float((p["verdict"] == "accept") == standing_right)
    step = _step_turn(turn)
    if step is not None:
        want = conv.next_step()
        a, op, b, c = step
        return float(want is not None and _is_step(a, op, b, want) and c == _apply(a, op, b))
    answer = p.get("answer")
    if answer:
        copied = conv.done == len(conv.steps) and numbers_match(answer, str(conv.value))
        return float(numbers_match(answer, gold) or copied)
    return 0.0


def _update(turn: Turn, conv: _Conversation, calls: dict[int, Turn]) -> None:
    """What ``turn`` adds to the conversation's state for the turns after it."""
    if not spoke(turn):
        return
    p = turn.parsed
    if "call" in p:
        calls[turn.index] = turn
        return
    if turn.parent in calls:  # a reported result: it advances the chain only if the right step was asked
        call = calls[turn.parent]
        step = conv.next_step()
        asked = _binary(call.parsed.get("subtask"))
        reported = extract_number(p.get("answer"))
        if step is not None and asked is not None and _is_step(*asked, step) and reported is not None:
            conv.advance(reported)
        return
    step = _step_turn(turn)
    if step is not None:
        want = conv.next_step()
        a, op, b, c = step
        if want is not None and _is_step(a, op, b, want):
            conv.advance(Fraction(c))
        return
    value = extract_number(p.get("answer"))  # an answer, or a verdict that wrote its own
    if value is not None:
        conv.standing = value


def verify_math_turn(episode: Episode, turn: Turn) -> float | None:
    """The score of ``turn``'s own step in an arithmetic chain (module docstring); None where the
    task has no steps or the turn said nothing."""
    steps = episode.task.meta.get("steps")
    if not isinstance(steps, list) or not steps or not isinstance(steps[0], list) or not isinstance(steps[0][0], int):
        return None  # not one chain's steps (a relay task holds a list of chains: its own verifier reads them)
    conv = _Conversation(steps)
    calls: dict[int, Turn] = {}
    for t in sorted(episode.turns, key=lambda t: t.index):
        if t.index >= turn.index:
            break
        _update(t, conv, calls)
    return _judge(turn, conv, calls, episode.task.answer)
