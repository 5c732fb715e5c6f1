"""The import paths of modules from before mas/ was grouped by layer (``mas.engine`` is now
``mas.rollout.engine``, ``mas.backends.hf`` is ``mas.rollout.backends.hf``, ...).

A plugin, a notebook or a pickle that names an old path gets the module itself, not a copy:
``mas.engine is mas.rollout.engine``, so a class or a monkeypatch seen through either name is the
same one.  Each old name warns once per process (``DeprecationWarning``, pointed at the line that
imports it) with the name to use.  ``mas.config`` kept its name (the schema moved inside it, and
the package re-exports it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old name under mas. -> new name under mas.; a package's submodules follow it.  The flat names are
# from before mas/ was grouped by folder; the dotted ones from before the learning and process
# floors got folders of their own (and the rollout's scoring was renamed logprobs, so that it is
# not read as the env's score).
MOVED: dict[str, str] = {
    **{name: f"config.{name}" for name in ("checks", "defaults", "safe_yaml", "plugins")},
    **{name: f"models.{name}" for name in ("sources", "hub", "gguf", "tiny")},
    **{name: f"rollout.{name}" for name in ("engine", "backends")},
    **{name: f"training.{name}" for name in ("team", "trainer", "warmup", "checkpoint", "signals", "metrics",
                                             "callbacks", "rundir")},
    **{name: f"learning.{name}" for name in ("learner", "sft", "memory_plan")},
    **{name: f"process.{name}" for name in ("fault_points", "memory", "sandbox")},
    "scoring": "learning.logprobs",
    **{f"training.{name}": f"learning.{name}" for name in ("learner", "sft", "memory_plan")},
    **{f"training.{name}": f"process.{name}" for name in ("fault_points", "memory")},
    "rollout.scoring": "learning.logprobs",
    "rollout.sandbox": "process.sandbox",
    "config.refs": "refs",
    "agents.tools": "tools",
}


def new_name(fullname: str) -> str | None:
    """Where the module once called ``fullname`` lives now (None: it did not move): the longest
    moved name it starts with, and the rest of its path under the new name."""
    root, _, rest = fullname.partition(".")
    if root != "mas" or not rest:
        return None
    parts = rest.split(".")
    for i in range(len(parts), 0, -1):
        old = ".".join(parts[:i])
        if old in MOVED:
            return f"mas.{MOVED[old]}" + "".join(f".{p}" for p in parts[i:])
    return None


def _importer_level() -> int:
    """``stacklevel`` of the first frame outside the import machinery and this file: the
    ``import`` statement (or ``import_module``, ``pickle.loads`` call) that named the old path.
    ``warnings.warn`` itself skips importlib's bootstrap frames, so they are not counted."""
    frame, level = sys._getframe(1), 1  # level 1: the caller of warnings.warn
    while frame is not None and (frame.f_globals.get("__name__", "").split(".")[0] == "importlib"
                                 or frame.f_globals.get("__name__") == __name__):
        frame = frame.f_back
        if frame is not None and "_bootstrap" not in frame.f_code.co_filename:
            level += 1
    return level


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module under its new name."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.target}; import it from there (the old path is an alias that will go)",
                      DeprecationWarning, stacklevel=_importer_level())
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # creating it under the old name set the old name's spec on it: give its own back
        module.__spec__ = self.own_spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        moved = new_name(fullname)
        return None if moved is None else importlib.machinery.ModuleSpec(fullname, _Alias(moved))


def install() -> None:
    """Answer the old names (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
