"""bench/soak.py runs the soaked training in a child process: stopping the soak must stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"

# The soak's parent, with a child that writes its pid, then waits until it is killed.
PARENT = """
import sys
import time
sys.path.insert(0, sys.argv[1])
from soak import run_child
child = "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)"
sys.exit(run_child([sys.executable, "-c", child, sys.argv[2]], {}))
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigterm_to_the_soak_stops_its_child(tmp_path):
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(BENCH), str(pid_file)])
    child = None
    try:
        while not pid_file.exists():  # the child has started (no timing involved)
            assert parent.poll() is None, "the parent ended before its child started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=120) == 128 + signal.SIGTERM
        # the parent reaped its child before exiting: the pid is gone (not a zombie of ours)
        assert not alive(child)
    finally:  # nothing left running, whatever failed
        parent.kill()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
