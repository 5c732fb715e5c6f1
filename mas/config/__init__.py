"""The config: what a team YAML may say (``schema``), the checks across its sections (``crossrefs``),
how its problems are written (``messages``), reading, overriding and validating it (``loading``),
what it means (``checks``), the defaults a policy's model implies (``defaults``), the safe YAML
reader, ``module:attr`` references and the plugins that extend the choices.

``from mas.config import load_config, ConfigError, RunConfig, ...`` reads the schema's names (and,
through the schema, those that moved from it to ``loading``, ``messages`` and ``crossrefs``); they
are looked up on first use, so importing a low module of this folder (``mas.config.safe_yaml``)
does not build the schema.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    # import_module, not ``from mas.config import schema``: that form asks this package for the
    # attribute ``schema`` first, which lands here again before the submodule is imported
    schema = importlib.import_module("mas.config.schema")

    try:
        return getattr(schema, name)
    except AttributeError:
        raise AttributeError(f"module 'mas.config' has no attribute {name!r}") from None
