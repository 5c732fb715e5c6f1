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
from pathlib import Path
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


def _shown(path: Path) -> str:
    """``path`` relative to the current directory where it is inside it (``.venv/bin/python``), else whole."""
    try:
        rel = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return str(rel) if str(rel) != "." else "."


def install_command(extra: str) -> str:
    """The command that installs mas-rl's ``extra`` into the Python running now: this
    interpreter's pip (a venv need not be activated), editable from the source checkout mas runs
    from (``-e '.[autogen]'`` at its root), else the published package."""
    python = _shown(Path(sys.executable))
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file():
        return f"{python} -m pip install -e '{_shown(root)}[{extra}]'"
    return f"{python} -m pip install 'mas-rl[{extra}]'"


def needs_extra(extra: str) -> str:
    """The one line for a package mas-rl's ``extra`` installs: "needs the `autogen` extra: <command>"."""
    return f"needs the `{extra}` extra: {install_command(extra)}"


# Packages that the frameworks' own documentation imports beside the framework, mapped to what
# installs them, where the module's name does not say (autogen_ext's OpenAI client needs its extra).
_KNOWN_DISTRIBUTIONS = {"autogen_ext": "autogen-ext[openai]", "langchain_openai": "langchain-openai",
                        "langchain_anthropic": "langchain-anthropic", "langchain_community": "langchain-community",
                        "langgraph_supervisor": "langgraph-supervisor", "langgraph_swarm": "langgraph-swarm",
                        "langchain": "langchain", "openai": "openai"}


def missing_module_hint(module: str) -> str:
    """What to do about a module that is not installed: the mas-rl extra that brings it, or the
    package to install (named for the well-known framework packages, else guessed from the name)."""
    top = module.split(".")[0]
    extra = extra_providing(top)
    if extra:
        return needs_extra(extra)
    python = _shown(Path(sys.executable))
    dist = _KNOWN_DISTRIBUTIONS.get(top)
    if dist:
        return f"{top!r} is not installed (mas does not need it; your code does): {python} -m pip install '{dist}'"
    return (f"{top!r} is not installed in this environment (mas does not need it; your code does): install the "
            f"package that provides it, e.g. {python} -m pip install {top.replace('_', '-')}")


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
        if e.name and module_name.split(".")[0] == e.name.split(".")[0]:  # the module itself (or its package) is missing
            raise RefError(f"cannot import {module_name!r}: no module named {e.name!r} (searched the current "
                           f"directory {cwd} and the installed packages)") from None
        if e.name:  # a package the module imports (a framework, an optional extra): what installs it
            raise RefError(f"{module_name!r} imports {e.name!r}: {missing_module_hint(e.name)}") from None
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
