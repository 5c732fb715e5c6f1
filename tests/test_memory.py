"""Handing the allocator's freed memory back to the system between steps (mas.memory)."""

from __future__ import annotations

import sys

import pytest

from mas.memory import release_freed_memory, rss_mb


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_freed_heap_goes_back_to_the_system():
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


def test_every_training_step_starts_by_releasing_freed_memory(tiny_model_dir, tmp_path, monkeypatch):
    import mas
    import mas.trainer
    from team_helpers import team_config

    calls = []
    steps = []
    monkeypatch.setattr(mas.trainer, "release_freed_memory", lambda: calls.append(len(steps)) or True)

    class Steps:
        def on_step_end(self, step, metrics, groups, credit):
            steps.append(step)

    team = mas.load_team(team_config(tiny_model_dir, "chain"))
    mas.train(team, tmp_path / "run", callbacks=[Steps()])
    assert steps == [0, 1, 2] and calls == [0, 1, 2]  # once before each step, after the one before it
