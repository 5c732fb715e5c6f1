"""Your own tasks and reward, without forking mas: ``env: {name: custom, ...}``.

Tasks come from a JSONL file (one ``{"prompt": ..., "answer": ...}`` object per line; other keys
are kept in ``Task.meta``) or from a function ``"pkg.mod:load"`` that returns such dicts (or
``mas.types.Task`` objects).  The held-out split is ``eval_tasks`` (another file or function)
or, without one, a fixed share of ``tasks`` chosen by a stable hash of each task's id, so the
split does not depend on the file's order or the seed.  Training tasks are read through the
shared per-epoch shuffled stream (``envs/splits.py``), so a resumed run sees the same order.

The reward is your function ``"pkg.mod:score"``, called as ``score(task, answer, episode)``
with the ``Task``, the team's answer (a string, or None) and the whole ``Episode`` (turns,
tool calls, status).  It returns a float, or a dict with ``"reward"`` and any other named
scores (kept on ``episode.info["scores"]`` and averaged by evaluation, as HotpotQA's em and
f1).  A reward function that raises, returns NaN/inf or something else marks that episode
failed with the reason; it is scored 0 and the step goes on, as for the built-in envs.

References are imported with the current directory first on ``sys.path`` (``mas/refs.py``);
relative file paths are read from the current directory.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mas.refs import RefError, check_ref_syntax, import_ref
from mas.types import Episode, Task

from .jsonl import read_jsonl
from .registry import register_env
from .splits import Splits

__all__ = ["CustomEnv", "CustomEnvConfig", "RewardError"]


class RewardError(RuntimeError):
    """The reward function failed on an episode (raised, or returned a bad value)."""


class CustomEnvConfig(BaseModel):
    """Your tasks and your reward function (env section of the run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["custom"] = Field(description="Selects this env.")
    tasks: str = Field(description="Training tasks: a JSONL file (one JSON object per line) or 'pkg.mod:load', a function "
                       "returning a list of such objects (or mas Tasks).")
    reward: str = Field(description="'pkg.mod:score': score(task, answer, episode) -> float, or a dict with 'reward' "
                        "and other named scores.")
    eval_tasks: str | None = Field(None, description="Held-out tasks (a JSONL file or 'pkg.mod:load'); None = hold out "
                                   "heldout_fraction of tasks.")
    heldout_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="Without eval_tasks: the share of tasks held out "
                                    "for evaluation (at least one task), chosen by a stable hash of the task id.")
    prompt_key: str = Field("prompt", description="Key of the question each agent team gets.")
    answer_key: str = Field("answer", description="Key of the reference answer (optional in the data: '' when absent).")
    id_key: str = Field("id", description="Key of the task id (optional: the line number or position when absent).")
    seed: int = Field(0, ge=0, description="Seed of the per-epoch training shuffle.")

    @field_validator("reward")
    @classmethod
    def _reward_ref(cls, v: str) -> str:
        check_ref_syntax(v)
        return v

    @field_validator("tasks", "eval_tasks")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("give a JSONL file or 'pkg.mod:load'")
        return v


def _is_ref(source: str) -> bool:
    return ":" in source and not Path(source).exists() and not source.endswith((".jsonl", ".json"))


def load_tasks(source: str, cfg: CustomEnvConfig, what: str) -> list[Task]:
    """Tasks from a JSONL file or a loader function; each row must have the prompt key."""

    def check(row: Any, where: str, default_id: str) -> Task:
        if isinstance(row, Task):
            return row
        if not isinstance(row, dict):
            raise ValueError(f"{where}: a task must be a JSON object, found {type(row).__name__}")
        if not isinstance(row.get(cfg.prompt_key), str) or not row[cfg.prompt_key].strip():
            raise ValueError(f"{where}: no {cfg.prompt_key!r} string (env.prompt_key); keys: {sorted(row)}")
        meta = {k: v for k, v in row.items() if k not in (cfg.prompt_key, cfg.answer_key, cfg.id_key)}
        return Task(task_id=str(row.get(cfg.id_key, default_id)), prompt=row[cfg.prompt_key],
                    answer=str(row.get(cfg.answer_key, "")), meta=meta)

    if _is_ref(source):
        try:
            rows = list(import_ref(source)())
        except RefError as e:
            raise ValueError(f"env.{what}: {e}") from None
        if not rows:
            raise ValueError(f"env.{what}: {source} returned no tasks")
        return [check(row, f"{source} item {i}", str(i)) for i, row in enumerate(rows)]
    rows = read_jsonl(source, lambda row, where: {"row": row, "where": where}, f"env.{what}", "tasks")
    return [check(r["row"], r["where"], r["where"].rsplit(":", 1)[-1]) for r in rows]


