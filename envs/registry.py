"""The env registry: every env, built-in or a plugin's, is one :func:`register_env` call.

Each built-in env's module registers itself when imported (``envs/__init__.py`` imports them,
so the built-ins come first, in a fixed order); a plugin's module registers itself the same
way (``mas.envs`` entry points, ``mas/config/plugins.py``).  This module holds only the
tables, so an env module imports it without importing the other envs.
"""

from __future__ import annotations

import typing
from typing import Callable, Literal

from .base import Env

__all__ = ["ENV_TOOLS", "build_env", "env_configs", "env_names", "register_env"]

_BUILDERS: dict[str, Callable[..., Env]] = {}  # env name -> build(cfg), in registration order
_CONFIGS: list[type] = []  # config models, in registration order

# Tools each env offers its agents (an env's ``tools`` mapping holds these names); config
# validation checks every agent's ``tools`` against this, before anything is built.
ENV_TOOLS: dict[str, tuple[str, ...]] = {}


def register_env(name: str, config_cls: type, build: Callable[..., Env], tools: tuple[str, ...] = ()) -> None:
    """Add an env: ``config_cls`` (a pydantic model with ``name: Literal[name]``, extra keys
    forbidden) is its YAML section, ``build(cfg)`` returns the Env, ``tools`` names the tools in
    its ``tools`` mapping.  Registering a name twice is a ValueError."""
    if name in _BUILDERS:
        raise ValueError(f"env {name!r} is already registered")
    field = getattr(config_cls, "model_fields", {}).get("name")
    if field is None or typing.get_origin(field.annotation) is not Literal or typing.get_args(field.annotation) != (name,):
        raise TypeError(f"env {name!r}: {getattr(config_cls, '__name__', config_cls)} must be a pydantic model declaring "
                        f"`name: Literal[{name!r}]`")
    _BUILDERS[name] = build
    ENV_TOOLS[name] = tuple(tools)
    _CONFIGS.append(config_cls)


def env_configs() -> tuple[type, ...]:
    """Config models of every registered env (built-in first)."""
    return tuple(_CONFIGS)


def env_names() -> list[str]:
    return list(_BUILDERS)


def build_env(cfg: typing.Any) -> Env:
    """The env for one validated env config, chosen by ``cfg.name``."""
    name = getattr(cfg, "name", None)
    if name not in _BUILDERS:
        raise ValueError(f"unknown env {name!r}; valid choices are {sorted(_BUILDERS)}")
    return _BUILDERS[name](cfg)
