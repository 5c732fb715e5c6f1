"""The embedded build shows each stage's progress on stderr (its name, steps, loss and time
left), and says nothing there when asked not to."""

from __future__ import annotations

import dataclasses
import re

import torch

from mas.embedded import Recipe
from mas.embedded.build import build_embedded

# the smallest build of tests/test_embedded.py, with a second stage of two steps on top
SMALL = Recipe(formats=(("orchestrator", 12), ("chain", 6)), steps=3, hidden_size=32, num_layers=1, num_heads=2, vocab_size=300,
               extend=(), research=())
TWO = dataclasses.replace(SMALL, extend=(("saboteur_solver", 6),), extend_steps=2)


def test_each_stage_of_a_build_shows_a_bar_with_its_name_steps_and_loss(tmp_path, monkeypatch, capfd):
    torch.set_num_threads(1)
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    build_embedded(TWO, tmp_path / "two", log=lambda *_: None)  # the warm start is built into the cache on the way
    out, err = capfd.readouterr()
    assert out == ""  # the bars go to stderr only
    assert re.search(r"warm start: 100%.*\b3/3\b.*loss \d+\.\d{3}", err)
    assert re.search(r"second stage: 100%.*\b2/2\b.*loss \d+\.\d{3}", err)
    assert re.search(r"warm start: +0%.*\b0/3\b", err)  # the bar is there from the stage's start


def test_progress_false_writes_no_bar(tmp_path, capfd):
    torch.set_num_threads(1)
    said = []
    build_embedded(SMALL, tmp_path / "one", log=said.append, progress=False)
    out, err = capfd.readouterr()
    assert "warm start" not in err and "3/3" not in err
    assert any("warm start (3 steps)" in line for line in said)  # the log lines are the caller's, as before
