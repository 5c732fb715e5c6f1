"""Run untrusted work in worker processes with a time limit, a memory limit and no network.

Model output is untrusted (docs/architecture.md, "Errors and bad input"), and so is what tools and
verifiers do with it: a tool may hang, allocate without bound or reach for the network, and
a symbolic verifier may spend minutes on ``9^{9^{9^9}}``.  A ``Sandbox`` runs registered
functions in a small pool of worker processes and bounds each call:

* **time**: the caller waits at most ``timeout_s``; past it the worker is killed (SIGKILL)
  and replaced, and the call raises ``SandboxTimeout``.  The bound holds on any thread and
  inside an asyncio loop, and it stops work stuck in C code (big-integer arithmetic), which a
  ``signal.alarm`` timeout cannot do and which only works on the main thread anyway;
* **memory**: each worker's address space may grow by at most ``memory_mb`` beyond what it
  inherited (``RLIMIT_AS``); an allocation past it fails inside the worker and the call
  raises ``SandboxMemoryError`` (the worker is replaced);
* **network**: each worker moves into a new, empty network namespace (``unshare(2)``
  with ``CLONE_NEWNET``; as root, or through an unprivileged user namespace where the kernel
  allows one), so no socket can reach anything, and an audit hook (PEP 578) refuses socket
  creation and name lookups from Python with a clear ``PermissionError``.  Where no namespace
  can be made, the audit hook also refuses starting processes (a child could not be held to
  the rule); ``Sandbox.isolation`` says which walls are up.

Workers are forked from the calling process on first use, so they inherit the registered
functions and whatever those close over (a BM25 index, an imported math-verify) without
pickling or re-importing anything, but not the parent's sockets, which a worker lets go of
(a connection the parent closes ends for its peer); a call costs one pickled message each way over a pipe
(about 0.1 ms; ``bench/sandbox_overhead.py``).  A worker exits when its pipe closes or its
parent is gone (it checks once a second), so a killed run leaves no workers behind.
Exceptions a function raises come back to the caller as they were (or as ``SandboxError``
with their type and message when they cannot be pickled).

Linux is the target; elsewhere the memory limit and the namespace are skipped (the time
limit and the audit hook still hold).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import queue
import signal
import stat
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Sandbox", "SandboxCrash", "SandboxError", "SandboxMemoryError", "SandboxTimeout"]

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_NETWORK_EVENTS = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo", "socket.sendto", "socket.sendmsg",
})
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn"})
_FORK_LOCK = threading.Lock()  # held while a worker is forked and the parent closes the child's ends


class SandboxError(RuntimeError):
    """A sandboxed call failed in a way its function did not report itself."""


class SandboxTimeout(SandboxError):
    """The call did not finish within the time limit; its worker was killed."""


class SandboxMemoryError(SandboxError):
    """The call ran out of its memory allowance; its worker was replaced."""


class SandboxCrash(SandboxError):
    """The worker process died during the call (killed, or it crashed)."""


# ------------------------------------------------------------------------------------------
# inside a worker
# ------------------------------------------------------------------------------------------


def _address_space_bytes() -> int | None:
    """The current process's virtual memory size (Linux ``VmSize``), or None if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _limit_memory(memory_mb: int) -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    base = _address_space_bytes()
    if base is not None:
        limit = base + memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _unshare_network() -> bool:
    """Move this (single-threaded) process into a new network namespace; True on success."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    if libc.unshare(_CLONE_NEWNET) == 0:
        return True
    uid, gid = os.getuid(), os.getgid()  # unprivileged: a user namespace first, mapping our own ids
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return False
    try:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                           ("/proc/self/gid_map", f"{gid} {gid} 1")):
            with open(path, "w") as f:
                f.write(text)
    except OSError:
        pass  # unmapped ids read as "nobody"; the namespace still has no network
    return True


def _install_guard(block_processes: bool) -> None:
    blocked = _NETWORK_EVENTS | (_PROCESS_EVENTS if block_processes else frozenset())

    def hook(event: str, args: tuple) -> None:
        if event in blocked:
            what = "network access" if event in _NETWORK_EVENTS else "starting processes"
            raise PermissionError(f"{what} is disabled in the sandbox ({event})")

    sys.addaudithook(hook)


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone (a SIGKILLed run must not leave workers behind)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _release_inherited_sockets(keep: int) -> None:
    """Let go of the copies of the parent's sockets that fork gave this worker (the endpoint's
    listening socket and its connections, a team process's socket pair, Ray's), so that a
    socket the parent closes is closed for its peer too, and a port it frees is free, while the
    worker lives.  Each fd is pointed at /dev/null rather than closed: a socket object of the
    parent's that this copy of its heap still holds may close its number later, and the number
    must not by then belong to something else."""
    if not os.path.isdir("/proc/self/fd"):
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= 2 or fd in (keep, null):
                continue
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:  # the listing's own descriptor, already gone
                pass
    finally:
        os.close(null)


def _worker_main(conn, functions: Mapping[str, Callable[..., Any]], memory_mb: int | None, network: bool, parent: int) -> None:
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()  # forked while the parent held it: a sandbox made in here needs its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the parent, which stops the workers
    _release_inherited_sockets(keep=conn.fileno())
    isolated = True if network else _unshare_network()  # before any thread starts (user namespaces need that)
    if not network:
        _install_guard(block_processes=not isolated)
    if memory_mb is not None:
        _limit_memory(memory_mb)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    conn.send(("ready", isolated))
    while True:
        try:
            name, args, kwargs = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        try:
            reply: tuple = ("ok", functions[name](*args, **kwargs))
        except MemoryError:
            reply = ("memory", None)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
            reply = ("raise", exc)
        try:
            conn.send(reply)
        except MemoryError:
            os._exit(3)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            kind = "result" if reply[0] == "ok" else f"exception {type(reply[1]).__name__}: {reply[1]}"
            conn.send(("error", f"{name} returned a value that cannot be sent back ({kind}; {type(exc).__name__}: {exc})"))
        if reply[0] == "memory":
            os._exit(0)  # after a MemoryError the heap may be in a poor state: start afresh


# ------------------------------------------------------------------------------------------
# in the caller
# ------------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, sandbox: "Sandbox"):
        ctx = multiprocessing.get_context("fork")
        self.dead = False
        self._closing = threading.Lock()  # close() and a timed-out call may both kill this worker
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child, sandbox.functions, sandbox.memory_mb, sandbox.network, os.getpid()),
            name=f"{sandbox.name}-worker",
            daemon=True,
        )
        # One fork at a time, and the child's ends closed here before the next: a worker forked by
        # another thread in between would inherit them, and this worker's exit would not be seen
        # (multiprocessing's sentinel pipe stays open in the sibling) until the sibling's exit, so
        # join() would wait out its timeout
        with _FORK_LOCK, warnings.catch_warnings():  # Python >= 3.12 warns about fork in a threaded
            warnings.simplefilter("ignore", DeprecationWarning)  # process: the child runs only our loop
            self.proc.start()
            child.close()
        if not self.conn.poll(sandbox.start_timeout_s):
            self.kill()
            raise SandboxCrash(f"{sandbox.name}: a worker did not start within {sandbox.start_timeout_s:g}s")
        try:
            status, self.isolated = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise SandboxCrash(f"{sandbox.name}: a worker died while starting (exit code {self.proc.exitcode})") from None

    def signal(self) -> None:
        """SIGKILL, not waited for (``kill`` waits)."""
        self.dead = True
        if self.proc.is_alive():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal()
        self.proc.join(timeout=5)
        with self._closing:  # Connection.close is not atomic: closed twice at once, the second
            if not self.conn.closed:  # os.close could hit a number another thread has just reused
                self.conn.close()


def _kill_all(workers: list) -> None:
    """Kill every worker: all signalled first, so that they end side by side, then each waited for."""
    for w in workers:
        w.signal()
    for w in workers:
        w.kill()


def _shutdown(workers: list) -> None:
    """``_kill_all`` at exit, best effort: one worker that fails to stop does not keep the others up."""
    for w in list(workers):
        with contextlib.suppress(Exception):
            w.signal()
    for w in list(workers):
        with contextlib.suppress(Exception):
            w.kill()
    workers.clear()


class Sandbox:
    """A pool of worker processes that run the registered ``functions`` under limits.

    Args:
        functions: name -> function; only these can be called (by name).
        timeout_s: wall-clock limit of one call.
        memory_mb: address space a worker may add to what it inherited; None: no limit.
        network: allow network access (default False: a new network namespace and an audit hook).
        workers: calls that may run at once (one per worker process); further calls wait.
        name: used in messages (e.g. "tools", "math verifier").
    """

    start_timeout_s = 30.0

    def __init__(
        self,
        functions: Mapping[str, Callable[..., Any]],
        timeout_s: float,
        memory_mb: int | None = 1024,
        network: bool = False,
        workers: int = 1,
        name: str = "sandbox",
    ):
        if timeout_s <= 0 or workers < 1 or (memory_mb is not None and memory_mb < 1):
            raise ValueError("timeout_s > 0, workers >= 1 and memory_mb >= 1 (or None) are required")
        self.functions = dict(functions)
        self.timeout_s = float(timeout_s)
        self.memory_mb = memory_mb
        self.network = network
        self.name = name
        self._free: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(workers):
            self._free.put(None)  # a slot; its worker is forked on first use
        self._live: list[_Worker] = []
        self._lock = threading.Lock()
        self.isolation: str | None = None  # "namespace+audit" or "audit", known once a worker started
        self.started = 0  # workers forked so far (replacements included)
        self._finalizer = weakref.finalize(self, _shutdown, self._live)

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``functions[name](*args, **kwargs)`` in a worker and return its result."""
        if name not in self.functions:
            raise KeyError(f"{self.name}: no function {name!r}; registered: {sorted(self.functions)}")
        worker = self._free.get()
        try:
            if worker is None:
                worker = self._start()
            return self._call(worker, name, args, kwargs)
        finally:  # a retired (killed) worker leaves an empty slot: the next call forks a new one
            self._free.put(None if worker is None or worker.dead else worker)

    def _start(self) -> _Worker:
        worker = _Worker(self)
        with self._lock:
            self._live.append(worker)
            self.started += 1
        if not self.network:
            self.isolation = "namespace+audit" if worker.isolated else "audit"
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._live:
                self._live.remove(worker)

    def _call(self, worker: _Worker, name: str, args: tuple, kwargs: dict) -> Any:
        try:
            worker.conn.send((name, args, kwargs))
            ready = worker.conn.poll(self.timeout_s)
            reply = worker.conn.recv_bytes() if ready else None
        except (EOFError, OSError, BrokenPipeError):
            code = worker.proc.exitcode if not worker.proc.is_alive() else None
            self._retire(worker)
            hint = " (killed: out of memory?)" if code == -signal.SIGKILL else ""
            raise SandboxCrash(f"{self.name}: {name} ended its worker process (exit code {code}){hint}") from None
        except BaseException:  # interrupted (Ctrl-C on the calling thread): the reply may still come, so
            self._retire(worker)  # this worker must not answer the next call with it
            raise
        if reply is not None:
            try:
                reply = pickle.loads(reply)
            except Exception as exc:  # noqa: BLE001 - e.g. an exception class whose __init__ takes other arguments
                raise SandboxError(f"{self.name}: what {name} returned or raised does not unpickle here "
                                   f"({type(exc).__name__}: {exc})") from None
        if reply is None:
            self._retire(worker)
            raise SandboxTimeout(f"{name} did not finish within {self.timeout_s:g}s; it was stopped")
        kind, value = reply[0], reply[1]
        if kind == "ok":
            return value
        if kind == "memory":
            self._retire(worker)
            raise SandboxMemoryError(f"{name} ran out of memory (limit: {self.memory_mb} MB more than the worker started with)")
        if kind == "raise":
            if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt: a tool must not end the caller
                raise SandboxError(f"{self.name}: {name} raised {type(value).__name__}: {value}")
            raise value
        raise SandboxError(f"{self.name}: {value}")

    def close(self) -> None:
        """Stop every worker (a later call starts new ones)."""
        with self._lock:
            workers = list(self._live)
            self._live.clear()
        _kill_all(workers)
        drained = 0
        while True:
            try:
                self._free.get_nowait()
                drained += 1
            except queue.Empty:
                break
        for _ in range(drained):
            self._free.put(None)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        with self._lock:
            return [w.proc.pid for w in self._live if w.proc.is_alive()]
