"""Makes ``tests/team_helpers`` and ``tests/test_engine`` importable from the topology tests."""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # also works under --import-mode=importlib
    sys.path.insert(0, _TESTS)
