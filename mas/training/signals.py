"""Ctrl-C and SIGTERM during ``mas train``: stop at the step's next safe point, or at once.

The first signal asks the run to stop and to abandon the step in progress
(``RunControl.request_stop(..., abandon=True)``): at the step's next safe point (a generation
batch, a micro-batch of an update's gradients; seconds even for a real model on a CPU) the
trainer drops the step, checkpoints the state the step started from (no optimizer has
stepped yet, so the weights still are that state), records ``summary["stopped"]`` and
returns; the command prints how to resume and exits with 128 + the signal number (130 for
SIGINT, 143 for SIGTERM).  ``--resume`` then repeats the dropped step exactly.  A step whose
optimizers have stepped (the short phase after every gradient is in; under Ray, once the
actors' updates started) runs to its end first.

A second signal abandons the process at once.  The process ends there with ``os._exit``, as a
crash would, which a run is built to survive: checkpoints are written to a temporary folder
and renamed, ``latest`` is replaced atomically, and ``--resume`` drops log lines written
after the checkpoint it continues from.  Raising ``KeyboardInterrupt`` instead would land in
whatever runs at that moment (an asyncio task of the rollout, a worker thread's future) and
print its traceback, or wait for worker threads to finish their generation.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable

from mas.training.callbacks import RunControl


class StopOnSignal:
    """Installs the handlers for SIGINT and SIGTERM while training (a context manager);
    ``abandon_message()`` says, at the second signal, what is left (the last checkpoint, the
    resume command), and ``cleanup()`` frees what would outlive the process."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, control: RunControl, abandon_message: Callable[[], str], cleanup: Callable[[], None] | None = None):
        self.control = control
        self.abandon_message = abandon_message
        self.cleanup = cleanup  # before the process ends at a second signal: e.g. free a Ray runtime's actors
        self.signum: int | None = None  # the first signal received
        self._previous: dict = {}

    def __call__(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        # os.write: the handler may interrupt a print in progress (a buffered stream is not reentrant)
        if self.signum is not None:
            os.write(2, f"\n{name} again: {self.abandon_message()}\n".encode())
            try:
                if self.cleanup is not None:
                    self.cleanup()
            finally:
                os._exit(128 + self.signum)
        self.signum = signum
        self.control.request_stop(name, abandon=True)
        os.write(2, f"\n{name}: stopping at the next safe point: the step in progress is dropped and the run is "
                    f"checkpointed as it was before it (press Ctrl-C again to quit at once and keep the last "
                    f"checkpoint)\n".encode())

    @property
    def exit_code(self) -> int | None:
        return None if self.signum is None else 128 + self.signum

    def __enter__(self) -> "StopOnSignal":
        self._previous = {s: signal.signal(s, self) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def abandon_message(run_dir: Path, resume_cmd: str) -> str:
    """What a second signal leaves: the last complete checkpoint and the command that resumes from it."""
    from mas.training.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return "abandoned the current step; no checkpoint was written yet, so there is nothing to resume (start again with --overwrite)"
    return f"abandoned the current step; the last checkpoint is {ckpt.name}.\nresume with: {resume_cmd}"


def mas_command() -> str:
    """How the user ran mas, for the commands we print: `mas`, `.venv/bin/mas`, or `python -m mas.cli`."""
    import shlex
    import shutil

    prog = sys.argv[0] if sys.argv and sys.argv[0] else "mas"
    if Path(prog).name == "mas":
        on_path = shutil.which("mas")
        return "mas" if on_path and Path(on_path).resolve() == Path(prog).resolve() else prog
    if Path(prog).name == "cli.py":
        return f"{shlex.quote(sys.executable)} -m mas.cli"
    return "mas"
