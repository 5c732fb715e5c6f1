"""Tasks, verifiers and tools (DESIGN.md: envs/).

Every env is registered by name with its config model, its builder and the names of the tools
it offers its agents.  ``env_configs()`` lists the config models; the run config builds the
``env`` section as ``Annotated[Union[env_configs()], Field(discriminator="name")]``, so an
unknown name is an error that lists every registered env.  ``build_env`` turns one of those
configs into an :class:`Env`.  Importing this package is cheap: heavy dependencies
(``datasets``) are imported only by the env that needs them, when it is built.

Third-party packages add envs through the ``mas.envs`` entry-point group (``mas/config/plugins.py``):
the entry point names a module that calls :func:`register_env` when imported.

Turn verifiers (``verifiers.py``): the built-in envs check their turns' own jobs; each built-in
verifier is also registered under its env's name, so a config can name one explicitly
(``verifier: {name: synthetic_math}``), and packages add more through ``mas.verifiers``.
"""

from __future__ import annotations

import typing
from typing import Callable, Literal

from .base import Env, check_env_state
from .custom import CustomEnv, CustomEnvConfig
from .math import GSM8KConfig, GSM8KEnv, SyntheticMathConfig, SyntheticMathEnv
from .math.turns import verify_math_turn
from .research import TOOL_NAMES as _RESEARCH_TOOLS
from .research import FactsConfig, FactsEnv, HotpotQAConfig, HotpotQAEnv
from .research.turns import verify_search_turn
from .team import (TeamConjunctiveConfig, TeamConjunctiveEnv, TeamForkConfig, TeamForkEnv, TeamRelayConfig, TeamRelayEnv,
                   TeamSaboteurConfig, TeamSaboteurEnv)
from .team.relay import verify_part_turn
from .team.saboteur import verify_saboteur_turn
from .verifiers import register_verifier

__all__ = ["ENV_CONFIGS", "ENV_TOOLS", "Env", "EnvConfig", "build_env", "check_env_state", "env_configs", "env_names",
           "register_env"]

ENV_CONFIGS = (SyntheticMathConfig, GSM8KConfig, HotpotQAConfig, FactsConfig, TeamConjunctiveConfig, TeamSaboteurConfig,
               TeamRelayConfig, TeamForkConfig, CustomEnvConfig)
EnvConfig = (SyntheticMathConfig | GSM8KConfig | HotpotQAConfig | FactsConfig | TeamConjunctiveConfig | TeamSaboteurConfig
             | TeamRelayConfig | TeamForkConfig | CustomEnvConfig)

_BUILDERS: dict[str, Callable[..., Env]] = {
    "synthetic_math": SyntheticMathEnv,
    "gsm8k": GSM8KEnv,
    "hotpotqa": HotpotQAEnv,
    "facts": FactsEnv,
    "team_conjunctive": TeamConjunctiveEnv,
    "team_saboteur": TeamSaboteurEnv,
    "team_relay": TeamRelayEnv,
    "team_fork": TeamForkEnv,
    "custom": CustomEnv,
}

# Tools each env offers its agents (an env's ``tools`` mapping holds these names); config
# validation checks every agent's ``tools`` against this, before anything is built.
ENV_TOOLS: dict[str, tuple[str, ...]] = {"synthetic_math": (), "gsm8k": (), "hotpotqa": _RESEARCH_TOOLS, "facts": _RESEARCH_TOOLS,
                                         "team_conjunctive": (), "team_saboteur": (), "team_relay": (), "team_fork": (), "custom": ()}

_REGISTERED: list[type] = []  # config models of envs added with register_env

# the built-in turn verifiers, by the name of the env they belong to (GSM8K has none: only its outcome is checkable)
for _name, _fn in (("synthetic_math", verify_math_turn), ("team_relay", verify_part_turn), ("team_fork", verify_part_turn),
                   ("team_conjunctive", verify_part_turn), ("team_saboteur", verify_saboteur_turn),
                   ("hotpotqa", verify_search_turn), ("facts", verify_search_turn)):
    register_verifier(_name, _fn)


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
    _REGISTERED.append(config_cls)


def env_configs() -> tuple[type, ...]:
    """Config models of every registered env (built-in first)."""
    return ENV_CONFIGS + tuple(_REGISTERED)


def env_names() -> list[str]:
    return list(_BUILDERS)


def build_env(cfg: EnvConfig) -> Env:
    """The env for one validated env config, chosen by ``cfg.name``."""
    name = getattr(cfg, "name", None)
    if name not in _BUILDERS:
        raise ValueError(f"unknown env {name!r}; valid choices are {sorted(_BUILDERS)}")
    return _BUILDERS[name](cfg)
