"""Helpers of the runtime tests (imported by test modules; tests/runtime/conftest.py puts this folder on the path)."""

from __future__ import annotations

import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def work_tree_temp(prefix: str) -> Path:
    """A fresh folder under the work tree's .mas_tmp/ (removed by the caller)."""
    path = REPO / ".mas_tmp" / f"{prefix}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path
