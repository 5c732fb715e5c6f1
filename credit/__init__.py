"""Credit assignment: the registry and one module per method.

Importing ``mas.credit`` registers every built-in method (grpo, dr_grpo, rloo, dr_mas).
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
