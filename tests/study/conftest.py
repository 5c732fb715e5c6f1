"""Fixtures for the study tests: one small study run shared by the runner tests and the browser
test (a session fixture, so it trains once)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # study_helpers, also under --import-mode=importlib
from study_helpers import METHODS, tiny_team_yaml  # noqa: E402


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory, tiny_model_dir):
    """`mas study TEAM --methods grpo,sharp --seeds 2 --out DIR --eval-every 1 trainer.steps=2` on tiny models."""
    from mas.cli import main

    root = tmp_path_factory.mktemp("study")
    team = tiny_team_yaml(root / "team.yaml", tiny_model_dir)
    out = root / "out"
    assert main(["study", team, "--methods", ",".join(METHODS), "--seeds", "2", "--out", str(out), "--eval-every", "1",
                 "trainer.steps=2"]) == 0
    return out
