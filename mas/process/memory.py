"""Resident memory of this process: what the step metrics report (``memory`` in
metrics.jsonl), and handing freed memory back between steps.

``peak_rss_mb`` is the kernel's high-water mark of the process's resident set since it
started (``getrusage``'s ``ru_maxrss``): what a machine must hold for the run so far.
``rss_mb`` is the resident set now (Linux ``/proc/self/statm``; None elsewhere).
``release_freed_memory`` asks glibc's allocator to return the free pages it keeps
(``malloc_trim``): a step's tensors of every size leave a fragmented heap behind them, which
glibc keeps for reuse, so a long run's resident set grew by tens of MB a step
(docs/benchmarks/memory.md).  The warm-up and every held-out evaluation end with it too, so a phase
does not start on the heap the one before left.  ``live_tensors`` counts what is really held:
the torch tensors Python objects keep alive, and the bytes of their distinct storages.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys
from functools import cache


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def rss_mb() -> float | None:
    """Resident memory of this process now, in MiB (None where /proc is not available)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library; glibc has it, musl does not
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the system (glibc ``malloc_trim(0)``: every arena,
    not only the top of the heap); False where the C library has no such call.  Nothing in
    use moves; the cost is a walk over the free lists, milliseconds on a multi-GB heap."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def live_tensors() -> tuple[int, int]:
    """(count, bytes) of the torch tensors alive in this process that the garbage collector
    tracks (every tensor a Python object holds: parameters, gradients, optimizer state, caches),
    the bytes summed over distinct storages (views share theirs).  Takes a full collection
    first, so unreachable cycles are not counted; a second or so on a large heap."""
    import torch

    gc.collect()
    storages: dict[tuple[str, int], int] = {}
    count = 0
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(): no __class__ lookups on lazy modules and proxies
            continue
        try:
            if obj.is_meta:
                continue
            storage = obj.untyped_storage()
            storages[(str(obj.device), storage.data_ptr())] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse and other layouts without one storage
            continue
        count += 1
    return count, sum(storages.values())
