"""Named points of a training run where a crash test can stop it, deterministically.

A test that kills a run "at a random moment" rarely lands inside the few milliseconds a
checkpoint takes to write.  Instead it names a point and a step in the environment::

    MAS_PAUSE_AT=checkpoint_written:3  MAS_PAUSE_FILE=/tmp/paused  mas train team.yaml ...

When the run reaches that point of that step it writes its process id to ``MAS_PAUSE_FILE``
and waits there until it is killed; the test sees the file and sends SIGKILL.  Without
``MAS_PAUSE_AT`` (every normal run) a point costs one environment lookup.

A point inside a step's work can instead wait for a stop request (``resume_when``), so a
test can send a real signal there and watch the step being dropped at its next safe point.

Points, in the order a step passes them:
    step_start           before the step's rollout
    mid_rollout          between two generation batches of the rollout (waits for a stop request)
    after_rollout        episodes generated and scored, nothing updated yet
    mid_update           between two micro-batches of an update's gradients (waits for a stop request)
    after_update         the learners stepped, before sync and logging
    after_log            the step's metrics and episodes are written
    checkpoint_written   every file of the checkpoint is in its temporary directory, not renamed yet
    checkpoint_renamed   the step's checkpoint directory is in place, ``latest`` not yet updated
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

POINTS = ("step_start", "mid_rollout", "after_rollout", "mid_update", "after_update", "after_log",
          "checkpoint_written", "checkpoint_renamed")


_step: int | None = None  # the training step under way (``enter_step``), for points deep in the engine or learner


def enter_step(step: int) -> None:
    """Record the step the trainer is in, for ``pause_point(name, None)`` below it."""
    global _step
    _step = step


def pause_point(name: str, step: int | None, resume_when: Callable[[], bool] | None = None) -> None:
    """Wait here if ``MAS_PAUSE_AT`` names this point and step (see the module docstring): until
    ``resume_when()`` is true when it is given, else forever (until the process is killed).
    ``step`` None: the step ``enter_step`` recorded."""
    target = os.environ.get("MAS_PAUSE_AT")
    if not target or target != f"{name}:{_step if step is None else step}":
        return
    path = os.environ.get("MAS_PAUSE_FILE")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, path)
    while resume_when is None or not resume_when():
        time.sleep(60 if resume_when is None else 0.01)
