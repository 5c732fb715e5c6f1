"""Tasks, verifiers and tools (docs/architecture.md: envs/).

Every env is registered by name with its config model, its builder and the names of the tools
it offers its agents: its own module calls :func:`register_env` (``registry.py``) when imported,
and registers its turn verifier, if it has one, beside it.  Adding an env is one module plus
that call, and an import of the module in its folder's package (below, for a new folder).
``env_configs()`` lists the config models; the run config builds the ``env`` section as
``Annotated[Union[env_configs()], Field(discriminator="name")]``, so an unknown name is an error
that lists every registered env.  ``build_env`` turns one of those configs into an :class:`Env`.
Importing this package is cheap: heavy dependencies (``datasets``) are imported only by the env
that needs them, when it is built.

Third-party packages add envs through the ``mas.envs`` entry-point group (``mas/config/plugins.py``):
the entry point names a module that calls :func:`register_env` when imported.

Turn verifiers (``verifiers.py``): the built-in envs check their turns' own jobs; each built-in
verifier is also registered under its env's name, so a config can name one explicitly
(``verifier: {name: synthetic_math}``), and packages add more through ``mas.verifiers``.
"""

from __future__ import annotations

from typing import Union

from .base import Env, check_env_state
from .registry import ENV_TOOLS, build_env, env_configs, env_names, register_env

# The built-in envs register themselves on import, in this order, which env_configs() keeps (the
# schema's union and its error messages list them so): synthetic_math and gsm8k, hotpotqa and
# facts, the team tasks, custom.  Each package's __init__ imports its modules in that order.
from .math import GSM8KConfig, GSM8KEnv, SyntheticMathConfig, SyntheticMathEnv
from .research import FactsConfig, FactsEnv, HotpotQAConfig, HotpotQAEnv
from .team import (TeamConjunctiveConfig, TeamConjunctiveEnv, TeamForkConfig, TeamForkEnv,
                   TeamRelayConfig, TeamRelayEnv, TeamSaboteurConfig, TeamSaboteurEnv)
from .custom import CustomEnv, CustomEnvConfig

__all__ = ["ENV_CONFIGS", "ENV_TOOLS", "Env", "EnvConfig", "build_env", "check_env_state", "env_configs", "env_names",
           "register_env"]

ENV_CONFIGS = env_configs()  # the built-in envs' config models (plugins register later)
EnvConfig = Union[ENV_CONFIGS]  # type: ignore[valid-type]
