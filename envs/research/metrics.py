"""Answer and retrieval metrics for open-domain QA (HotpotQA).

Answer metrics follow the normalisation of the official SQuAD v1.1 / HotpotQA evaluation
scripts (Rajpurkar et al. 2016, arXiv:1606.05250; Yang et al. 2018, arXiv:1809.09600):

    normalize_answer(s) = collapse whitespace(drop articles a/an/the(drop punctuation(lower(s))))

* exact match (EM): 1.0 if the normalised strings are equal, else 0.0;
* F1: harmonic mean of token precision and recall between the normalised strings, with
  tokens counted as a multiset.  As in the HotpotQA script, when either side normalises to
  ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0 (a yes/no answer shares no
  partial credit with anything else).

A question may have several gold answers; ``best_em`` / ``best_f1`` take the maximum.

Retrieval: ``recall_at_k`` is the fraction of the relevant items (HotpotQA's two supporting
paragraphs) found among the first k retrieved ones.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

__all__ = ["normalize_answer", "exact_match", "f1_score", "best_em", "best_f1", "answer_scores", "recall_at_k"]

_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_DROP_PUNCTUATION)  # one C-level pass (model answers may be megabytes)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def _best(metric, prediction: str, golds: Iterable[str]) -> float:
    golds = list(golds)
    if not golds:
        raise ValueError("no gold answers given")
    return max(metric(prediction, g) for g in golds)


def best_em(prediction: str, golds: Iterable[str]) -> float:
    """Exact match against the closest of several gold answers."""
    return _best(exact_match, prediction, golds)


def best_f1(prediction: str, golds: Iterable[str]) -> float:
    """F1 against the closest of several gold answers."""
    return _best(f1_score, prediction, golds)


def recall_at_k(retrieved: Sequence[str], relevant: Collection[str], k: int) -> float:
    """|relevant ∩ retrieved[:k]| / |relevant| (duplicates in ``retrieved`` count once)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    relevant = set(relevant)
    if not relevant:
        raise ValueError("recall is undefined without relevant items")
    return len(relevant & set(retrieved[:k])) / len(relevant)


def answer_scores(answer: str | None, golds: Sequence[str]) -> dict[str, float]:
    """EM and F1 of a team's answer against its gold answers (both 0 without an answer)."""
    if answer is None:
        return {"em": 0.0, "f1": 0.0}
    return {"em": best_em(answer, golds), "f1": best_f1(answer, golds)}
