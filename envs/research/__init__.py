"""Research envs: HotpotQA multi-hop questions with BM25 ``search`` and ``read`` tools."""

from .hotpotqa import TOOL_NAMES, HotpotQAConfig, HotpotQAEnv
from .metrics import best_em, best_f1, exact_match, f1_score, normalize_answer, recall_at_k
from .search import Corpus, Paragraph, build_tools

__all__ = [
    "TOOL_NAMES",
    "Corpus",
    "HotpotQAConfig",
    "HotpotQAEnv",
    "Paragraph",
    "best_em",
    "best_f1",
    "build_tools",
    "exact_match",
    "f1_score",
    "normalize_answer",
    "recall_at_k",
]
