"""Shared base for credit-method configs.

Every credit method has its own pydantic config class deriving from ``CreditConfigBase``
with a field ``method: Literal["<registered name>"]``. The run config holds
``credit: credit_config_union()`` (see ``registry.py``), so pydantic picks the class from
the ``method`` tag, rejects unknown methods with the list of valid tags, rejects unknown
keys (``extra="forbid"``) and freezes the result (``frozen=True``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class CreditConfigBase(BaseModel):
    """Base of every credit-method config: unknown keys are errors; configs are immutable.

    Subclasses must declare ``method: Literal["<name>"]`` (checked by ``register_credit``)
    and document every field with ``Field(description=...)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
