"""Named points of a training run where a crash test can stop it, deterministically.

A test that kills a run "at a random moment" rarely lands inside the few milliseconds a
checkpoint takes to write.  Instead it names a point and a step in the environment::

    MAS_PAUSE_AT=checkpoint_written:3  MAS_PAUSE_FILE=/tmp/paused  mas train team.yaml ...

When the run reaches that point of that step it writes its process id to ``MAS_PAUSE_FILE``
and waits there until it is killed; the test sees the file and sends SIGKILL.  Without
``MAS_PAUSE_AT`` (every normal run) a point costs one environment lookup.

Points, in the order a step passes them:
    step_start           before the step's rollout
    after_rollout        episodes generated and scored, nothing updated yet
    after_update         the learners stepped, before sync and logging
    after_log            the step's metrics and episodes are written
    checkpoint_written   every file of the checkpoint is in its temporary directory, not renamed yet
    checkpoint_renamed   the step's checkpoint directory is in place, ``latest`` not yet updated
"""

from __future__ import annotations

import os
import time

POINTS = ("step_start", "after_rollout", "after_update", "after_log", "checkpoint_written", "checkpoint_renamed")


def pause_point(name: str, step: int) -> None:
    """Wait here forever if ``MAS_PAUSE_AT`` names this point and step (see the module docstring)."""
    target = os.environ.get("MAS_PAUSE_AT")
    if not target or target != f"{name}:{step}":
        return
    path = os.environ.get("MAS_PAUSE_FILE")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, path)
    while True:
        time.sleep(60)
