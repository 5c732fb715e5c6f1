"""Synthetic arithmetic: chains of binary operations evaluated left to right.

A task is an expression such as ``3+4-2`` (answer ``5``). ``num_ops`` is the difficulty
knob. When ``*`` is among the configured ops the chain is rendered with the parentheses that
make left-to-right order explicit under the usual precedence, e.g. ``(3+4)*2``; the rendered
string therefore means the same thing to a reader, a model and any calculator.

Splits. Whether an expression is held out depends only on a stable hash (SHA-256) of its
rendered string, never on the seed or on the sampling order, so the two splits are disjoint by
construction and the same in every run. Changing ``heldout_fraction`` only moves expressions
between splits in one direction (the hash is compared with the fraction).

Streams. Training task ``k`` is drawn from its own generator seeded with ``(seed, k)``
(counter-based), so the cursor is a single integer and resuming reproduces the data order
exactly. The held-out stream does not depend on ``seed``: runs with different seeds are
evaluated on the same problems.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mas.types import Episode, Task, Turn

from ..base import check_env_state
from ..registry import register_env
from ..verifiers import register_verifier
from .turns import verify_math_turn
from .verify import score_answer

__all__ = ["SyntheticMathConfig", "SyntheticMathEnv", "chains_summary", "is_heldout", "make_task", "render", "stream_id"]

Op = Literal["+", "-", "*"]

_TRAIN_STREAM = 0  # first word of the SeedSequence of training draws: (seed, _TRAIN_STREAM, k)
_EVAL_SEED = (20240917, 1)  # held-out order; fixed so every seed evaluates on the same tasks
_ENUMERATE_UP_TO = 20_000  # expression spaces this small are listed exactly for eval
_HASH_SALT = b"mas/synthetic_math/"


class SyntheticMathConfig(BaseModel):
    """Synthetic left-to-right arithmetic chains (env section of the run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["synthetic_math"] = Field(description="Selects this env.")
    num_ops: int = Field(
        default=2, ge=1, description="Binary operations per expression: the difficulty knob."
    )
    max_operand: int = Field(
        default=9, ge=1, description="Operands are drawn uniformly from 0..max_operand."
    )
    ops: tuple[Op, ...] = Field(
        default=("+", "-"),
        description="Operators to draw from uniformly; a non-empty subset of '+', '-', '*'.",
    )
    heldout_fraction: float = Field(
        default=0.1,
        gt=0.0,
        lt=1.0,
        description="Share of all expressions (by stable hash) reserved for evaluation.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the training task stream.")

    @field_validator("ops")
    @classmethod
    def _ops_nonempty_unique(cls, ops: tuple[str, ...]) -> tuple[str, ...]:
        if not ops:
            raise ValueError("ops must name at least one of '+', '-', '*'")
        if len(set(ops)) != len(ops):
            raise ValueError(f"ops has duplicates: {list(ops)}; valid choices are '+', '-', '*'")
        return ops


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown op {op!r}; valid choices are '+', '-', '*'")


def render(operands: list[int], ops: list[str]) -> str:
    """The chain as a string without spaces, parenthesised where precedence would reorder it.

    Left-to-right order only differs from the usual precedence where ``*`` follows a ``+`` or
    ``-``; that is exactly where the accumulated left side is wrapped: ``(3+4)*2-1``.
    """
    text = str(operands[0])
    last_additive = False  # does ``text`` have a top-level + or -?
    for op, b in zip(ops, operands[1:]):
        if op == "*" and last_additive:
            text = f"({text})"
        text = f"{text}{op}{b}"
        last_additive = op in "+-"
    return text


def make_task(operands: list[int], ops: list[str]) -> Task:
    """The Task for one chain, with the left-to-right steps a scripted teacher can replay."""
    if len(operands) != len(ops) + 1 or not ops:
        raise ValueError(f"need len(operands) == len(ops) + 1 >= 2, got {operands} and {ops}")
    steps: list[list[Any]] = []
    acc = operands[0]
    for op, b in zip(ops, operands[1:]):
        result = _apply(acc, op, b)
        steps.append([acc, op, b, result])
        acc = result
    expr = render(operands, ops)
    return Task(
        task_id=f"syn-{expr}",
        prompt=expr,
        answer=str(acc),
        meta={"operands": list(operands), "ops": list(ops), "steps": steps},
    )


def chains_summary(cfg: Any) -> str:
    """How the chains of ``cfg`` (this config, or a team env's with the same fields) are drawn,
    as ``describe()`` says it: ``2 ops over 0..9, ops +-``."""
    return f"{cfg.num_ops} ops over 0..{cfg.max_operand}, ops {''.join(cfg.ops)}"


def stream_id(env: str, cfg: Any, **extra: Any) -> dict[str, Any]:
    """Everything that shapes the chain stream of ``cfg`` (this config, or a team env's with the
    same fields), for a state dict: a resume with other values must fail.  ``extra`` is what else
    shapes an env's tasks (a relay's size), after the env's name."""
    return {"env": env, **extra, "seed": cfg.seed, "num_ops": cfg.num_ops, "max_operand": cfg.max_operand,
            "ops": list(cfg.ops), "heldout_fraction": cfg.heldout_fraction}


def is_heldout(expr: str, heldout_fraction: float) -> bool:
    """Stable split membership of a rendered expression (same on every machine and run)."""
    digest = hashlib.sha256(_HASH_SALT + expr.encode()).digest()
    return int.from_bytes(digest[:8], "big") < heldout_fraction * 2**64


class SyntheticMathEnv:
    """Env over :class:`SyntheticMathConfig`; see the module docstring for splits and streams."""

    def __init__(self, cfg: SyntheticMathConfig) -> None:
        self.cfg = cfg
        self._cursor = 0
        self._space = (cfg.max_operand + 1) ** (cfg.num_ops + 1) * len(cfg.ops) ** cfg.num_ops
        self._heldout_list: list[Task] | None = None  # built lazily for small spaces

    # -- drawing ----------------------------------------------------------------------------

    def _draw(self, rng: np.random.Generator) -> tuple[list[int], list[str]]:
        cfg = self.cfg
        operands = rng.integers(0, cfg.max_operand + 1, size=cfg.num_ops + 1).tolist()
        ops = [cfg.ops[i] for i in rng.integers(0, len(cfg.ops), size=cfg.num_ops).tolist()]
        return operands, ops

    def _train_task(self, k: int) -> Task:
        rng = np.random.default_rng([self.cfg.seed, _TRAIN_STREAM, k])
        for _ in range(10_000):  # P(held out) = heldout_fraction, so this ends at once in practice
            task = make_task(*self._draw(rng))
            if not is_heldout(task.prompt, self.cfg.heldout_fraction):
                return task
        raise ValueError(
            f"no training expression found in 10000 draws: the expression space "
            f"({self._space} chains) is too small for heldout_fraction="
            f"{self.cfg.heldout_fraction}; raise max_operand or num_ops, or lower the fraction"
        )

    def _enumerate_heldout(self) -> list[Task]:
        cfg = self.cfg
        heldout = []
        for operands in itertools.product(range(cfg.max_operand + 1), repeat=cfg.num_ops + 1):
            for ops in itertools.product(cfg.ops, repeat=cfg.num_ops):
                task = make_task(list(operands), list(ops))
                if is_heldout(task.prompt, cfg.heldout_fraction):
                    heldout.append(task)
        order = np.random.default_rng(list(_EVAL_SEED)).permutation(len(heldout))
        return [heldout[i] for i in order.tolist()]

    # -- Env protocol -----------------------------------------------------------------------

    def sample_tasks(self, n: int) -> list[Task]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        tasks = [self._train_task(k) for k in range(self._cursor, self._cursor + n)]
        self._cursor += n
        return tasks

    def eval_tasks(self, n: int) -> list[Task]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if self._space <= _ENUMERATE_UP_TO:
            if self._heldout_list is None:
                self._heldout_list = self._enumerate_heldout()
            if n > len(self._heldout_list):
                raise ValueError(
                    f"asked for {n} eval tasks but the held-out split has only "
                    f"{len(self._heldout_list)} distinct expressions (of {self._space}); "
                    "raise heldout_fraction, max_operand or num_ops"
                )
            return self._heldout_list[:n]
        # Large space: draw distinct held-out expressions from the fixed eval stream.
        rng = np.random.default_rng(list(_EVAL_SEED))
        seen: set[str] = set()
        tasks: list[Task] = []
        max_draws = int(20 * n / self.cfg.heldout_fraction) + 10_000
        for _ in range(max_draws):
            if len(tasks) == n:
                break
            task = make_task(*self._draw(rng))
            if task.prompt not in seen and is_heldout(task.prompt, self.cfg.heldout_fraction):
                seen.add(task.prompt)
                tasks.append(task)
        if len(tasks) < n:
            raise ValueError(
                f"found only {len(tasks)} distinct held-out expressions in {max_draws} draws, "
                f"asked for {n}; raise heldout_fraction, max_operand or num_ops"
            )
        return tasks

    def score(self, episode: Episode) -> float:
        return score_answer(episode)

    def verify_turn(self, episode: Episode, turn: Turn) -> float | None:
        """Each turn's own step of the chain (``envs/math/turns.py``)."""
        return verify_math_turn(episode, turn)

    def describe(self) -> dict[str, Any]:
        """Data source and size, for the reporting checklist."""
        c = self.cfg
        return {
            "name": "synthetic_math",
            "source": f"generated arithmetic chains ({chains_summary(c)})",
            "train_size": f"{self._space} distinct chains minus the held-out fraction {c.heldout_fraction}",
            "eval_size": "held-out chains (disjoint from training by hash)",
        }

    def state_dict(self) -> dict[str, Any]:
        return {**stream_id("synthetic_math", self.cfg), "cursor": self._cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cursor = check_env_state(state, stream_id("synthetic_math", self.cfg))


register_env("synthetic_math", SyntheticMathConfig, SyntheticMathEnv)
register_verifier("synthetic_math", verify_math_turn)
