"""Credit assignment: the registry and one module per method.

Importing ``mas.credit`` imports every module of this package, which registers every built-in
method (one module per method; helpers shared by several methods live in their own modules).
A credit pipeline is a method plus a normaliser, named in YAML, e.g.
``credit: {method: dr_mas, normaliser: global}``: the method computes raw scores, the
normaliser (none, group, global or agent; ``normalise.py``) turns them into advantages.
Most method configs have ``normaliser`` with the method's own default (grpo and dr_grpo:
group, rloo: none, dr_mas: agent, ...); m_grpo and reinforce_pp build their normalisation
into the method.  See docs/credit.md for every method's keys.
"""

import importlib
import pkgutil

from . import normalise, registry  # noqa: F401  (registry first: method modules register into it)
from .base import CreditConfigBase
from .batch import build_credit_batch
from .registry import (
    CreditMethod,
    NonFiniteCreditError,
    UnknownCreditMethodError,
    credit_config_union,
    credit_names,
    get_credit,
    plan_credit,
    register_credit,
    run_credit,
)

# Every other module of this package is a method (or its helpers) and registers on import.
_INFRA = {"base", "batch", "normalise", "registry"}
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod not in _INFRA:
        importlib.import_module(f"{__name__}.{_mod}")

__all__ = [
    "CreditConfigBase",
    "CreditMethod",
    "NonFiniteCreditError",
    "UnknownCreditMethodError",
    "build_credit_batch",
    "credit_config_union",
    "credit_names",
    "get_credit",
    "plan_credit",
    "register_credit",
    "run_credit",
]
