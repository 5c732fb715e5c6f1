"""What the team envs share: a task stream of ``synthetic_math`` chains.

Every team task is made of arithmetic chains drawn from the ``synthetic_math`` streams with the
team env's own settings (``num_ops``, ``max_operand``, ``ops``, ``heldout_fraction``, ``seed``):
one chain per part where the task has parts (``cfg.num_parts``: a relay's N, a conjunctive
task's 2), else one chain per task (the saboteur's).  A training task is made of training
chains and a held-out task of held-out chains only, so no part of a held-out task was seen in
training.  The cursor of the state dict counts tasks.

A team env differs in how its chains make a task (``_join``), how an episode is scored and
judged, and what its description says; :class:`ChainTeamEnv` carries the rest.
"""

from __future__ import annotations

from typing import Any, ClassVar

from mas.types import Task

from ..base import check_env_state
from ..math.synthetic import SyntheticMathConfig, SyntheticMathEnv, chains_summary, stream_id

__all__ = ["ChainTeamEnv"]


class ChainTeamEnv:
    """The task stream, splits, state dict and description of a team env over arithmetic chains
    (module docstring).  A team env sets:

    * ``name``: its registered env name (its state dict and description carry it);
    * ``description``: the ``source``, ``train_size`` and ``eval_size`` of ``describe()``, each a
      ``str.format`` template over ``chains`` (how the chains are drawn: ``2 ops over 0..9, ops
      +-``) and ``size`` (chains per task);
    * ``eval_shortage``, where a task has several chains: what ``eval_tasks(n)`` says it asked
      for when the held-out split has too few chains (``held-out pairs``), a template over ``size``;
    * ``_join``, where a task has several chains: the task that ``size`` consecutive chains make.
    """

    name: ClassVar[str]
    description: ClassVar[dict[str, str]]
    eval_shortage: ClassVar[str | None] = None  # None: the chain stream's own error

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.chains = SyntheticMathEnv(SyntheticMathConfig(
            name="synthetic_math", num_ops=cfg.num_ops, max_operand=cfg.max_operand, ops=cfg.ops,
            heldout_fraction=cfg.heldout_fraction, seed=cfg.seed))

    @property
    def per_task(self) -> int:
        """Chains per task: one per part where the task has parts, else one."""
        return getattr(self.cfg, "num_parts", 1)

    @staticmethod
    def _join(chains: list[Task]) -> Task:
        """The task ``per_task`` consecutive chains make; one chain is its own task."""
        (task,) = chains
        return task

    def _tasks(self, chains: list[Task]) -> list[Task]:
        k = self.per_task
        return [self._join(chains[i:i + k]) for i in range(0, len(chains), k)]

    def sample_tasks(self, n: int) -> list[Task]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return self._tasks(self.chains.sample_tasks(self.per_task * n))

    def eval_tasks(self, n: int) -> list[Task]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        try:
            chains = self.chains.eval_tasks(self.per_task * n)
        except ValueError as e:
            if self.eval_shortage is None:
                raise
            raise ValueError(f"asked for {n} {self.eval_shortage.format(size=self.per_task)}, which need "
                             f"{self.per_task * n} held-out chains: {e}") from None
        return self._tasks(chains)

    def describe(self) -> dict[str, Any]:
        """Data source and size, for the reporting checklist."""
        fill = {"chains": chains_summary(self.cfg), "size": self.per_task}
        return {"name": self.name, **{key: text.format(**fill) for key, text in self.description.items()}}

    def _stream_id(self) -> dict[str, Any]:
        return stream_id(self.name, self.cfg)

    def state_dict(self) -> dict[str, Any]:
        return {**self._stream_id(), "cursor": self.chains.state_dict()["cursor"] // self.per_task}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cursor = check_env_state(state, self._stream_id())
        self.chains.load_state_dict({**self.chains.state_dict(), "cursor": self.per_task * cursor})
