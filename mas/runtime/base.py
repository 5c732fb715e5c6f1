"""What every runtime offers the trainer (the seams listed in ``mas.runtime``), and what both build from.

The runtimes (``mas.runtime.local``, ``mas.runtime.ray_runtime``) import these from here, not
from the package, whose ``build_runtime`` imports them in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mas.rollout.backends.base import Backend, BackendUnavailable

if TYPE_CHECKING:
    from mas.config.schema import RunConfig
    from mas.learning.learner import TrainSample, UpdateHandle


class PolicyActorDied(BackendUnavailable):
    """A policy's Ray actor died (killed, out of memory, node lost); the message names the policy,
    the node and Ray's reason.  The run stops; its last checkpoint is intact."""

    def __init__(self, message: str, policies: tuple[str, ...] = ()):
        super().__init__(message)
        self.policies = policies


class RemoteLearner(Protocol):
    """What the trainer needs of a learner, wherever it runs."""

    @property
    def version(self) -> int: ...

    def start_update(self, samples: list["TrainSample"], seed: int | None = None,
                     abort: Callable[[], bool] | None = None) -> "UpdateHandle": ...


class Runtime(Protocol):
    backend: Backend
    learners: dict[str, Any]
    tokenizers: dict[str, Any]
    trainable: dict[str, bool]
    can_overlap: bool
    can_abandon_updates: bool  # a stop can drop a step while its updates compute gradients

    def describe(self) -> dict[str, dict[str, Any]]: ...

    def save_policies(self, ckpt: Path, names: list[str]) -> None: ...

    def load_policies(self, ckpt: Path, names: list[str], learner_state: bool = True) -> None: ...

    def close(self) -> None: ...


def learner_args(cfg: "RunConfig") -> dict[str, dict[str, Any]]:
    """Per policy, the trainer's loss settings its learner takes (flat builder arguments);
    ``max_tokens`` is dr_grpo's constant: ``trainer.loss_agg_max_tokens``, else the largest
    ``max_new_tokens`` of the policy's agents."""
    t = cfg.trainer
    shared = dict(total_steps=t.steps, clip_low=t.clip_low, clip_high=t.clip_high, kl_coef=t.kl_coef,
                  kl_estimator=t.kl_estimator, loss_agg=t.loss_agg, ppo_epochs=t.ppo_epochs, rollout_is_cap=t.rollout_is_cap)
    out = {}
    for name, p in cfg.policies.items():
        longest = max((a.sampling.max_new_tokens for a in cfg.agents if a.policy == name), default=None)
        old = old_logprobs_of(t.old_logprobs, p)
        out[name] = {**shared, "max_tokens": t.loss_agg_max_tokens or longest, "old_logprobs": old,
                     "rollout_is": t.rollout_is if old == "learner" else "none"}  # an exact rollout needs no weights
    return out


def rollout_exact(policy: Any) -> bool:
    """Whether the policy's rollout logprobs are the learner's own: hf sampling from float32 weights
    (``dtype: auto`` as it resolves on this machine).  vLLM's kernels, and half-precision weights,
    score tokens differently."""
    from mas.models.devices import resolve_dtype

    dtype = resolve_dtype(policy.dtype, policy.device, full=policy.kind == "full").dtype
    return policy.backend == "hf" and dtype == "float32"


def old_logprobs_of(setting: str, policy: Any) -> str:
    """``trainer.old_logprobs`` for one policy: ``auto`` recomputes where its rollout is not exact."""
    if setting == "auto":
        return "rollout" if rollout_exact(policy) else "learner"
    return setting
