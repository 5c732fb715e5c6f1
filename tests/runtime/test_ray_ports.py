"""Two runs on one machine each start their own Ray without fighting over a port.

Ray's dashboard agent listens on the fixed port 52365 unless told otherwise; the second Ray
instance on a machine then runs its agent without its HTTP service.  Our local instances ask
for port 0 (the OS picks a free one), as every other port of a local instance already is.
"""

from __future__ import annotations

import errno
import shutil
import socket
import time
from pathlib import Path

import pytest
from ray_helpers import work_tree_temp

from mas.runtime.ray_cluster import RaySession

RAY_DEFAULT_AGENT_PORT = 52365


class Started(Exception):
    """Raised by the stand-in ray.remote: the study's Ray is up, nothing more to run."""


def start_for_a_run(path: Path) -> None:
    RaySession(None, path, 1).close()


def start_for_a_study(path: Path) -> None:
    from mas.study.runner import _run_ray

    with pytest.raises(Started):
        _run_ray([], None, 1.0, print)


@pytest.mark.parametrize("start", [start_for_a_run, start_for_a_study])
def test_every_local_start_asks_for_a_free_agent_port_and_leaves_ray_as_it_was(start, monkeypatch, tmp_path):
    import ray
    from ray._private import parameter

    original = parameter.RayParams
    asked: list[int | None] = []

    def init(**kwargs):
        # what ray.init does for a new local instance: node parameters with Ray's defaults
        asked.append(parameter.RayParams(num_cpus=kwargs.get("num_cpus")).dashboard_agent_listen_port)

    def remote(*args, **kwargs):
        raise Started

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "remote", remote)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    for run in ("a", "b"):
        start(tmp_path / run)
    assert asked == [0, 0]  # port 0: the OS picks a free one each time, never Ray's fixed default
    assert parameter.RayParams is original and original().dashboard_agent_listen_port == RAY_DEFAULT_AGENT_PORT


def hold_port(port: int) -> socket.socket | None:
    """Listen on ``port`` on all interfaces, as another Ray's agent would; None if it is already
    taken (by another Ray on this machine: just as good)."""
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            return None
        raise
    s.listen(1)
    return s


def agent_http_port(temp: Path, timeout: float = 120) -> int:
    """The port the dashboard agent's HTTP server bound, as the agent records it in its session
    dir once it has tried (-1: it runs without one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in temp.glob("session_2*/dashboard_agent_listen_port_*") if p.read_text().strip()]
        if found:
            return int(found[0].read_text())
        time.sleep(0.2)
    pytest.fail(f"the dashboard agent recorded no port under {temp} within {timeout:.0f} s")


def test_a_run_starts_a_working_agent_while_another_ray_holds_the_default_port():
    import ray

    held = hold_port(RAY_DEFAULT_AGENT_PORT)
    run = work_tree_temp("run")  # inside the work tree, short enough for Ray's socket paths
    session = None
    try:
        session = RaySession(None, run, 1)
        port = agent_http_port(session.temp)
        assert port > 0 and port != RAY_DEFAULT_AGENT_PORT, f"the agent's HTTP service did not start (port {port})"
    finally:
        if session is not None:
            session.close()
        if held is not None:
            held.close()
        shutil.rmtree(run, ignore_errors=True)
    assert not ray.is_initialized()
