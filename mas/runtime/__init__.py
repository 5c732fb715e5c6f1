"""Runtimes: where a run's policies, rollout backends and learners live (``runtime.kind``).

    local   one process: one ``PolicyWorker`` (mas/runtime/worker.py) holds every policy
    ray     one Ray actor per policy (a LoRA family shares one; ``workers: N`` gives N), each a
            ``PolicyWorker`` holding its weights, learner and rollout backend
            (mas/runtime/ray_runtime.py); the driver keeps the engine, topologies, env and credit

A runtime only decides where things live.  The trainer sees the same seams under both:

    runtime.backend      a ``Backend`` serving every policy (the Ray one splits a batch per actor)
    runtime.learners     per trainable policy, ``start_update(samples, seed) -> handle`` and ``version``;
                         ``handle.result()`` waits for the metrics (local: already done)
    runtime.tokenizers   per policy, what the engine renders prompts with
    runtime.can_overlap  whether updates run while the driver rolls out (``trainer.max_staleness: 1``)
    runtime.save_policies / load_policies   checkpoint files (layout: mas/training/checkpoint.py), written
                         where the policy lives (mas/runtime/policy_state.py)
    runtime.describe()   per policy: kind, device, parameter counts (and its actor under Ray)
    runtime.close()      free everything (Ray: kill the actors, stop a Ray instance we started)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mas.runtime.base import PolicyActorDied, RemoteLearner, Runtime, learner_args

if TYPE_CHECKING:
    from mas.config.schema import RunConfig

__all__ = ["PolicyActorDied", "RemoteLearner", "Runtime", "build_runtime", "learner_args"]


def build_runtime(cfg: "RunConfig", train: set[str], run_dir: Path | None = None) -> Runtime:
    """The runtime ``cfg.runtime.kind`` names, holding every policy; learners for the trainable
    policies in ``train``.  ``run_dir``: where a local Ray instance keeps its temp files."""
    if cfg.runtime.kind == "ray":
        from mas.runtime.ray_runtime import RayRuntime

        return RayRuntime(cfg, train, run_dir)
    from mas.runtime.local import LocalRuntime

    return LocalRuntime(cfg, train)
