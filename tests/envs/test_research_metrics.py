"""EM, F1 and recall@k against hand-computed examples."""

from __future__ import annotations

import pytest

from mas.envs.research.metrics import best_em, best_f1, exact_match, f1_score, normalize_answer, recall_at_k


@pytest.mark.parametrize(
    "raw,normalised",
    [
        ("The Chief of Protocol.", "chief of protocol"),  # case, article, punctuation
        ("  an   apple, a pear  ", "apple pear"),  # articles dropped, whitespace collapsed
        ("Theatre", "theatre"),  # 'the' only as a whole word
        ("Greenwich Village, New York City", "greenwich village new york city"),
        ("U.S.A.", "usa"),  # punctuation is removed, not replaced by spaces
    ],
)
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_exact_match_after_normalisation():
    assert exact_match("the Chief of Protocol!", "Chief of Protocol") == 1.0
    assert exact_match("Chief Protocol", "Chief of Protocol") == 0.0


def test_f1_hand_computed():
    # pred tokens [chief, protocol, officer], gold [chief, of, protocol]: common = 2
    # precision 2/3, recall 2/3 -> F1 = 2/3
    assert f1_score("Chief Protocol officer", "Chief of Protocol") == pytest.approx(2 / 3)
    # pred [new, york] vs gold [greenwich, village, new, york, city]: P = 2/2, R = 2/5
    # F1 = 2 * 1 * 0.4 / 1.4 = 4/7
    assert f1_score("New York", "Greenwich Village, New York City") == pytest.approx(4 / 7)
    # tokens are a multiset: pred [a, a] -> after normalisation 'a' is an article: [] -> 0
    assert f1_score("a a", "a") == 0.0
    # repeated tokens count once per occurrence: pred [x, x, y], gold [x, y]: common = min(2,1)+1 = 2
    # P = 2/3, R = 1 -> F1 = 0.8
    assert f1_score("x x y", "x y") == pytest.approx(0.8)
    assert f1_score("", "anything") == 0.0


def test_yes_no_answers_get_no_partial_credit():
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("yes it is", "yes") == 0.0  # HotpotQA rule: a yes/no gold matches only exactly
    assert f1_score("no", "no way") == 0.0


def test_best_over_several_gold_answers():
    golds = ["Animorphs", "the Animorphs series"]
    assert best_em("animorphs", golds) == 1.0
    # vs gold 2 normalised [animorphs, series]: pred [animorphs, books] P 1/2 R 1/2 -> 1/2; vs gold 1: P 1/2 R 1 -> 2/3
    assert best_f1("Animorphs books", golds) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no gold"):
        best_em("x", [])


def test_recall_at_k_hand_computed():
    retrieved = ["A", "X", "B", "Y", "A"]
    relevant = {"A", "B"}
    assert recall_at_k(retrieved, relevant, 1) == 0.5  # A
    assert recall_at_k(retrieved, relevant, 2) == 0.5  # A, X
    assert recall_at_k(retrieved, relevant, 3) == 1.0  # A, X, B
    assert recall_at_k(retrieved, relevant, 10) == 1.0  # k beyond the list
    assert recall_at_k(["A", "A"], relevant, 2) == 0.5  # a duplicate does not count twice
    with pytest.raises(ValueError):
        recall_at_k(retrieved, set(), 2)
    with pytest.raises(ValueError):
        recall_at_k(retrieved, relevant, 0)
