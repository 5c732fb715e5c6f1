"""Math envs: synthetic arithmetic chains and GSM8K, with a safe numeric verifier."""

# synthetic_math registers before gsm8k (envs/__init__.py)
from .synthetic import SyntheticMathConfig, SyntheticMathEnv
from .gsm8k import GSM8KConfig, GSM8KEnv
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
