"""Fixtures for the credit tests; makes ``credit_reference`` and ``tests/team_helpers`` importable."""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (_HERE, os.path.dirname(_HERE)):  # credit_reference, and tests/team_helpers
    if _path not in sys.path:  # also works under --import-mode=importlib
        sys.path.insert(0, _path)


@pytest.fixture
def isolated_registry(monkeypatch):
    """A copy of the credit registry that is thrown away after the test."""
    from mas.credit import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return registry
