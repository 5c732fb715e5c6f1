"""Research envs with BM25 ``search`` and ``read`` tools: HotpotQA multi-hop questions, and ``facts``,
generated two-hop questions about fictional people a small model can learn (``facts.py``)."""

# hotpotqa registers before facts (envs/__init__.py)
from .hotpotqa import TOOL_NAMES, HotpotQAConfig, HotpotQAEnv
from .facts import FactsConfig, FactsEnv, generate_world
from .metrics import best_em, best_f1, exact_match, f1_score, normalize_answer, recall_at_k
from .search import Corpus, Paragraph, build_tools

__all__ = [
    "TOOL_NAMES",
    "Corpus",
    "FactsConfig",
    "FactsEnv",
    "HotpotQAConfig",
    "HotpotQAEnv",
    "Paragraph",
    "best_em",
    "best_f1",
    "build_tools",
    "exact_match",
    "f1_score",
    "generate_world",
    "normalize_answer",
    "recall_at_k",
]
