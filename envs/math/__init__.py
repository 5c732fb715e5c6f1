"""Math envs: synthetic arithmetic chains and GSM8K, with a safe numeric verifier."""

from .gsm8k import GSM8KConfig, GSM8KEnv
from .synthetic import SyntheticMathConfig, SyntheticMathEnv
from .verify import extract_number, gsm8k_final_answer, numbers_match

__all__ = [
    "GSM8KConfig",
    "GSM8KEnv",
    "SyntheticMathConfig",
    "SyntheticMathEnv",
    "extract_number",
    "gsm8k_final_answer",
    "numbers_match",
]
