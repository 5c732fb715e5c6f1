"""A task set's reward function for the custom env (configs/langgraph_custom.yaml).

``score(task, answer, episode)`` gets the Task (its ``answer`` is the reference from the
JSONL file), the team's answer (a string, or None) and the whole Episode.  It returns the
reward, here with a second named score that evaluation reports alongside accuracy.
"""

from __future__ import annotations

import re


def score(task, answer, episode) -> dict:
    numbers = re.findall(r"-?\d+", answer or "")
    correct = bool(numbers) and int(numbers[-1]) == int(task.answer)
    checked = any(t.agent == "checker" for t in episode.turns)
    return {"reward": float(correct), "checked": float(checked)}
