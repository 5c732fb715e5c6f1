"""The parts of a parts task (``team_relay``, ``team_fork``, ``team_conjunctive``): a task strings
together one arithmetic chain per specialist, specialist k answers part k, and the team's answer
is their answers in order, one word each.  How a part is judged (``relay.py``'s docstring says why
it is judged so): the k-th turn of an episode answers part k, and its answer's first word is what
it said; a masked or removed turn said nothing.
"""

from __future__ import annotations

from mas.types import Episode, Turn

from ..base import spoke
from ..math.verify import numbers_match

__all__ = ["MISSING", "decision_of", "first_word", "part_judgements", "part_words", "right", "verify_part_turn"]

MISSING = "?"  # what the team's answer holds for a part nobody answered (topologies/chain.py writes it)


def part_words(answer: str | None) -> list[str]:
    """The words of a team answer, one per part ("5 ? 4" -> ["5", "?", "4"]); [] for None."""
    return (answer or "").split()


def first_word(text: str | None) -> str | None:
    """What a part's answer becomes in the team's answer: its first word (None if there is none)."""
    words = part_words(text)
    return words[0] if words else None


def right(word: str | None, gold: str) -> bool:
    """Whether one part's answer has the gold value (``?`` and words without a number never do)."""
    return word is not None and word != MISSING and numbers_match(word, gold)


def part_judgements(episode: Episode, gold: list[str] | None = None) -> list[tuple[Turn, bool]]:
    """Each specialist turn with whether it solved its own part: the k-th turn of the episode
    answers part k (``gold[k]``, by default ``task.meta["answers"][k]``), its answer's first
    word is what it said."""
    gold = episode.task.meta["answers"] if gold is None else gold
    turns = sorted(episode.turns, key=lambda t: t.index)
    return [(t, right(first_word(t.parsed.get("answer")), g)) for t, g in zip(turns, gold)]


def decision_of(turn: Turn) -> str:
    """Which branch a specialist's turn took: ``worked`` if it wrote a step (an ``=``) before its
    answer marker, ``at_once`` if it went straight to the answer, ``none`` if it said nothing."""
    if not spoke(turn):
        return "none"
    before, _, _ = (turn.text or "").upper().partition("ANSWER")
    return "worked" if "=" in before else "at_once"


def verify_part_turn(episode: Episode, turn: Turn) -> float | None:
    """The turn verifier of a parts task (``envs/verifiers.py``): 1.0 if the turn solved its own
    part, 0.0 if not; None for a turn beyond the parts or one that said nothing.  The parts'
    answers are the task's answer, one word each (a relay's and a conjunctive task's)."""
    for t, ok in part_judgements(episode, episode.task.answer.split()):
        if t.index == turn.index:
            return float(ok) if spoke(t) else None
    return None
