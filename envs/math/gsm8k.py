"""GSM8K grade-school math word problems (Cobbe et al., 2021, arXiv:2110.14168).

Sources:
    sample  the 200 train + 100 test problems shipped in ``data/`` (offline; see data/README.md)
    local   JSONL files of ``{"question", "answer"}`` in the upstream format
    hf      ``datasets.load_dataset(hf_dataset, hf_config)``; ``datasets`` is imported only here

The training split is the train stream: a fresh seeded permutation per epoch, read through an
integer cursor, so every problem is seen once per epoch and a resumed run sees the same order.
The eval split is the held-out set, read in file order. A problem whose question appears in
both splits is a data error and raises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mas.types import Episode, Task

from ..splits import Splits, SplitTasks
from ..jsonl import read_jsonl
from ..registry import register_env
from .verify import gsm8k_final_answer, read_number, score_answer

__all__ = ["GSM8KConfig", "GSM8KEnv", "load_jsonl", "SAMPLE_DIR"]

SAMPLE_DIR = Path(__file__).parent / "data"
_SAMPLE_SPLITS = ("train", "test")


class GSM8KConfig(BaseModel):
    """GSM8K word problems (env section of the run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["gsm8k"] = Field(description="Selects this env.")
    source: Literal["sample", "local", "hf"] = Field(
        default="sample",
        description=(
            "Where problems come from: 'sample' (300 problems shipped with mas), 'local' "
            "(JSONL files at `path`) or 'hf' (Hugging Face datasets; needs mas-rl[data])."
        ),
    )
    path: str | None = Field(
        default=None,
        description=(
            "source='local' only: a directory holding '<split>.jsonl' files (the upstream "
            "grade_school_math/data layout), or a file path containing '{split}', e.g. "
            "'data/gsm8k_{split}.jsonl'. Each line is {\"question\": ..., \"answer\": ...}."
        ),
    )
    hf_dataset: str = Field(default="openai/gsm8k", description="source='hf': dataset id.")
    hf_config: str = Field(default="main", description="source='hf': dataset config name.")
    train_split: str = Field(default="train", description="Split used for training.")
    eval_split: str = Field(default="test", description="Held-out split used for evaluation.")
    seed: int = Field(default=0, ge=0, description="Seed of the per-epoch training shuffle.")
    max_train: int | None = Field(
        default=None, ge=1, description="Keep only the first max_train training problems."
    )
    max_eval: int | None = Field(
        default=None, ge=1, description="Keep only the first max_eval held-out problems."
    )

    @model_validator(mode="after")
    def _check_source(self) -> "GSM8KConfig":
        if self.source == "local" and not self.path:
            raise ValueError(
                "path is required when source='local' (a directory of '<split>.jsonl' files "
                "or a path containing '{split}')"
            )
        if self.source != "local" and self.path is not None:
            raise ValueError(
                f"path is only used with source='local', but source={self.source!r}; "
                "remove path or set source: local"
            )
        if self.source == "sample":
            for field in ("train_split", "eval_split"):
                if getattr(self, field) not in _SAMPLE_SPLITS:
                    raise ValueError(
                        f"{field}={getattr(self, field)!r} is not in the shipped sample; "
                        f"valid choices with source='sample' are {list(_SAMPLE_SPLITS)}"
                    )
        if self.train_split == self.eval_split:
            raise ValueError(
                f"train_split and eval_split are both {self.train_split!r}; "
                "the held-out split must differ from the training split"
            )
        return self


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a malformed line raises ValueError naming the file and line."""
    return read_jsonl(path, _check_row, "GSM8K", "problems")


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise ValueError(f"{where}: missing or empty string field {key!r}")
    try:
        final = gsm8k_final_answer(row["answer"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if read_number(final) is None:
        raise ValueError(f"{where}: final answer {final!r} is not a number")
    return row


def _to_tasks(rows: list[dict[str, Any]], split: str) -> list[Task]:
    return [
        Task(
            task_id=f"gsm8k-{split}-{i}",
            prompt=row["question"],
            answer=gsm8k_final_answer(row["answer"]),
            meta={"solution": row["answer"]},
        )
        for i, row in enumerate(rows)
    ]


def _local_file(path: str, split: str) -> Path:
    if "{split}" in path:
        return Path(path.replace("{split}", split))
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"GSM8K path {path!r} is neither a directory of '<split>.jsonl' files nor a "
            "path containing '{split}'"
        )
    return directory / f"{split}.jsonl"


def _load_hf(dataset: str, config: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets  # heavy; only source='hf' needs it
    except ImportError as e:
        raise ImportError(
            "GSM8K source='hf' needs the 'datasets' package: pip install 'mas-rl[data]'"
        ) from e
    data = datasets.load_dataset(dataset, config, split=split)
    return [_check_row(dict(row), f"{dataset}[{split}] row {i}") for i, row in enumerate(data)]


def _load_split(cfg: GSM8KConfig, split: str) -> list[dict[str, Any]]:
    if cfg.source == "sample":
        return load_jsonl(SAMPLE_DIR / f"gsm8k_{split}_sample.jsonl")
    if cfg.source == "local":
        assert cfg.path is not None  # the config validator guarantees it
        return load_jsonl(_local_file(cfg.path, split))
    return _load_hf(cfg.hf_dataset, cfg.hf_config, split)


class GSM8KEnv(SplitTasks):
    """Env over :class:`GSM8KConfig`; loads both splits eagerly so bad data fails at build time."""

    def __init__(self, cfg: GSM8KConfig) -> None:
        self.cfg = cfg
        train_rows = _load_split(cfg, cfg.train_split)[: cfg.max_train]
        eval_rows = _load_split(cfg, cfg.eval_split)[: cfg.max_eval]
        eval_questions = {row["question"].strip() for row in eval_rows}
        leaked = [i for i, r in enumerate(train_rows) if r["question"].strip() in eval_questions]
        if leaked:
            raise ValueError(
                f"{len(leaked)} {cfg.train_split!r} problems also appear in the held-out split "
                f"{cfg.eval_split!r} (first: train row {leaked[0]}); the splits must be disjoint"
            )
        self._splits = Splits("gsm8k", _to_tasks(train_rows, cfg.train_split), _to_tasks(eval_rows, cfg.eval_split), cfg.seed,
                              f"the {cfg.eval_split!r} split (source={cfg.source!r}, max_eval={cfg.max_eval})")

    # -- Env protocol (tasks: SplitTasks) ----------------------------------------------------

    def score(self, episode: Episode) -> float:
        return score_answer(episode)

    def describe(self) -> dict[str, Any]:
        """Data source and size, for the reporting checklist."""
        c = self.cfg
        where = {"sample": "GSM8K sample shipped with mas", "local": f"GSM8K JSONL at {c.path}",
                 "hf": f"datasets: {c.hf_dataset} ({c.hf_config})"}[c.source]
        return {"name": "gsm8k", "source": where, "train_size": f"{self.num_train} ({c.train_split})",
                "eval_size": f"{self.num_eval} ({c.eval_split})"}


register_env("gsm8k", GSM8KConfig, GSM8KEnv)  # no turn verifier: only the outcome of a GSM8K problem is checkable
