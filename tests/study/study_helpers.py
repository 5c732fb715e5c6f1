"""Helpers for the study and audit tests: the tiny team YAML they train."""

from __future__ import annotations

import os
import sys

import yaml

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # team_helpers
    sys.path.insert(0, _TESTS)

from team_helpers import team_config  # noqa: E402

METHODS = ("grpo", "sharp")


def tiny_team_yaml(path, model_dir, **trainer) -> str:
    """A chain team (lead -> helper -> frozen checker) on the tiny random model, written as YAML."""
    cfg = team_config(model_dir, "chain")
    cfg["trainer"].update({"steps": 2, "batch_size": 2, "group_size": 2, "eval_size": 4, **trainer})
    path.write_text(yaml.safe_dump(cfg))
    return str(path)
