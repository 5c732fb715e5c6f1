"""Run a team's own code in worker processes beside the engine's, instead of on its threads.

A team written against the OpenAI API (``kind: openai``) runs its entry point once per episode,
and the engine batches the model calls it makes.  On a worker thread of the engine's process, the
team's client code (the ``openai`` client building a request and parsing the reply, httpx, the
framework around them) shares one GIL with the engine and the endpoint's server: a batch forms
only when every episode has sent its request, so each call's client CPU lands on the critical
path once per episode (docs/benchmarks/throughput.md).  ``TeamProcesses`` runs the entry points in
a few worker processes instead, each episode on a thread of its own there, so that CPU runs beside
the engine, on the other cores.

- **A fresh interpreter, not a fork**, started once, at the first episode: the engine's process
  holds torch's threads and the endpoint's server thread, which a fork would copy half-way.  It
  is ``python -m mas.process.team_processes``, not multiprocessing's spawn, which would import the
  parent's ``__main__`` again (under the ``mas`` command that is ``mas.cli``, and torch with it:
  about 290 MB a worker instead of about 60).  A worker imports the entry point by its reference
  (``"pkg.mod:run_team"``) with the parent's ``sys.path`` and working directory, so the module must
  be importable by a fresh interpreter (a function defined inside another function is not).
- **Many episodes a worker**: a job is a thread in its worker, so ``processes`` bounds processes,
  not concurrent episodes (a batch waits for every running episode, so an episode queued behind
  another would stall the rollout).  A new job goes to the worker with the fewest running.
- **Results** come back pickled; a value that does not pickle comes back as its ``str`` (the team's
  answer is read as text anyway).  An exception comes back as a ``TeamProcessError`` named like it
  (``remote_error``), with its message and the worker's traceback.
- **A worker that dies** (``os._exit``, a crash in C code, the OOM killer) fails the episodes it was
  running with ``WorkerExited`` (a ``TeamProcessError``) naming its exit code, and the next job starts a new worker.  A
  worker exits when its pipe closes, and checks once a second that its parent is alive, so a killed
  run leaves none behind.  It ignores SIGINT: Ctrl-C in a terminal reaches the whole process group,
  and the run that handles it ends its workers.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from dataclasses import dataclass, field
from typing import Any

from mas.refs import import_ref

_PARENT_CHECK_S = 1.0


class TeamProcessError(RuntimeError):
    """The team's code failed in its worker process.  Raised as a subclass named like the worker's
    exception (``remote_error``), so an episode's error reads ``ValueError: boom`` on threads and in
    workers alike; ``type_name`` is that name, ``remote_traceback`` the worker's traceback."""

    type_name = "TeamProcessError"

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback


class RemoteTraceback(Exception):
    """The worker's traceback, set as a ``TeamProcessError``'s cause so that a formatted traceback
    of the error shows where the team's code failed (as ``concurrent.futures`` does for its
    process pools)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


_REMOTE_TYPES: dict[str, type[TeamProcessError]] = {}


def remote_error(type_name: str, message: str, remote_traceback: str = "") -> TeamProcessError:
    """A ``TeamProcessError`` whose class is named ``type_name`` (one class per name)."""
    cls = _REMOTE_TYPES.get(type_name)
    if cls is None:
        cls = _REMOTE_TYPES[type_name] = type(type_name, (TeamProcessError,), {"type_name": type_name,
                                                                             "__module__": __name__})
    error = cls(message, remote_traceback)
    if remote_traceback:
        error.__cause__ = RemoteTraceback(remote_traceback)
    return error


# ---------------------------------------------------------------------------- the worker's side


def _run_job(ref: str, args: tuple, kwargs: dict) -> Any:
    fn = import_ref(ref)
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    return fn(*args, **kwargs)


def _text(value: Any) -> str:
    """``str(value)``, or what it is where its ``__str__`` raises."""
    try:
        return str(value)
    except Exception as exc:  # noqa: BLE001 - a user's class
        return f"<a {type(value).__name__} whose str() raised {type(exc).__name__}: {exc}>"


def _worker_main(conn: Any, parent: int) -> None:
    """A worker's loop: each job on a thread of its own, each reply sent under one lock."""
    lock = threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            try:
                conn.send(message)
            except OSError:  # the parent is gone
                os._exit(0)

    def job(job_id: int, ref: str, args: tuple, kwargs: dict) -> None:
        try:
            value = _run_job(ref, args, kwargs)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the episode
            send(("error", job_id, type(exc).__name__, _text(exc), traceback.format_exc()))
            return
        try:  # pickled here, unpickled by the parent apart from the message: a value that does not
            payload = pickle.dumps(value)  # come back fails its own episode, not the worker's reader
        except Exception:  # noqa: BLE001 - it does not pickle: the answer is read as text
            payload = pickle.dumps(_text(value))
        send(("ok", job_id, payload))

    def watch_parent() -> None:
        while True:
            time.sleep(_PARENT_CHECK_S)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        _, job_id, ref, args, kwargs = message
        threading.Thread(target=job, args=(job_id, ref, args, kwargs), daemon=True,
                         name=f"team-job-{job_id}").start()


