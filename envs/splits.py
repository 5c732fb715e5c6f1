"""Train/held-out splits of a fixed data set (GSM8K, HotpotQA, facts): the stream these envs read,
and ``SplitTasks``, their task methods.

Training tasks are read through an integer cursor over a fresh seeded permutation per epoch,
so every task is seen once per epoch and a resumed run sees the same order.  Held-out tasks
are read in file order; ``eval(k)`` is a prefix of ``eval(n)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mas.types import Task

from .base import check_env_state


class Splits:
    def __init__(self, env: str, train: list[Task], held_out: list[Task], seed: int, held_out_name: str):
        self.env, self.train, self.held_out, self.seed = env, train, held_out, seed
        self.held_out_name = held_out_name  # named in errors, e.g. "the 'test' split (source='sample')"
        self.cursor = 0
        self._epoch_order: tuple[int, list[int]] | None = None  # (epoch, permutation) cache

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
            self._epoch_order = (epoch, perm.tolist())
        return self._epoch_order[1]

    def sample(self, n: int) -> list[Task]:
        """The next ``n`` training tasks; advances the cursor."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        size = len(self.train)
        tasks = [self.train[self._order(k // size)[k % size]] for k in range(self.cursor, self.cursor + n)]
        self.cursor += n
        return tasks

    def eval(self, n: int) -> list[Task]:
        """The first ``n`` held-out tasks; more than the split holds is a ValueError."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > len(self.held_out):
            raise ValueError(f"asked for {n} eval tasks but {self.held_out_name} has {len(self.held_out)}")
        return self.held_out[:n]

    def _stream_id(self) -> dict[str, Any]:
        return {"env": self.env, "seed": self.seed, "num_train": len(self.train)}

    def state_dict(self) -> dict[str, Any]:
        return {**self._stream_id(), "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = check_env_state(state, self._stream_id())


class SplitTasks:
    """The task half of the Env protocol, and its resumable cursor, for an env whose tasks are a
    ``Splits`` (``self._splits``): GSM8K, HotpotQA and the generated facts task read them the same way."""

    _splits: Splits

    @property
    def num_train(self) -> int:
        return len(self._splits.train)

    @property
    def num_eval(self) -> int:
        return len(self._splits.held_out)

    def sample_tasks(self, n: int) -> list[Task]:
        return self._splits.sample(n)

    def eval_tasks(self, n: int) -> list[Task]:
        return self._splits.eval(n)

    def state_dict(self) -> dict[str, Any]:
        return self._splits.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._splits.load_state_dict(state)
