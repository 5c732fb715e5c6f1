"""The research corpus, its BM25 index and the ``search`` / ``read`` tools.

Corpus: the union of the candidate paragraphs of every loaded question (training and
held-out), one document per title (HotpotQA titles are Wikipedia article titles, so a
title names one paragraph; if a title comes back with another text, the first one is
kept and the rest are counted in ``Corpus.conflicts``).  A document is indexed as
``title + ". " + text``.  The corpus holds no answers or labels; including the held-out
questions' paragraphs is the open-domain setting (the agents must find them among all the
others), as in IRCoT's HotpotQA subsample.

BM25 library: ``bm25s`` (Lù 2024, arXiv:2407.03618).  Chosen because it is maintained,
depends only on numpy (no Java, unlike pyserini; no per-query Python loop over the corpus,
unlike rank-bm25, whose last release was in 2022), indexes a few thousand paragraphs in
milliseconds and the full HotpotQA corpus in minutes, and scores with the Lucene BM25
variant by default, the one of the IR baselines HotpotQA results are usually compared
with.  Tokenisation is bm25s's: lower-cased ``\\w\\w+`` tokens minus English stop words,
no stemming (a stemmer would add a compiled dependency for a small recall change).

Tools (see ``agents.tools`` for the call format):

    search(query, k=3)  the k best paragraphs for the query: their titles and opening
                        characters (``snippet_chars``); documents that share no term with
                        the query are not returned
    read(title)         the paragraph with that title (up to ``read_chars``); the title is
                        matched exactly, then ignoring case, quotes and extra spaces; an
                        unknown title is a ToolError that suggests the closest titles
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mas.tools import ToolError, ToolParam, ToolSpec

__all__ = ["Corpus", "Paragraph", "TOOL_NAMES", "build_tools"]

TOOL_NAMES = ("search", "read")  # the tools build_tools makes: what a research env offers its agents


@dataclass(frozen=True)
class Paragraph:
    title: str
    text: str


def _title_key(title: str) -> str:
    return " ".join(title.replace('"', "").replace("'", "").casefold().split())


class Corpus:
    """Deduplicated paragraphs with a BM25 index over ``title. text``."""

    def __init__(self, paragraphs: Iterable[Paragraph]):
        import bm25s  # imported here so that configs and the CLI load without it

        self.paragraphs: list[Paragraph] = []
        self._by_title: dict[str, int] = {}
        self._by_key: dict[str, int] = {}
        self.conflicts = 0
        for p in paragraphs:
            if p.title in self._by_title:
                self.conflicts += self.paragraphs[self._by_title[p.title]].text != p.text
                continue
            self._by_title[p.title] = len(self.paragraphs)
            self._by_key.setdefault(_title_key(p.title), len(self.paragraphs))
            self.paragraphs.append(p)
        if not self.paragraphs:
            raise ValueError("the corpus is empty: no candidate paragraphs were loaded")
        self._bm25s = bm25s
        self._index = bm25s.BM25()
        tokens = bm25s.tokenize([f"{p.title}. {p.text}" for p in self.paragraphs], stopwords="en", show_progress=False)
        self._index.index(tokens, show_progress=False)

    def __len__(self) -> int:
        return len(self.paragraphs)

    def search(self, query: str, k: int) -> list[tuple[Paragraph, float]]:
        """The (at most) k best-scoring paragraphs with a positive BM25 score, best first."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        query_tokens = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not query_tokens[0]:
            return []
        k = min(k, len(self.paragraphs))
        docs, scores = self._index.retrieve(query_tokens, k=k, show_progress=False, n_threads=1)
        out = [(self.paragraphs[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0 and np.isfinite(s)]
        return out

    def search_titles(self, query: str, k: int) -> list[str]:
        return [p.title for p, _ in self.search(query, k)]

    def get(self, title: str) -> Paragraph | None:
        """The paragraph titled ``title``: exact match, else ignoring case, quotes and spaces."""
        i = self._by_title.get(title)
        if i is None:
            i = self._by_key.get(_title_key(title))
        return None if i is None else self.paragraphs[i]

    def closest_titles(self, title: str, n: int = 3) -> list[str]:
        keys = difflib.get_close_matches(_title_key(title), list(self._by_key), n=n, cutoff=0.5)
        return [self.paragraphs[self._by_key[k]].title for k in keys]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit].rstrip() + " ..."


def build_tools(corpus: Corpus, default_k: int, max_k: int, snippet_chars: int, read_chars: int,
                what: str = "the Wikipedia paragraphs", examples: tuple[str, str] = ("Kiss and Tell 1945 film cast", "Shirley Temple"),
                ) -> dict[str, ToolSpec]:
    """The ``search`` and ``read`` tools over ``corpus``; ``what`` names the corpus in the search tool's
    description and ``examples`` are the (query, title) shown in the prompt's example calls."""

    def search(query: str, k: int = default_k) -> str:
        if not 1 <= k <= max_k:
            raise ToolError(f"k must be between 1 and {max_k}, found {k}")
        hits = corpus.search(query, k)
        if not hits:
            return f'search("{query}"): no paragraph matches these words; try other keywords.'
        lines = [f'search("{query}", k={k}): {len(hits)} result(s)']
        lines += [f"{i}. {p.title}: {_cut(p.text, snippet_chars)}" for i, (p, _) in enumerate(hits, 1)]
        return "\n".join(lines)

    def read(title: str) -> str:
        p = corpus.get(title)
        if p is None:
            near = corpus.closest_titles(title)
            hint = f"; closest titles: {', '.join(near)}" if near else "; use search to find titles"
            raise ToolError(f"no paragraph titled {title!r}{hint}")
        return f"{p.title}: {_cut(p.text, read_chars)}"

    return {
        "search": ToolSpec(
            "search",
            f"BM25 search over {what}; returns the titles and opening words of the k best matches (k at most {max_k}).",
            (ToolParam("query", "str", "keywords to search for", example=examples[0]),
             ToolParam("k", "int", "number of results", required=False, default=default_k, example=3)),
            search,
        ),
        "read": ToolSpec(
            "read",
            "the whole paragraph with this title (a title from the search results).",
            (ToolParam("title", "str", "exact title of a paragraph", example=examples[1]),),
            read,
        ),
    }
