"""A meta-path finder that makes top-level packages look uninstalled (imported by test modules)."""

from __future__ import annotations

import importlib.abc


class Hide(importlib.abc.MetaPathFinder):
    """Makes top-level packages ``names`` look uninstalled (a real ModuleNotFoundError)."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None