# ---------------------------------------------------------------------------- the parent's side


@dataclass
class _Worker:
    process: Any
    conn: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = field(default_factory=dict)
    alive: bool = True


class TeamProcesses:
    """``processes`` worker interpreters running entry points; ``await run(ref, *args, **kwargs)``."""

    def __init__(self, processes: int):
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.processes = processes
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)  # job ids (next() on a count is atomic under the GIL)
        self._closed = False

    def _start_worker(self) -> _Worker:
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())],
                                       pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        conn = Connection(ours.detach())
        conn.send(list(sys.path))  # the parent's import path first: the entry's module is found as it is here
        worker = _Worker(process, conn)
        threading.Thread(target=self._read, args=(worker,), daemon=True, name="mas-team-reader").start()
        return worker

    def _pick(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the team's worker processes are closed")
            self._workers = [w for w in self._workers if w.alive]
            if len(self._workers) < self.processes:
                self._workers.append(self._start_worker())
            return min(self._workers, key=lambda w: len(w.jobs))

    async def run(self, ref: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``ref(*args, **kwargs)`` in a worker (awaited there when it is a coroutine function)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        worker = self._pick()
        job_id = next(self._ids)
        with worker.lock:
            if not worker.alive:
                raise remote_error("WorkerExited", self._exit_message(worker))
            worker.jobs[job_id] = (loop, future)
            try:
                worker.conn.send(("run", job_id, ref, args, kwargs))
            except OSError:  # it died since it was picked: its reader fails the job
                pass
            except BaseException:  # the arguments do not pickle (nothing was written): not a job
                worker.jobs.pop(job_id, None)
                raise
        try:
            return await future
        finally:
            with worker.lock:
                worker.jobs.pop(job_id, None)

    def _read(self, worker: _Worker) -> None:
        while True:
            try:
                kind, job_id, *rest = worker.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # noqa: BLE001 - a message that does not read: the channel is not to be
                worker.process.kill()  # trusted; its jobs fail below (WorkerExited), none hangs
                break
            with worker.lock:
                pending = worker.jobs.pop(job_id, None)
            if pending is None:  # the episode gave up on it (cancelled, timed out)
                continue
            loop, future = pending
            if kind != "ok":
                _settle(loop, future, error=remote_error(*rest))
                continue
            try:
                value = pickle.loads(rest[0])
            except Exception as exc:  # noqa: BLE001 - e.g. an exception class whose __init__ takes other arguments
                _settle(loop, future, error=remote_error(type(exc).__name__, "the entry point's answer came back from "
                                                         f"its worker process but does not unpickle here: {exc}"))
            else:
                _settle(loop, future, value=value)
        with worker.lock:
            worker.alive = False
            pending_jobs = list(worker.jobs.values())
            worker.jobs.clear()
        _wait(worker.process)
        worker.conn.close()
        for loop, future in pending_jobs:
            _settle(loop, future, error=remote_error("WorkerExited", self._exit_message(worker)))

    @staticmethod
    def _exit_message(worker: _Worker) -> str:
        return (f"the team's worker process (pid {worker.process.pid}) exited with code "
                f"{worker.process.returncode} while running this episode")

    def pids(self) -> list[int]:
        """The live workers' process ids."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.alive]

    def close(self) -> None:
        """Stop every worker (their running jobs are abandoned)."""
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, []
        for worker in workers:  # its reader sees the pipe close and fails what it was running
            worker.process.terminate()
            if not _wait(worker.process):
                worker.process.kill()
                _wait(worker.process)


def _wait(process: subprocess.Popen, timeout: float = 5.0) -> bool:
    """Reap ``process``; False if it is still running after ``timeout`` seconds."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, value: Any = None,
            error: BaseException | None = None) -> None:
    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # that episode's loop is closed: nobody waits for it
        pass


_SHARED: dict[int, TeamProcesses] = {}
_SHARED_LOCK = threading.Lock()


def shared_team_processes(processes: int) -> TeamProcesses:
    """The process's pool of ``processes`` team workers, made at the first call (one per size)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(processes)
        if pool is None:
            pool = _SHARED[processes] = TeamProcesses(processes)
        return pool


def shared_worker_pids() -> list[int]:
    """The live workers of every shared pool (a benchmark reads their CPU time)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
    return [pid for pool in pools for pid in pool.pids()]


def close_shared_team_processes() -> None:
    """Stop the shared pools' workers (a later ``shared_team_processes`` starts new ones)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()


if __name__ == "__main__":  # a worker: python -m mas.process.team_processes FD PARENT_PID
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    _conn = Connection(int(sys.argv[1]))
    sys.path[:] = _conn.recv()
    _worker_main(_conn, int(sys.argv[2]))
