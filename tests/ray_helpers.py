"""Helpers of the tests that start Ray: work-tree temp dirs, and a local Ray instance that
leaves nothing behind (its temp dir inside the work tree, no dashboard, no authentication)."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def work_tree_temp(prefix: str) -> Path:
    """A fresh folder under the work tree's .mas_tmp/ (removed by the caller)."""
    path = REPO / ".mas_tmp" / f"{prefix}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


@contextlib.contextmanager
def local_ray(**init_kwargs: Any) -> Iterator[Any]:
    """``ray.init(**init_kwargs)`` (as the runs start Ray: every port picked free) with its temp dir in a fresh work-tree folder (or a short
    folder that links there: Ray's socket paths are limited); on exit Ray is shut down and
    both folders are removed."""
    import ray

    from mas.runtime.ray_cluster import ray_temp_dir, start_local_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # read when Ray starts
    base = work_tree_temp("ray")
    temp = ray_temp_dir(base)
    start_local_ray(ray, include_dashboard=False, _temp_dir=str(temp), **init_kwargs)  # ports picked free
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
