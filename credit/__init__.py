"""Credit assignment: the registry and one module per method.

Importing ``mas.credit`` registers every built-in method (grpo, dr_grpo, rloo, dr_mas).
A credit pipeline is a method plus a normaliser, named in YAML, e.g.
``credit: {method: dr_mas, normaliser: global}``: the method computes raw scores, the
normaliser (none, group, global or agent; ``normalise.py``) turns them into advantages.
Each method config has ``normaliser`` with the method's own default (grpo and dr_grpo:
group, rloo: none, dr_mas: agent), plus ``scale_by_std`` (not dr_grpo, which only
centres) and ``eps``.
"""

from . import normalise, registry  # noqa: F401  (registry first: method modules register into it)
from . import baselines, dr_mas  # noqa: F401  (import for registration)
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
