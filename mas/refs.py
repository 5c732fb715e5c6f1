"""References to user code in a config: ``"package.module:attribute"``.

A team built in code (an AutoGen factory, a LangGraph builder) or a custom task loader and
reward function is named in YAML by such a reference.  It is imported the way ``python -m``
and most Python servers (uvicorn, gunicorn) import an application: the current directory
comes first on ``sys.path``, so ``mas train configs/team.yaml`` run at a project's root finds
the project's own packages (``examples.teams:build`` in this repository) without installing
them.  An installed package is found as usual.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import sys
from typing import Any

_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class RefError(ValueError):
    """A reference that cannot be resolved; the message says why."""


def extra_providing(module: str) -> str | None:
    """The pip extra of mas-rl that installs top-level module ``module`` (``autogen_agentchat`` ->
    ``autogen``), read from the installed package's metadata (pyproject.toml's optional
    dependencies); None for a module no extra brings, or where mas-rl is not installed."""
    top = module.split(".")[0]
    try:
        requires = importlib.metadata.requires("mas-rl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for req in requires:  # e.g. 'autogen-agentchat>=0.4; extra == "autogen"'
        spec, _, marker = req.partition(";")
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        dist = re.split(r"[\s\[<>=!~;]", spec.strip(), maxsplit=1)[0]
        if found and dist and dist.lower().replace("-", "_").replace(".", "_") == top.lower():
            return found.group(1)
    return None


def check_ref_syntax(ref: str) -> None:
    if not isinstance(ref, str) or not _REF.match(ref):
        raise RefError(f"expected 'package.module:function', found {ref!r}")


def import_ref(ref: str, callable_: bool = True) -> Any:
    """The object ``ref`` names (``module:attr`` or ``module:Class.attr``), imported with the
    current directory first on ``sys.path``.  Errors are ``RefError``s that say what is missing."""
    check_ref_syntax(ref)
    module_name, attr_path = ref.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        extra = extra_providing(e.name or "")
        if extra:  # a framework mas installs as an option (autogen): say which extra brings it
            raise RefError(f"{module_name!r} needs {e.name!r}, which is not installed: "
                           f"pip install -e '.[{extra}]' (or EXTRAS=dev,{extra} bash scripts/setup.sh)") from None
        if e.name and module_name.startswith(e.name):  # the module itself (or its package) is missing
            raise RefError(f"cannot import {module_name!r}: no module named {e.name!r} (searched the current "
                           f"directory {cwd} and the installed packages)") from None
        raise RefError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's module raised while importing
        raise RefError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise RefError(f"{module_name!r} has no attribute {attr_path!r}; its callables: {public}")
        obj = getattr(obj, part)
    if callable_ and not callable(obj):
        raise RefError(f"{ref!r} is a {type(obj).__name__}, not a function")
    return obj
