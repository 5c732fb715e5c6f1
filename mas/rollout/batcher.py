"""Batching: the generation requests of concurrently running episodes, served together.

Every model call of a running episode becomes a ``GenRequest`` handed to the ``Batcher``,
which sends what all the episodes wait for to the backend as one ``generate_batch``.  When
it fires depends only on which episodes are waiting, so the batches, and with them the
sampled tokens, are the same in every run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from functools import partial
from typing import Any, Callable

from mas.process.fault_points import pause_point
from mas.rollout.backends.base import Backend, BackendUnavailable, GenRequest, GenResult, generate_apart
from mas.rollout.faults import Faults
from mas.types import StepAbandoned


class Batcher:
    """Collects requests from concurrently running episodes and serves them in batches.

    A batch is flushed once every running episode is waiting on at least one request and no
    episode has a tool call running (tools run in worker threads, and an episode's next
    request after a tool round belongs in the same batch whatever the tool's speed); a few
    more loop iterations then let sibling requests of the same episode (concurrent calls in
    one node) arrive.  The rule depends only on which episodes are waiting, never on timing,
    so batches, and with them the sampled tokens, are the same in every run.  (Topology code
    must therefore stay on the event loop: LangGraph runs sync node and routing functions in a
    thread pool, so every topology function LangGraph calls is async.)

    Framework teams run on this loop as well: an AutoGen team's agent runtime is a set of
    asyncio tasks, and a user's LangGraph graph is run with ``ainvoke``.  A sync user node runs
    in a worker thread and hands its model call to this loop (``run_coroutine_threadsafe``);
    while it runs its episode is not waiting, so the batch waits for it, and sequential code
    batches the same in every run.  Concurrent calls of one episode made from threads (parallel
    sync branches) could arrive in different batches: such branches should be async nodes.
    """

    def __init__(self, backend: Backend, seed: int, settle_yields: int = 4, faults: Faults | None = None,
                 count_tokens: Callable[[GenRequest, GenResult], int] | None = None,
                 abort: Callable[[], bool] | None = None):
        self.backend = backend
        self.abort = abort  # asked before each batch: True drops the whole run (StepAbandoned)
        self.faults = faults if faults is not None else Faults()
        self.seed = seed
        self.settle_yields = settle_yields
        self.count_tokens = count_tokens or (lambda req, res: len(res.completion_ids))
        self.tokens = 0  # completion tokens generated (every result served, critic replies included)
        self.active: set[int] = set()  # episode keys still running
        self.busy: Counter[int] = Counter()  # episode key -> tool calls running off the loop
        self._pending: list[tuple[tuple[int, int], GenRequest, asyncio.Future]] = []
        self._inflight: list[tuple[tuple[int, int], GenRequest, asyncio.Future]] = []  # the batch being served
        self.dead: BaseException | None = None  # what stopped the serving task, if it raised
        self._wake = asyncio.Event()
        self.batches = 0
        self.requests = 0
        self.fatal: BackendUnavailable | StepAbandoned | None = None  # the backend is gone, or a stop: the run raises it

    async def generate(self, key: tuple[int, int], request: GenRequest) -> GenResult:
        if self.dead is not None:
            raise RuntimeError(f"the engine's batch server failed: {self.dead!r}") from self.dead
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((key, request, fut))
        self._wake.set()
        return await fut

    def finished(self, key: int) -> None:
        self.active.discard(key)
        self._wake.set()

    def drop(self, key: int, error: BaseException) -> None:
        """Fail the requests of episode ``key`` still waiting for a batch with ``error`` (the
        episode was stopped): they are not generated."""
        keep = []
        for item in self._pending:
            if item[0][0] == key:
                settle(item[2], error=error)
            else:
                keep.append(item)
        self._pending = keep
        self._wake.set()

    def tool_started(self, key: int) -> None:
        self.busy[key] += 1

    def tool_finished(self, key: int) -> None:
        self.busy[key] -= 1
        if self.busy[key] <= 0:
            del self.busy[key]
        self._wake.set()

    def _all_waiting(self) -> bool:
        return bool(self._pending) and not self.busy and {k[0] for k, _, _ in self._pending} >= self.active

    def fail_pending(self, server: asyncio.Task) -> None:
        """The serving task ended: if it raised (a bug, not a failed generation: those fail their
        own requests), every request waiting on it, and every later one, fails with that error."""
        if server.cancelled() or server.exception() is None:
            return
        self.dead = server.exception()
        for _, _, fut in self._inflight + self._pending:
            settle(fut, error=self.dead)
        self._inflight, self._pending = [], []

    async def serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._all_waiting():
                continue
            for _ in range(self.settle_yields):
                await asyncio.sleep(0)
            batch = sorted((p for p in self._pending if not p[2].done()), key=lambda item: item[0])
            self._inflight = batch
            self._pending = []  # (a future is done already only if its episode was cancelled by a timeout)
            if not batch:
                continue
            if self.batches and self.abort is not None:
                pause_point("mid_rollout", None, resume_when=self.abort)  # a test's signal lands here (fault_points)
            if self.abort is not None and self.abort():  # a stop was asked: no more generation in this run
                self.fatal = self.dead = StepAbandoned(f"generation stopped before batch {self.batches + 1}")
                for _, _, fut in batch:
                    settle(fut, error=self.dead)
                continue
            seed = self.seed * 1_000_003 + self.batches
            self.batches += 1
            self.requests += len(batch)
            try:  # a request that fails again when retried alone fails its episode (counted there)
                outcomes = generate_apart(lambda rows: self.backend.generate_batch(rows, seed=seed),
                                          [[req] for _, req, _ in batch], on_retry=partial(self._retried, len(batch)))
            except BackendUnavailable as exc:  # nothing can be served: fail every waiting episode, then the rollout
                self.fatal = self.fatal or exc
                for _, _, fut in batch:
                    settle(fut, error=exc)
                continue
            for (_, req, fut), (results, error) in zip(batch, outcomes):
                self._served(req, fut, results[0] if results else None, error)

    def _retried(self, n: int, exc: BaseException) -> None:
        self.faults.add("backend_error", f"a batch of {n} generations failed ({type(exc).__name__}: {exc}); "
                                         "retried one request at a time")

    def _served(self, req: GenRequest, fut: asyncio.Future, res: GenResult | None, error: BaseException | None = None) -> None:
        """Hand a request its result (counting the tokens generated) or its error."""
        if error is None:
            self.tokens += self.count_tokens(req, res)
        settle(fut, result=res, error=error)


def settle(fut: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():  # its episode timed out, or its client went away, meanwhile
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
