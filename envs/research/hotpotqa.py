"""HotpotQA multi-hop questions answered with a BM25 search tool (Yang et al. 2018, arXiv:1809.09600).

Sources:
    sample  150 training + 50 held-out questions shipped in ``data/`` (offline; see data/README.md)
    local   JSONL files, one question per line, in IRCoT's format (``question_id``,
            ``question_text``, ``answers_objects[].spans``, ``contexts[]`` with ``title``,
            ``paragraph_text``, ``is_supporting``) or in HotpotQA's own (``id``, ``question``,
            ``answer``, ``supporting_facts``, ``context``; the lists of the original JSON
            or the columns of the ``datasets`` version)
    hf      ``datasets.load_dataset(hf_dataset, hf_config)`` (``hotpotqa/hotpot_qa``,
            ``distractor``); ``datasets`` is imported only here (extra ``mas-rl[data]``)

The agents see only the question.  The candidate paragraphs of every loaded question form
one corpus (``search.Corpus``), reached through the ``search`` and ``read`` tools.

Reward: ``reward: f1`` (default) or ``em`` of the team's answer against the closest gold
answer, with the SQuAD/HotpotQA normalisation (``metrics.py``).  ``score`` also records
both on ``episode.info["scores"]`` for evaluation reports.

The training stream is a fresh seeded permutation per epoch read through an integer cursor
(as GSM8K), the held-out split is read in file order, and a question in both splits raises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mas.types import Episode, Task, Turn

from ..splits import Splits, SplitTasks
from ..jsonl import read_jsonl
from .metrics import answer_scores
from ..registry import register_env
from ..verifiers import register_verifier
from .search import TOOL_NAMES, Corpus, Paragraph, build_tools
from .turns import verify_search_turn

__all__ = ["HotpotQAConfig", "HotpotQAEnv", "SAMPLE_DIR", "TOOL_NAMES", "load_questions", "normalise_row"]

SAMPLE_DIR = Path(__file__).parent / "data"
_SAMPLE_SPLITS = ("train", "validation")


class HotpotQAConfig(BaseModel):
    """HotpotQA with search and read tools (env section of the run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["hotpotqa"] = Field(description="Selects this env.")
    source: Literal["sample", "local", "hf"] = Field(
        "sample",
        description="Where questions come from: 'sample' (200 shipped with mas), 'local' (JSONL at `path`) "
        "or 'hf' (Hugging Face datasets; needs mas-rl[data]).",
    )
    path: str | None = Field(
        None,
        description="source='local' only: a directory of '<split>.jsonl' files, a path containing '{split}', "
        "or one .jsonl file whose last `holdout` questions form the held-out split.",
    )
    holdout: int | None = Field(
        None, ge=1, description="With `path` a single file: hold out its last N questions for evaluation (train on the rest)."
    )
    hf_dataset: str = Field("hotpotqa/hotpot_qa", description="source='hf': dataset id.")
    hf_config: str = Field("distractor", description="source='hf': dataset config (each question with 10 candidate paragraphs).")
    train_split: str = Field("train", description="Split used for training.")
    eval_split: str = Field("validation", description="Held-out split used for evaluation.")
    seed: int = Field(0, ge=0, description="Seed of the per-epoch training shuffle.")
    max_train: int | None = Field(None, ge=1, description="Keep only the first max_train training questions.")
    max_eval: int | None = Field(None, ge=1, description="Keep only the first max_eval held-out questions.")
    reward: Literal["f1", "em"] = Field("f1", description="Outcome reward: answer F1 or exact match against the gold answer.")
    search_k: int = Field(3, ge=1, description="Results of a search call that gives no k.")
    max_k: int = Field(10, ge=1, description="Largest k a search call may ask for.")
    snippet_chars: int = Field(200, ge=20, description="Characters of each paragraph shown in search results.")
    read_chars: int = Field(1500, ge=50, description="Characters of a paragraph returned by read.")

    @model_validator(mode="after")
    def _check(self) -> "HotpotQAConfig":
        if self.source == "local" and not self.path:
            raise ValueError("path is required when source='local' (a directory of '<split>.jsonl', a path with '{split}', or one .jsonl file with holdout)")
        if self.source != "local" and self.path is not None:
            raise ValueError(f"path is only used with source='local', but source={self.source!r}; remove path or set source: local")
        if self.holdout is not None and (self.source != "local" or (self.path or "").find("{split}") != -1):
            raise ValueError("holdout splits one local file; it needs source='local' and a path without '{split}'")
        if self.source == "sample":
            for field in ("train_split", "eval_split"):
                if getattr(self, field) not in _SAMPLE_SPLITS:
                    raise ValueError(f"{field}={getattr(self, field)!r} is not in the shipped sample; valid with source='sample': {list(_SAMPLE_SPLITS)}")
        if self.train_split == self.eval_split and self.holdout is None:
            raise ValueError(f"train_split and eval_split are both {self.train_split!r}; the held-out split must differ")
        if self.search_k > self.max_k:
            raise ValueError(f"search_k={self.search_k} is larger than max_k={self.max_k}")
        return self


# ------------------------------------------------------------------------------------------
# data: every source is normalised to {"id", "question", "answers", "paragraphs"}
# ------------------------------------------------------------------------------------------


def normalise_row(row: Any, where: str) -> dict[str, Any]:
    """One question in the internal form; a malformed row raises ValueError naming ``where``.

    Internal form: ``id`` str, ``question`` str, ``answers`` list of str (first = canonical),
    ``paragraphs`` list of (title, text, supporting) dicts.
    """
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    try:
        if "question_text" in row:  # IRCoT
            answers = [s for a in row["answers_objects"] for s in a["spans"]]
            paragraphs = [{"title": c["title"], "text": c["paragraph_text"], "supporting": bool(c["is_supporting"])}
                          for c in row["contexts"]]
            out = {"id": str(row["question_id"]), "question": row["question_text"], "answers": answers, "paragraphs": paragraphs}
        elif "question" in row:  # HotpotQA's JSON (lists of pairs) or its datasets columns (dict of lists)
            ctx, sup = row["context"], row["supporting_facts"]
            pairs = list(zip(ctx["title"], ctx["sentences"])) if isinstance(ctx, dict) else [tuple(c) for c in ctx]
            support = set(sup["title"]) if isinstance(sup, dict) else {s[0] for s in sup}
            paragraphs = [{"title": t, "text": "".join(sents).strip(), "supporting": t in support} for t, sents in pairs]
            out = {"id": str(row.get("id", row.get("_id"))), "question": row["question"], "answers": [row["answer"]],
                   "paragraphs": paragraphs}
        else:
            raise ValueError("neither 'question_text' (IRCoT format) nor 'question' (HotpotQA format) found")
    except (KeyError, TypeError, ValueError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise ValueError(f"{where}: not a HotpotQA question ({detail})") from None
    if not isinstance(out["question"], str) or not out["question"].strip():
        raise ValueError(f"{where}: empty question")
    if not out["answers"] or not all(isinstance(a, str) and a.strip() for a in out["answers"]):
        raise ValueError(f"{where}: no gold answer")
    if not out["paragraphs"]:
        raise ValueError(f"{where}: no candidate paragraphs")
    return out


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """Questions of a JSONL file; a malformed line raises ValueError naming the file and line."""
    return read_jsonl(path, normalise_row, "HotpotQA", "questions")


def _load_hf(dataset: str, config: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets  # heavy; only source='hf' needs it
    except ImportError as e:
        raise ImportError("HotpotQA source='hf' needs the 'datasets' package: pip install 'mas-rl[data]'") from e
    data = datasets.load_dataset(dataset, config, split=split)
    return [normalise_row(dict(row), f"{dataset}[{split}] row {i}") for i, row in enumerate(data)]


def _load_splits(cfg: HotpotQAConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if cfg.source == "sample":
        return (load_questions(SAMPLE_DIR / f"hotpotqa_{cfg.train_split}_sample.jsonl"),
                load_questions(SAMPLE_DIR / f"hotpotqa_{cfg.eval_split}_sample.jsonl"))
    if cfg.source == "hf":
        return _load_hf(cfg.hf_dataset, cfg.hf_config, cfg.train_split), _load_hf(cfg.hf_dataset, cfg.hf_config, cfg.eval_split)
    assert cfg.path is not None  # the config validator guarantees it
    if "{split}" in cfg.path:
        return load_questions(cfg.path.replace("{split}", cfg.train_split)), load_questions(cfg.path.replace("{split}", cfg.eval_split))
    path = Path(cfg.path)
    if path.is_dir():
        if cfg.holdout is not None:
            raise ValueError(f"holdout splits one file, but path {cfg.path!r} is a directory")
        return load_questions(path / f"{cfg.train_split}.jsonl"), load_questions(path / f"{cfg.eval_split}.jsonl")
    if cfg.holdout is None:
        raise ValueError(f"path {cfg.path!r} is a single file: set holdout (questions kept for evaluation), "
                         "or give a directory of '<split>.jsonl' files or a path with '{split}'")
    rows = load_questions(path)
    if cfg.holdout >= len(rows):
        raise ValueError(f"holdout={cfg.holdout} leaves no training questions: {path} has {len(rows)}")
    return rows[: -cfg.holdout], rows[-cfg.holdout :]


def _to_tasks(rows: list[dict[str, Any]], split: str) -> list[Task]:
    return [
        Task(
            task_id=f"hotpotqa-{split}-{row['id']}",
            prompt=row["question"],
            answer=row["answers"][0],
            meta={"answers": list(row["answers"]),
                  "supporting": [p["title"] for p in row["paragraphs"] if p["supporting"]]},
        )
        for row in rows
    ]


class HotpotQAEnv(SplitTasks):
    """Env over :class:`HotpotQAConfig`; loads both splits and indexes the corpus at build time."""

    def __init__(self, cfg: HotpotQAConfig) -> None:
        self.cfg = cfg
        train_rows, eval_rows = _load_splits(cfg)
        train_rows, eval_rows = train_rows[: cfg.max_train], eval_rows[: cfg.max_eval]
        held_out = {r["question"].strip() for r in eval_rows}
        leaked = [i for i, r in enumerate(train_rows) if r["question"].strip() in held_out]
        if leaked:
            raise ValueError(f"{len(leaked)} training questions also appear in the held-out split "
                             f"(first: train row {leaked[0]}); the splits must be disjoint")
        self.corpus = Corpus(Paragraph(p["title"], p["text"]) for r in train_rows + eval_rows for p in r["paragraphs"])
        self.tools = build_tools(self.corpus, cfg.search_k, cfg.max_k, cfg.snippet_chars, cfg.read_chars)
        self._splits = Splits("hotpotqa", _to_tasks(train_rows, cfg.train_split), _to_tasks(eval_rows, cfg.eval_split), cfg.seed,
                              f"the {cfg.eval_split!r} split (source={cfg.source!r}, max_eval={cfg.max_eval})")

    # -- Env protocol (tasks: SplitTasks) ----------------------------------------------------

    def score(self, episode: Episode) -> float:
        """``reward`` (F1 or EM) of the team answer; both are recorded on ``episode.info["scores"]``."""
        scores = answer_scores(episode.answer, episode.task.meta["answers"])
        episode.info["scores"] = scores
        return scores[self.cfg.reward]

    def verify_turn(self, episode: Episode, turn: Turn) -> float | None:
        """A search or read turn: did it reach a supporting paragraph (``envs/research/turns.py``)."""
        return verify_search_turn(episode, turn)

    def describe(self) -> dict[str, Any]:
        """Data source and size, for the reporting checklist."""
        c = self.cfg
        where = {"sample": "HotpotQA sample shipped with mas (200 dev questions, CC BY-SA 4.0)",
                 "local": f"HotpotQA JSONL at {c.path}", "hf": f"datasets: {c.hf_dataset} ({c.hf_config})"}.get(c.source, c.source)
        return {"name": "hotpotqa", "source": where, "train_size": f"{self.num_train} questions ({c.train_split})",
                "eval_size": f"{self.num_eval} questions ({c.eval_split})",
                "corpus": f"{len(self.corpus)} paragraphs (BM25), reward {c.reward}"}


register_env("hotpotqa", HotpotQAConfig, HotpotQAEnv, tools=TOOL_NAMES)
register_verifier("hotpotqa", verify_search_turn)
