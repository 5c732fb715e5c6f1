"""Tasks, verifiers and tools (DESIGN.md: envs/).

``ENV_CONFIGS`` lists the config model of every env; the run config builds the ``env`` section
as ``Annotated[Union[ENV_CONFIGS], Field(discriminator="name")]``. ``build_env`` turns one of
those configs into an :class:`Env`. Importing this package is cheap: heavy dependencies
(``datasets``) are imported only by the env that needs them, when it is built.
"""

from __future__ import annotations

from typing import Callable

from .base import Env, check_env_state
from .math import GSM8KConfig, GSM8KEnv, SyntheticMathConfig, SyntheticMathEnv
from .research import TOOL_NAMES as _RESEARCH_TOOLS
from .research import HotpotQAConfig, HotpotQAEnv
from .team import TeamConjunctiveConfig, TeamConjunctiveEnv, TeamSaboteurConfig, TeamSaboteurEnv

__all__ = ["ENV_CONFIGS", "ENV_TOOLS", "Env", "EnvConfig", "build_env", "check_env_state"]

ENV_CONFIGS = (SyntheticMathConfig, GSM8KConfig, HotpotQAConfig, TeamConjunctiveConfig, TeamSaboteurConfig)
EnvConfig = SyntheticMathConfig | GSM8KConfig | HotpotQAConfig | TeamConjunctiveConfig | TeamSaboteurConfig

_BUILDERS: dict[str, Callable[..., Env]] = {
    "synthetic_math": SyntheticMathEnv,
    "gsm8k": GSM8KEnv,
    "hotpotqa": HotpotQAEnv,
    "team_conjunctive": TeamConjunctiveEnv,
    "team_saboteur": TeamSaboteurEnv,
}

# Tools each env offers its agents (an env's ``tools`` mapping holds these names); config
# validation checks every agent's ``tools`` against this, before anything is built.
ENV_TOOLS: dict[str, tuple[str, ...]] = {"synthetic_math": (), "gsm8k": (), "hotpotqa": _RESEARCH_TOOLS,
                                         "team_conjunctive": (), "team_saboteur": ()}


def build_env(cfg: EnvConfig) -> Env:
    """The env for one validated env config, chosen by ``cfg.name``."""
    name = getattr(cfg, "name", None)
    if name not in _BUILDERS:
        raise ValueError(f"unknown env {name!r}; valid choices are {sorted(_BUILDERS)}")
    return _BUILDERS[name](cfg)
