"""Ray for the runtime tests: one local instance per test module, its temp dir inside the work
tree (.mas_tmp/), no dashboard, no authentication, shut down when the module ends."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # read when Ray starts; set before any test starts it
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # ray_helpers (also under --import-mode=importlib)
    sys.path.insert(0, _HERE)

from ray_helpers import work_tree_temp  # noqa: E402


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance for this module (4 logical CPUs: a few policy actors fit on 2 cores)."""
    import ray

    from mas.runtime.ray_cluster import ray_temp_dir

    base = work_tree_temp("ray")
    temp = ray_temp_dir(base)  # base/ray, or a short folder it links to (Ray's socket paths are limited)
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=str(temp), logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
