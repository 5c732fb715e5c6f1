"""Hooks into a training run, and the one way a run stops early.

A callback is any object with some of these methods (each optional)::

    on_step_end(step, metrics, groups, credit) -> bool | None   # after a step is logged
    on_eval(name, metrics) -> bool | None                       # after "before" / "after" evaluation
    on_checkpoint(step, path) -> None                           # after a checkpoint is complete

A truthy return from ``on_step_end`` or ``on_eval`` asks the run to stop.  Stopping is never
abrupt: ``RunControl.request_stop`` only sets a flag, which ``mas.training.trainer.train`` reads at the
next step boundary; the run then checkpoints the last completed step, writes its summary
(with ``stopped`` set to the reason) and returns, so ``mas train --resume`` continues it.
Signal handlers (Ctrl-C, SIGTERM) use the same flag, asking to abandon the step in progress
at its next safe point (``RunControl``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol


class Callback(Protocol):
    """What ``train(..., callbacks=[...])`` calls; implement only the methods you need."""

    def on_step_end(self, step: int, metrics: dict, groups: list, credit: Any) -> bool | None: ...

    def on_eval(self, name: str, metrics: dict) -> bool | None: ...

    def on_checkpoint(self, step: int, path: Path) -> None: ...


class RunControl:
    """The stop flag of one run: set by callbacks or signal handlers.

    A plain stop request is read between steps.  One that asks to ``abandon`` (a signal: a
    scheduler's SIGTERM, the first Ctrl-C) is also read inside a step, at its safe points
    (between generation batches, between micro-batches of an update before any optimizer
    steps): the step in progress is dropped and the run is checkpointed as it was before it,
    so a long real-model step does not hold the stop for minutes (``mas.training.trainer``).
    """

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.abandon = False

    def request_stop(self, reason: str, abandon: bool = False) -> None:
        """Ask the run to stop after the current step, or (``abandon``) at the step's next safe
        point (the first reason given is kept; asking to abandon may come later)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.abandon = self.abandon or abandon

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def abandoning(self) -> bool:
        """Whether the step in progress should be dropped at its next safe point."""
        return self.abandon


class CallbackList:
    """Calls each callback's hook in order; a truthy answer becomes a stop request on ``control``."""

    def __init__(self, callbacks: Iterable[Any], control: RunControl):
        self.callbacks = list(callbacks)
        self.control = control

    def _call(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if fn is not None and fn(*args) and hook != "on_checkpoint":
                self.control.request_stop(f"{type(cb).__name__}.{hook}")

    def on_step_end(self, step: int, metrics: dict, groups: list, credit: Any) -> None:
        self._call("on_step_end", step, metrics, groups, credit)

    def on_eval(self, name: str, metrics: dict) -> None:
        self._call("on_eval", name, metrics)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self._call("on_checkpoint", step, path)