def _held_out(tasks: list[Task], fraction: float) -> set[str]:
    """Ids of the ceil(fraction * n) tasks with the smallest SHA-256 of their id."""
    k = max(1, math.ceil(fraction * len(tasks)))
    ranked = sorted(tasks, key=lambda t: hashlib.sha256(t.task_id.encode()).hexdigest())
    return {t.task_id for t in ranked[:k]}


class CustomEnv:
    """Tasks and reward from user code (see the module docstring)."""

    def __init__(self, cfg: CustomEnvConfig):
        self.cfg = cfg
        try:
            self.reward_fn = import_ref(cfg.reward)
        except RefError as e:
            raise ValueError(f"env.reward: {e}") from None
        tasks = load_tasks(cfg.tasks, cfg, "tasks")
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise ValueError(f"env.tasks: task ids must be unique; repeated: {dup}")
        if cfg.eval_tasks is not None:
            train, held = tasks, load_tasks(cfg.eval_tasks, cfg, "eval_tasks")
            name = f"env.eval_tasks ({cfg.eval_tasks})"
        else:
            out = _held_out(tasks, cfg.heldout_fraction)
            train, held = [t for t in tasks if t.task_id not in out], [t for t in tasks if t.task_id in out]
            name = f"the held-out share of env.tasks (heldout_fraction={cfg.heldout_fraction})"
            if not train:
                raise ValueError(f"env.tasks: all {len(tasks)} tasks are held out; add tasks or lower heldout_fraction")
        self.splits = Splits("custom", train, held, cfg.seed, name)

    def sample_tasks(self, n: int) -> list[Task]:
        return self.splits.sample(n)

    def eval_tasks(self, n: int) -> list[Task]:
        return self.splits.eval(n)

    def score(self, episode: Episode) -> float:
        try:
            value = self.reward_fn(episode.task, episode.answer, episode)
        except Exception as e:  # noqa: BLE001 - the episode fails with the reason; the step goes on
            raise RewardError(f"{self.cfg.reward} raised {type(e).__name__}: {e}") from e
        scores: dict[str, float] = {}
        if isinstance(value, dict):
            if "reward" not in value:
                raise RewardError(f"{self.cfg.reward} returned a dict without 'reward' (keys: {sorted(value)})")
            scores = {k: v for k, v in value.items() if k != "reward"}
            value = value["reward"]
        if not isinstance(value, numbers.Real):  # bool counts: True is 1.0
            raise RewardError(f"{self.cfg.reward} returned {value!r}; expected a float or a dict with 'reward'")
        reward = float(value)
        if not math.isfinite(reward):
            raise RewardError(f"{self.cfg.reward} returned {reward}")
        if scores:
            try:
                episode.info["scores"] = {k: float(v) for k, v in scores.items()}
            except (TypeError, ValueError):
                raise RewardError(f"{self.cfg.reward} returned non-numeric scores {scores!r}") from None
        return reward

    def describe(self) -> dict[str, Any]:
        return {"name": "custom", "tasks": self.cfg.tasks, "reward": self.cfg.reward,
                "train_size": len(self.splits.train), "eval_size": len(self.splits.held_out)}

    def state_dict(self) -> dict[str, Any]:
        return self.splits.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.splits.load_state_dict(state)


register_env("custom", CustomEnvConfig, CustomEnv)
