"""BM25 recall@k of HotpotQA's supporting paragraphs when the query is the plain question.

How hard is the research task before any agent does anything clever?  For each question the
question text itself is sent to ``search`` over the corpus the env builds (the union of the
candidate paragraphs of every loaded question), and recall@k is the fraction of its two
supporting paragraphs among the top k.  "both@k" is the share of questions with both found.

    python bench/retrieval_recall.py                      # the shipped 200-question sample
    python bench/retrieval_recall.py --path FILE.jsonl    # any local file (IRCoT or HotpotQA format)
"""

from __future__ import annotations

import argparse
import statistics
import time

from mas.envs.research import Corpus, Paragraph, recall_at_k
from mas.envs.research.hotpotqa import SAMPLE_DIR, load_questions


def retrieval_recall(rows: list[dict], ks: list[int]) -> dict[str, float]:
    """Mean recall@k and the share of questions with every supporting paragraph in the top k."""
    corpus = Corpus(Paragraph(p["title"], p["text"]) for r in rows for p in r["paragraphs"])
    out: dict[str, float] = {"questions": len(rows), "paragraphs": len(corpus)}
    top = max(ks)
    ranked = [(corpus.search_titles(r["question"], top), [p["title"] for p in r["paragraphs"] if p["supporting"]]) for r in rows]
    for k in ks:
        recalls = [recall_at_k(got, gold, k) for got, gold in ranked]
        out[f"recall@{k}"] = statistics.fmean(recalls)
        out[f"both@{k}"] = statistics.fmean(float(r == 1.0) for r in recalls)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", help="a JSONL file of questions (default: the shipped train + validation sample)")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 5, 10])
    args = ap.parse_args()
    if args.path:
        rows, source = load_questions(args.path), args.path
    else:
        rows = load_questions(SAMPLE_DIR / "hotpotqa_train_sample.jsonl") + load_questions(SAMPLE_DIR / "hotpotqa_validation_sample.jsonl")
        source = "shipped sample (train + validation)"
    t0 = time.perf_counter()
    res = retrieval_recall(rows, args.ks)
    wall = time.perf_counter() - t0
    print(f"BM25 (bm25s) over {res['paragraphs']} paragraphs, {res['questions']} questions of {source}; query = the question; {wall:.2f} s")
    print("| k | recall@k | both supporting in top k |")
    print("|---|---|---|")
    for k in args.ks:
        print(f"| {k} | {res[f'recall@{k}']:.3f} | {res[f'both@{k}']:.3f} |")


if __name__ == "__main__":
    main()
