"""The turn verifier of research tasks: did a search or read turn reach a supporting paragraph?

A task whose ``meta["supporting"]`` lists the titles of the paragraphs that hold its answer
(HotpotQA's supporting facts; any env with the same search and read tools) can check each
tool-using turn on its own (``envs/verifiers.py``): 1 if one of the turn's observations
shows a supporting paragraph (a search result line ``N. <title>: ...`` or a read
``<title>: ...``), else 0; a turn that called no tool is ``None`` (its job, answering, is what
the outcome scores).  This is privileged information that only training has: the supporting
titles are never shown to an agent.
"""

from __future__ import annotations

import re

from mas.types import Episode, Turn

from ..base import spoke

__all__ = ["observed_titles", "verify_search_turn"]

_NUMBERED = re.compile(r"\d{1,3}\. ")


def observed_titles(turn: Turn, titles: list[str]) -> set[str]:
    """Which of ``titles`` the turn's observations show as a result or a read paragraph."""
    found: set[str] = set()
    for obs in turn.observations:
        for line in obs.splitlines():
            m = _NUMBERED.match(line)
            head = line[m.end():] if m else line
            for title in titles:
                if head.startswith(f"{title}: ") or head == f"{title}:":
                    found.add(title)
    return found


def verify_search_turn(episode: Episode, turn: Turn) -> float | None:
    """1.0 if a tool turn reached a supporting paragraph, 0.0 if it did not; None for a turn
    without tool calls, a turn that said nothing, or a task without supporting titles."""
    titles = episode.task.meta.get("supporting")
    if not titles or not turn.tool_calls or not spoke(turn):
        return None
    return float(bool(observed_titles(turn, list(titles))))
