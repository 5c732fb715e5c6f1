"""Fixtures for the credit tests; makes the sibling helper module ``credit_reference`` importable."""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # also works under --import-mode=importlib
    sys.path.insert(0, _HERE)


@pytest.fixture
def isolated_registry(monkeypatch):
    """A copy of the credit registry that is thrown away after the test."""
    from mas.credit import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return registry
