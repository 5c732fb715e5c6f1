"""The local runtime: every policy, its rollout backend and its learner in the driver process.

Learners run one after another, so nothing overlaps: ``trainer.max_staleness: 1`` runs at
staleness 0 here.  ``start_update`` computes a policy's gradients at once and its handle's
``result()`` steps its optimizer, so the trainer has every policy's gradients before any
weight changes, and a stop can drop the step until then.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas.runtime.base import learner_args
from mas.runtime.worker import PolicyWorker

if TYPE_CHECKING:
    from mas.config.schema import RunConfig


class LocalRuntime:
    can_overlap = False
    can_abandon_updates = True  # every policy's gradients come before any optimizer step (Learner.start_update)

    def __init__(self, cfg: "RunConfig", train: set[str]):
        self.worker = PolicyWorker(dict(cfg.policies), sorted(train), learner_args(cfg), seed=cfg.trainer.seed)
        self.policies = self.worker.handles  # PolicyHandles by name (this process holds the weights)
        self.backend = self.worker.backend
        self.learners = self.worker.learners
        self.tokenizers = {name: h.tokenizer for name, h in self.policies.items()}
        self.trainable = {name: h.trainable for name, h in self.policies.items()}

    def describe(self) -> dict[str, dict[str, Any]]:
        return self.worker.info()["policies"]

    def save_policies(self, ckpt: Path, names: list[str]) -> None:
        self.worker.save(str(ckpt), names)

    def load_policies(self, ckpt: Path, names: list[str], learner_state: bool = True) -> None:
        self.worker.load(str(ckpt), names, learner_state)

    def warm_up_begin(self, name: str, demonstrations: list, **kwargs: Any) -> int:
        """Start ``name``'s supervised format warm-up (``PolicyWorker.warm_up_begin``)."""
        return self.worker.warm_up_begin(name, demonstrations, **kwargs)

    def warm_up_steps(self, name: str, steps: int) -> list[float]:
        return self.worker.warm_up_steps(name, steps)

    def warm_up_state(self, name: str) -> dict[str, Any]:
        return self.worker.warm_up_state(name)

    def warm_up_end(self, name: str) -> dict[str, Any]:
        return self.worker.warm_up_end(name)

    def close(self) -> None:
        """Stop the rollout backend's engines (vLLM's processes); the rest Python collects."""
        self.worker.close()
