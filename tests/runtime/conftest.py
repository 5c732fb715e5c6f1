"""Ray for the runtime tests: one local instance per test module, its temp dir inside the work
tree (.mas_tmp/), no dashboard, no authentication, shut down when the module ends."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # read when Ray starts; set before any test starts it

from ray_helpers import local_ray  # noqa: E402


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance for this module (4 logical CPUs: a few policy actors fit on 2 cores)."""
    with local_ray(num_cpus=4, logging_level="WARNING") as ray:
        yield ray
