"""Ctrl-C and SIGTERM during ``mas train``: stop at a step boundary, or abandon the step.

The first signal asks the run to stop (``RunControl.request_stop``): the trainer finishes the
step under way, checkpoints it, records ``summary["stopped"]`` and returns, and the command
prints how to resume and exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM).

A second signal abandons the step at once.  The process ends there with ``os._exit``, as a
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

from mas.callbacks import RunControl


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
        self.control.request_stop(name)
        os.write(2, f"\n{name}: stopping after the current step, which is then checkpointed "
                    f"(press Ctrl-C again to abandon the step and keep the last checkpoint)\n".encode())

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
    from mas.checkpoint import latest_checkpoint

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
