"""Resident memory of this process, for the step metrics (``memory`` in metrics.jsonl).

``peak_rss_mb`` is the kernel's high-water mark of the process's resident set since it
started (``getrusage``'s ``ru_maxrss``): what a machine must hold for the run so far.
``rss_mb`` is the resident set now (Linux ``/proc/self/statm``; None elsewhere).
"""

from __future__ import annotations

import os
import resource
import sys


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
