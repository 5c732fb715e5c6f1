"""References to user code in a config: ``"package.module:attribute"``.

A team built in code (an AutoGen factory, a LangGraph builder) or a custom task loader and
reward function is named in YAML by such a reference.  It is imported the way ``python -m``
and most Python servers (uvicorn, gunicorn) import an application: the current directory
comes first on ``sys.path``, so ``mas train configs/team.yaml`` run at a project's root finds
the project's own packages (``examples.teams:build`` in this repository) without installing
them.  An installed package is found as usual.

In mas's own source checkout that would shadow other projects: the checkout's root holds
``agents/``, ``credit/``, ``envs/`` and ``topologies/``, which install as ``mas.agents``, ...
(pyproject.toml's package-dir), while other distributions own the top-level names (the OpenAI
Agents SDK imports as ``agents``).  With the root first on ``sys.path`` (``mas train`` at the
root, ``python -m``, ``python -m pytest``), ``import agents`` would find mas's folder.
``shield_checkout_folders`` (installed when ``mas`` is imported) makes those four top-level names
skip exactly the folders mas itself is loaded from, so they find the installed package that owns
the name, or none.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class RefError(ValueError):
    """A reference that cannot be resolved; the message says why.  ``missing`` names the package the
    referenced module imports where that is what is not installed (the code may be right; this
    environment cannot run it), else None."""

    def __init__(self, message: str, missing: str | None = None) -> None:
        super().__init__(message)
        self.missing = missing


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
_KNOWN_DISTRIBUTIONS = {"agents": "openai-agents", "autogen_ext": "autogen-ext[openai]", "langchain_openai": "langchain-openai",
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


# mas's subpackages whose folders sit at the repository root (pyproject.toml's package-dir)
CHECKOUT_FOLDERS = ("agents", "credit", "envs", "topologies")


class _CheckoutShield(importlib.abc.MetaPathFinder):
    """Finds the top-level ``agents``, ``credit``, ``envs`` and ``topologies`` anywhere but in the
    folder mas's own subpackage of that name is loaded from (``mas.agents`` from ``<checkout>/agents``
    in an editable install).  Only those four names are looked at; a regular install, whose
    subpackages live inside ``mas/``, is never affected, nor is a project of the user's own that
    has an ``agents/`` folder."""

    def __init__(self) -> None:
        self._own: dict[str, Path | None] = {}

    def own_folder(self, name: str) -> Path | None:
        """The folder ``mas.<name>`` is loaded from, where it is a top-level folder of a sys.path entry."""
        if name not in self._own:
            spec = importlib.util.find_spec(f"mas.{name}")
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
            self._own[name] = Path(locations[0]).resolve() if locations else None
        return self._own[name]

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if path is not None or fullname not in CHECKOUT_FOLDERS:
            return None
        own = self.own_folder(fullname)
        if own is None:
            return None
        entries = [e for e in sys.path if Path(e or os.curdir).resolve() != own.parent]
        if len(entries) == len(sys.path):
            return None  # the checkout's root is not on sys.path: nothing to shadow
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, entries, target)
            if spec is not None and not _inside(spec, own):
                return spec
        raise ModuleNotFoundError(f"No module named {fullname!r} (the {fullname}/ folder of mas's source checkout "
                                  f"{own.parent} is mas.{fullname}, not a top-level package)", name=fullname)


def _inside(spec: importlib.machinery.ModuleSpec, folder: Path) -> bool:
    where = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    return any(Path(w).resolve() == folder or folder in Path(w).resolve().parents for w in where)


def shield_checkout_folders() -> None:
    """Install ``_CheckoutShield`` first on ``sys.meta_path`` (once): ``import agents`` then finds the
    installed OpenAI Agents SDK even with mas's checkout root first on ``sys.path``."""
    if not any(isinstance(f, _CheckoutShield) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutShield())


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
            raise RefError(f"{module_name!r} imports {e.name!r}: {missing_module_hint(e.name)}", missing=e.name) from None
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
