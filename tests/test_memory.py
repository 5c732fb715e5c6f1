"""Handing the allocator's freed memory back to the system between steps (mas.training.memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


FRAGMENT_AND_RELEASE = """
from mas.training.memory import release_freed_memory, rss_mb
# 64 KB blocks sit below glibc's mmap threshold, so freeing them leaves a fragmented heap
# that glibc keeps: every 50th block stays alive, pinning the heap's top.
blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 250 MiB
kept = blocks[::50]
del blocks
before = rss_mb()
assert release_freed_memory()
after = rss_mb()
assert before - after > 150, (before, after)  # most of the freed 245 MiB is returned
assert len(kept) == 80 and all(len(b) == 64 * 1024 for b in kept)  # what is in use stays
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_freed_heap_goes_back_to_the_system():
    # In a child process with glibc's defaults: a MALLOC_MMAP_THRESHOLD_ (or GLIBC_TUNABLES) below
    # 64 KB in the environment would put each block in its own mapping, freed at once, and the
    # fragmented heap this test needs would never form.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", FRAGMENT_AND_RELEASE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_training_step_starts_by_releasing_freed_memory(tiny_model_dir, tmp_path, monkeypatch):
    import mas
    import mas.training.trainer
    from team_helpers import team_config

    calls = []
    steps = []
    monkeypatch.setattr(mas.training.trainer, "release_freed_memory", lambda: calls.append(len(steps)) or True)

    class Steps:
        def on_step_end(self, step, metrics, groups, credit):
            steps.append(step)

    team = mas.load_team(team_config(tiny_model_dir, "chain"))
    mas.train(team, tmp_path / "run", callbacks=[Steps()])
    assert steps == [0, 1, 2] and calls == [0, 1, 2]  # once before each step, after the one before it
