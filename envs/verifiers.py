"""Turn verifiers: checks of one turn's own job, a training signal beside the team's outcome.

Most turns of a multi-agent episode can be checked on their own, without the outcome: a
specialist asked ``CALL adder: 7+5`` answers 12 or it does not; a relay part is right or
wrong; an orchestrator's call copies the task's operands or miscopies them.  A turn verifier
says so::

    verify(episode, turn) -> float | None

a score in [0, 1] for a turn whose job can be checked, ``None`` where it cannot.  It reads the
episode (its task, with the task's ground truth in ``task.answer`` and ``task.meta``, and the
turns before this one) and never the outcome reward.  The engine calls it on every turn after
the episode is scored and records the score on ``turn.extra_rewards["verified"]`` (absent for
``None``); credit methods read it from ``CreditBatch.turn_rewards["verified"]`` (the
``verified`` method, ``credit/verified.py``), step metrics and evaluations average it per agent
(verified accuracy).  It is a training signal only: no agent's prompt shows it, and the outcome
reward, held-out accuracy and evaluation are unchanged.

Where a verifier comes from (``verifier.name`` in the run config):

* ``auto`` (the default): the env's own, ``env.verify_turn`` where the env has one (the
  built-in envs below), else none;
* ``none``: no verifier;
* a registered name: the built-in verifiers below, or one a package registers with
  :func:`register_verifier` (from a ``mas.verifiers`` entry point, ``mas/config/plugins.py``);
* ``"package.module:function"``: a function of the user's, imported as ``mas.refs`` does.

Built in (``envs/math/turns.py``, ``envs/team/*``, ``envs/research/hotpotqa.py``):

==================  ===========================================================================
synthetic_math      each turn's step of the chain, whatever the topology: a specialist's reply
                    against the sub-problem it was *asked*; an orchestrator's call, a graph
                    worker's step, as the correct next step given the conversation; a verdict
                    against whether the answer standing before it is right; an answer against
                    the value the conversation's steps reached, or, where it did its own
                    working (a chain's solver, a debater), the gold answer: a debater's score is
                    privileged information (the gold) that only training has
team_relay          each specialist's part (``info["designed"]``, turn by turn)
team_conjunctive    each specialist's part
team_saboteur       the solver's answer; each reviewer turn's verdict on the answer before it
hotpotqa            a search or read turn: whether it reached a supporting paragraph
                    (privileged: HotpotQA's supporting facts); other turns ``None``
gsm8k               none: only the outcome of a GSM8K problem can be checked
==================  ===========================================================================

Failures: a verifier that raises, runs past ``verifier.timeout_s`` or returns anything but
``None`` or a number in [0, 1] (``True``/``False`` count as 1/0) gives that turn ``None``; the
engine counts a fault (``verifier_error``, ``verifier_timeout``) and the run goes on.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from mas.refs import import_ref
from mas.types import Episode, Turn

__all__ = ["AUTO", "NONE", "VERIFIED", "TurnVerifier", "check_score", "get_verifier", "register_verifier",
           "resolve_verifier", "verifier_names"]

VERIFIED = "verified"  # the key of a turn's verifier score in Turn.extra_rewards / CreditBatch.turn_rewards
AUTO = "auto"  # verifier.name: the env's own verifier
NONE = "none"  # verifier.name: no verifier

TurnVerifier = Callable[[Episode, Turn], "float | None"]

_VERIFIERS: dict[str, TurnVerifier] = {}


def register_verifier(name: str, fn: TurnVerifier) -> TurnVerifier:
    """Make ``fn(episode, turn) -> float | None`` available as ``verifier.name: <name>``.

    Registering a name twice, or one of the reserved names ``auto`` and ``none``, is a
    ValueError.  Returns ``fn`` (usable as a decorator's body)."""
    if name in (AUTO, NONE):
        raise ValueError(f"verifier name {name!r} is reserved ({AUTO!r}: the env's own, {NONE!r}: none)")
    if not name or ":" in name:
        raise ValueError(f"verifier name {name!r}: a registered name has no ':' (that is a module:function reference)")
    if name in _VERIFIERS:
        raise ValueError(f"verifier {name!r} is already registered")
    if not callable(fn):
        raise TypeError(f"verifier {name!r}: expected a function (episode, turn) -> float | None, got {type(fn).__name__}")
    _VERIFIERS[name] = fn
    return fn


def verifier_names() -> list[str]:
    """Every valid ``verifier.name`` but a reference: auto, none, then the registered names, sorted."""
    return [AUTO, NONE, *sorted(_VERIFIERS)]


def get_verifier(name: str) -> TurnVerifier:
    """The verifier registered as ``name``; an unknown name is a KeyError listing the valid ones."""
    try:
        return _VERIFIERS[name]
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; valid: {', '.join(verifier_names())}, "
                       "or a 'package.module:function' reference") from None


def check_score(value: Any) -> float | None:
    """A verifier's return value as a score: None stays None, a bool or a finite number in [0, 1]
    becomes a float; anything else is a ValueError that says what was returned."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"a verifier must return a number in [0, 1] or None, returned {type(value).__name__} {value!r:.60}") from None
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"a verifier must return a number in [0, 1] or None, returned {score!r}")
    return score


def resolve_verifier(name: str, env: Any) -> TurnVerifier | None:
    """The verifier ``verifier.name`` asks for with this ``env`` (module docstring), or None.

    ``auto`` is the env's ``verify_turn`` (None where it has none); a ``module:function``
    reference is imported (``mas.refs``: a ``RefError`` says what is missing); an unknown
    registered name is a KeyError listing the valid names."""
    if name == NONE:
        return None
    if name == AUTO:
        return getattr(env, "verify_turn", None)
    if ":" in name:
        return import_ref(name)
    return get_verifier(name)
