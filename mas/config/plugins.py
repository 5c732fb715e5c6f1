"""Plugins: envs, credit methods, parsers and topologies from other installed packages (entry points).

A package adds to mas through five entry-point groups, e.g. in its ``pyproject.toml``::

    [project.entry-points."mas.envs"]
    my_env = "my_pkg.mas_env"                  # a module that calls mas.envs.register_env("my_env", ...)

    [project.entry-points."mas.credit"]
    my_method = "my_pkg.credit"                # a module that registers "my_method" with @register_credit

    [project.entry-points."mas.parsers"]
    json_answer = "my_pkg.parsers:parse_json"  # a function text -> (parsed dict, valid)

    [project.entry-points."mas.verifiers"]
    my_check = "my_pkg.checks:verify"          # a turn verifier (episode, turn) -> float | None

    [project.entry-points."mas.topologies"]
    my_kind = "my_pkg.topology"                # a module that registers kind "my_kind" with @register_topology

Plugins are loaded once, when ``mas.config.schema`` is imported (before the config schema is built),
so their names are valid in YAML and listed among the valid choices of ``mas validate``'s
errors.  An entry point whose import fails, or that does not register the name it is listed
under, is skipped with a warning (``load_errors()``); nothing else is affected.  A plugin
module must not import ``mas.config.schema`` at import time (the schema is being built from it);
``mas.envs``, ``mas.credit``, ``mas.agents.parsers``, ``mas.topologies`` and ``mas.types`` are fine.
"""

from __future__ import annotations

import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

GROUPS = ("mas.parsers", "mas.credit", "mas.envs", "mas.verifiers", "mas.topologies")
_loaded: dict[str, list[str]] = {}  # group -> names loaded
_errors: list[str] = []


def _register_parser(name: str, obj: Any) -> None:
    from mas.agents.parsers import register_parser

    register_parser(name, obj)


def _registered_credit(name: str, obj: Any) -> None:
    from mas.credit import credit_names

    if name not in credit_names():
        raise LookupError(f"importing it registered no credit method {name!r} (use @register_credit({name!r}, ...))")


def _registered_env(name: str, obj: Any) -> None:
    from mas.envs import env_names

    if name not in env_names():
        raise LookupError(f"importing it registered no env {name!r} (call mas.envs.register_env({name!r}, ...))")


def _registered_topology(name: str, obj: Any) -> None:
    from mas.topologies import topology_kinds

    if name not in topology_kinds():
        raise LookupError(f"importing it registered no topology kind {name!r} (decorate its class with "
                          f"mas.topologies.register_topology)")


def _register_verifier(name: str, obj: Any) -> None:
    from mas.envs.verifiers import register_verifier

    register_verifier(name, obj)


_AFTER_LOAD: dict[str, Callable[[str, Any], None]] = {
    "mas.parsers": _register_parser,
    "mas.verifiers": _register_verifier,
    "mas.credit": _registered_credit,
    "mas.envs": _registered_env,
    "mas.topologies": _registered_topology,
}


def load_plugins() -> dict[str, list[str]]:
    """Load every installed plugin once; returns the names loaded per group."""
    if _loaded:
        return _loaded
    installed = entry_points()  # one scan of the installed distributions for all groups
    for group in GROUPS:
        _loaded[group] = []
        for ep in sorted(installed.select(group=group), key=lambda e: e.name):
            try:
                _AFTER_LOAD[group](ep.name, ep.load())
            except Exception as e:  # noqa: BLE001 - a broken plugin is reported and skipped
                msg = f"plugin {ep.name!r} ({group} = {ep.value!r}{_dist(ep)}) was not loaded: {type(e).__name__}: {e}"
                _errors.append(msg)
                warnings.warn(msg, stacklevel=2)
                continue
            _loaded[group].append(ep.name)
    return _loaded


def load_errors() -> list[str]:
    """Why plugins were skipped (empty when all loaded)."""
    return list(_errors)


def _dist(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f", from {dist.name}" if dist is not None else ""
