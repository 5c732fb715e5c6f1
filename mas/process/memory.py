"""Resident memory of this process: what the step metrics report (``memory`` in
metrics.jsonl), and handing freed memory back between steps.

``peak_rss_mb`` is the kernel's high-water mark of the process's resident set since it
started (``getrusage``'s ``ru_maxrss``): what a machine must hold for the run so far.
``rss_mb`` is the resident set now (Linux ``/proc/self/statm``; None elsewhere).
``keep_large_blocks_off_the_heap`` fixes glibc's mmap threshold at ``MMAP_THRESHOLD`` (4 MiB), so
every tensor of that size or more is its own mapping, handed back to the system when freed.
glibc's default threshold moves up to 32 MiB as such blocks are freed, after which they come
from the heap: a learner's passes then leave it fragmented, and one SmolLM2 update of
``smol_debate`` grew the resident set from 1.8 to 3.8 GiB, against 2.15 GiB with the threshold
fixed (docs/benchmarks/memory.md).  A run's process (``apply_runtime``) and every policy worker
set it; a ``MALLOC_MMAP_THRESHOLD_`` in the environment is the user's own choice and is left alone.
``huge_pages_for_large_tensors`` turns on torch's own setting for its CPU allocator,
``THP_MEM_ALLOC_ENABLE=1`` (PyTorch's CPU performance tuning guide): every tensor of 2 MiB or more is
page-aligned and advised to use transparent huge pages.  Without it a tensor is 64-byte aligned
(``posix_memalign``), and a hole a freed 2-4 MiB activation leaves in glibc's heap is a few bytes
too small for the next one of the same size, so a learner's pass grows the heap instead of reusing
it: one checkpointed SmolLM2 pass of 1,024 tokens rose 846-887 MiB, 480-521 MiB with the setting,
at the same speed (``bench/pass_memory.py``), and a ``smol_gsm8k`` update peaked at 2,753 MiB
against 2,061 MiB, side by side (docs/benchmarks/memory.md).  torch reads the variable once, at its first allocation, so it must
be set before torch is imported: the ``mas`` command (``mas.cli``) does it first, and policy
workers inherit it (Ray's workers are given it).
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


MMAP_THRESHOLD = 4 * 2**20  # bytes: blocks of this size or more are mapped apart from the heap
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


@cache
def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).mallopt  # glibc has it, musl does not
    except (OSError, AttributeError):
        return None


def keep_large_blocks_off_the_heap() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` (module docstring); False where the C
    library has no ``mallopt`` or the user set ``MALLOC_MMAP_THRESHOLD_``.  Blocks allocated
    before the call are unaffected; calling it again changes nothing."""
    mallopt = _mallopt()
    if mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"  # read by torch's CPU allocator (c10) once, as torch loads


def huge_pages_for_large_tensors() -> bool:
    """Set ``THP_MEM_ALLOC_ENABLE=1`` for torch's CPU allocator (module docstring); True when this
    call set it.  False where it cannot take effect or is not ours to set: torch is already
    imported (it has read the variable, or will have before any tensor of this run), the system
    is not Linux, or the user set the variable (their value is kept, ``0`` included)."""
    if not sys.platform.startswith("linux") or THP_VARIABLE in os.environ or "torch" in sys.modules:
        return False
    os.environ[THP_VARIABLE] = "1"
    return True


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
