"""The `mas` command ends when it is done, even when a framework node's worker thread never returns."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys, threading
from mas.cli import exit_watchdog

if sys.argv[1] == "hung":
    blocker = threading.Event()
    threading.Thread(target=blocker.wait, name="langgraph-node", daemon=False).start()  # never set
print("run finished")
exit_watchdog(3, grace_s=0.5)
sys.exit(3)
"""


def run(mode: str) -> subprocess.CompletedProcess:
    # the timeout is a hang guard for the test itself (without the watchdog the hung case never ends)
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)


def test_a_hung_worker_thread_no_longer_keeps_the_finished_command_alive():
    done = run("hung")
    assert done.returncode == 3 and done.stdout == "run finished\n"
    assert "1 worker thread(s) did not end" in done.stderr and "langgraph-node" in done.stderr


def test_a_clean_exit_is_left_alone():
    done = run("clean")
    assert done.returncode == 3 and done.stdout == "run finished\n" and "worker thread" not in done.stderr


def test_the_console_command_goes_through_the_watchdog():
    import tomllib
    from pathlib import Path

    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mas"] == "mas.cli:entry"
