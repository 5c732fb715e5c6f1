"""One policy's learner: the PPO-clip surrogate over its completion tokens (docs/architecture.md, "Policies
and updates"; CREDIT_SPEC.md section 0).

Each trainable policy owns one ``Learner``: its own AdamW, learning-rate schedule and
micro-batch size (the decoupled per-agent update).  A turn reaches the learner as a
``TrainSample``: prompt and completion token ids, the logprob of each completion token at
sampling time, and the one scalar advantage that the credit method gave the turn.

Shapes (the vocabulary of ``mas.types`` and ``mas.learning.logprobs``):
    N  turns (samples) in an update batch
    K  completion tokens, flat: one per (turn, completion position), in the packing's order

The batch is scored packed (``mas.learning.logprobs``: every distinct token through the model
once), so every per-token tensor here is a flat ``[K]`` over completion tokens, each carrying
its turn's advantage and its share of the aggregated loss.  ``tests/ppo_reference.py`` holds
the same surrogate over right-padded ``[N, S]`` turns, written straight from the formulas
below; the packed path is tested against it.

The surrogate (PPO, Schulman et al. 2017, arXiv 1707.06347; clip-higher as in DAPO,
arXiv 2503.14476):

    ratio_t = exp(logp_t - old_t)
    pg_t    = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)
    loss_t  = pg_t + kl_coef * kl_t

The KL term to the reference (the initial weights), ``kl_estimator`` (Schulman's estimators,
"Approximating KL divergence", 2020; verl's ``kl_loss_type`` names; CREDIT_SPEC.md §8c), with
d_t = logp_t - ref_t:

    k1           d_t                                  unbiased, can be negative
    abs          |d_t|
    k2           d_t² / 2                             verl "mse"
    k3           exp(-d_t) + d_t - 1                  >= 0, unbiased for KL(pi || ref) on-policy
    low_var_kl   k3 with d_t clamped to [-20, 20] and the result to [-10, 10]   verl's low_var_kl

The gradient flows through logp only (ref is a constant).

Aggregation (``loss_agg``; ℓ_{n,t} the per-token loss, L_n the tokens of turn n, N the turns
with at least one token in the policy's update batch):

    token_mean          Σ_n Σ_t ℓ_{n,t} / Σ_n L_n          verl token-mean (DrMAS default) [C]
    seq_mean            Σ_n (Σ_t ℓ_{n,t} / L_n) / N         verl seq-mean-token-mean, GRPO's 1/|o_i| [C]
    seq_mean_token_sum  Σ_n Σ_t ℓ_{n,t} / N                 verl seq-mean-token-sum [C]
    dr_grpo             Σ_n Σ_t ℓ_{n,t} / (N · L_max)       TRL loss_type="dr_grpo": a constant
                                                            normaliser, L_max = the largest completion
                                                            the policy's agents may write [C]

Every divisor is the count of the whole update batch, not of a micro-batch, so accumulating
micro-batch gradients gives exactly the gradient of one big batch (verl's "token-mean over the
agent's whole mini-batch" [C]).  Turns with no completion token add nothing and are not
counted.  Dr. GRPO's point (arXiv 2503.20783) is that the length normalisations of
``token_mean``/``seq_mean`` bias long wrong answers; ``dr_grpo`` and ``seq_mean_token_sum``
do not normalise by length (``dr_grpo`` keeps the gradient scale fixed by a constant).

Old logprobs and the rollout/learner mismatch (CREDIT_SPEC.md §8c).  ``old_logprobs``: the PPO
"old" logprobs are the rollout backend's sampling logprobs (``rollout``: exact for ``hf`` in
float32), or the learner's own, recomputed with the weights before the update in one extra
forward pass without gradient (``learner``: a vLLM or half-precision rollout scores tokens
differently from the learner, so its ratio is not 1 on the first pass).  With ``learner``,
``rollout_is`` weights each token's surrogate by a truncated importance weight against the
rollout's logprobs (detached; verl's ``rollout_is``; Yao et al. 2025, truncated importance
sampling):

    token      w_t = min(exp(old_t - roll_t), C)
    sequence   w_t = min(exp(sum over the turn's tokens of (old - roll)), C)
    pg_t       = w_t * -min(ratio_t * A, clip(ratio_t, ...) * A)

Every update records the mismatch of its first pass, whatever the setting: the mean and max of
|logp - roll| over the completion tokens, a k3 estimate of KL(learner || rollout),
mean(exp(roll - logp) - (roll - logp) - 1), the share of first-pass tokens whose ratio is
clipped, and the weights' mean and the share that hit the cap.

Learning-rate schedules are ``transformers.get_scheduler``'s ("constant_with_warmup",
"linear", "cosine"), one scheduler step per update call.  Warm-up is transformers' linear
ramp k/W for update k < W (0-based), so the first update of a warm-up runs at lr 0; after it
constant 1, linear (T − k)/(T − W), cosine (1 + cos(π (k − W)/(T − W)))/2, reaching 0 at
k = T (T = trainer.steps).

Running apart: ``start_update`` is the non-blocking form of ``update`` that the trainer uses
(it starts every active learner, then collects them); here it runs at once and returns a
completed handle, a Ray actor's learner returns a pending one (``mas.runtime``).  Each update
may be seeded (dropout draws from it), so its result does not depend on what else ran in
the process.  Data-parallel workers of one policy (``mas.runtime.data_parallel``) give the
learner a ``sync`` that sums the divisor, the gradients and the statistics over the workers
before clipping, so N workers on N shards take the one-worker step.  ``mixed_precision:
bf16`` runs the forward passes under accelerate's autocast.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import nn

from mas.process.fault_points import pause_point
from mas.process.memory import release_freed_memory
from mas.learning.memory_plan import enable_checkpointing, learner_savers
from mas.learning.logprobs import Pass, distinct_tokens, pack, passes, split_model, token_logprobs_packed
from mas.types import StepAbandoned

if TYPE_CHECKING:  # the learner reads only a few fields of it (flat builder arguments)
    from mas.config.schema import OptimConfig

LossAgg = Literal["token_mean", "seq_mean", "seq_mean_token_sum", "dr_grpo"]
KlEstimator = Literal["k1", "abs", "k2", "k3", "low_var_kl"]
OldLogprobs = Literal["rollout", "learner"]
RolloutIS = Literal["none", "token", "sequence"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "abs", "k2", "k3", "low_var_kl")
LOSS_AGGS: tuple[str, ...] = ("token_mean", "seq_mean", "seq_mean_token_sum", "dr_grpo")
SCHEDULES: tuple[str, ...] = ("constant", "linear", "cosine")
HF_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}  # mas name -> transformers name

# A pass's padded positions are excluded by its attention mask (as keys) and predict no
# completion token (as targets); right-padded, they sit after every real token, so their id
# never matters.  0 is valid in every vocabulary.
PAD_ID = 0


class TrainablePolicy(Protocol):
    """What the learner needs from a policy (``agents.policy.PolicyHandle`` provides it)."""

    name: str
    model: nn.Module  # called as model(input_ids=..., attention_mask=...).logits
    device: Any  # torch.device or str; batches are moved there

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def activate(self) -> AbstractContextManager[Any]:
        """Make this policy's weights (e.g. its LoRA adapter) the ones ``model`` runs."""
        ...

    def reference(self) -> AbstractContextManager[nn.Module]:
        """Yield the reference (initial) model for the KL term."""
        ...

    def mark_updated(self) -> None:
        """Tell the policy its weights changed (backends resync)."""
        ...


@dataclass
class TrainSample:
    """One turn to optimise: its tokens, sampling logprobs and advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]  # sampling-time logprob of each completion token
    advantage: float
    temperature: float = 1.0  # sampling temperature; 0 (greedy) means logprobs at T = 1


@dataclass(frozen=True)
class UpdateSpan:
    """Where and when one update ran (wall-clock seconds since the epoch, process id, host).
    ``work``: its own seconds when other work ran between its start and end (the local
    runtime computes every policy's gradients before any steps); None: all of it."""

    pid: int
    host: str
    start: float
    end: float
    work: float | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start if self.work is None else self.work


class UpdateHandle(Protocol):
    """A started update: ``result()`` waits for it and returns its metrics (or raises its error);
    ``span`` is set once it has finished."""

    span: UpdateSpan | None

    def result(self) -> dict[str, float]: ...


class CompletedUpdate:
    """An update that already ran in this process (the local runtime's handle)."""

    def __init__(self, metrics: dict[str, float] | None, span: UpdateSpan, error: BaseException | None = None):
        self._metrics, self.span, self._error = metrics, span, error

    def result(self) -> dict[str, float]:
        if self._error is not None:
            raise self._error
        assert self._metrics is not None
        return self._metrics


class GradientSync(Protocol):
    """Sums tensors in place over the data-parallel workers of one policy."""

    world_size: int

    def sum_(self, tensors: list[torch.Tensor]) -> None: ...

    def max_(self, tensors: list[torch.Tensor]) -> None: ...


def _host() -> str:
    return os.uname().nodename if hasattr(os, "uname") else "?"


# --------------------------------------------------------------------------------------------
# the loss
# --------------------------------------------------------------------------------------------


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from the sampled tokens' logprobs (module docstring), any shape."""
    d = logprobs - ref_logprobs  # [...]
    if estimator == "k1":
        return d
    if estimator == "abs":
        return d.abs()
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(-d) + d - 1.0
    if estimator == "low_var_kl":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(-d) + d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {list(KL_ESTIMATORS)}")


def rollout_is_weights(old: torch.Tensor, rollout: torch.Tensor, turn: torch.Tensor, level: str, cap: float) -> torch.Tensor:
    """[K] truncated importance weights of the learner's old logprobs against the rollout's (module
    docstring): per token, or one per turn (``turn``: [K] the turn of each token) on all its tokens."""
    log_w = old - rollout  # [K]
    if level == "sequence":
        per_turn = torch.zeros(int(turn.max()) + 1 if turn.numel() else 0, dtype=log_w.dtype, device=log_w.device)
        log_w = per_turn.index_add_(0, turn, log_w)[turn]  # [K]  the turn's sum on each of its tokens
    elif level != "token":
        raise ValueError(f"unknown rollout_is level {level!r}; valid: 'token', 'sequence'")
    return torch.exp(log_w).clamp(max=cap)  # [K]


@torch.no_grad()
def rollout_mismatch(logprobs: torch.Tensor, rollout: torch.Tensor, is_weights: torch.Tensor | None,
                     cap: float) -> dict[str, float]:
    """Sums over K tokens of the learner's logprobs against the rollout's (module docstring): |Δ| and
    its max, the k3 estimate of KL(learner || rollout), and the importance weights and how many hit the cap."""
    d = rollout.float() - logprobs.float()  # [K]  roll - logp
    w = is_weights if is_weights is not None else torch.ones_like(d)
    return {"mismatch_abs_sum": float(d.abs().sum()), "mismatch_abs_max": float(d.abs().max()) if d.numel() else 0.0,
            "mismatch_kl_sum": float((torch.exp(d) - d - 1.0).sum()), "is_sum": float(w.sum()),
            "is_capped": float((w >= cap).sum()) if is_weights is not None else 0.0}


def ppo_clip_tokens(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    clip_low: float,
    clip_high: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO-clip surrogate with an optional KL term (module docstring) over K completion
    tokens: ``sum_k weights[k] * loss_k``.

    Each token carries its turn's advantage, and its share of the aggregated loss in
    ``weights`` (1/norm, or 1/(norm * its turn's length) for seq_mean; norm is ``loss_norm``
    of the whole update batch), so the same sum gives every ``loss_agg``, and the sums over
    any split of the batch add up to the whole batch's loss.  ``is_weights`` ([K], detached)
    scales each token's surrogate (rollout importance sampling).  Stats: ``pg_loss`` (this
    call's share of the aggregated surrogate alone), and means over these K tokens of ``kl``,
    ``clip_frac`` (the clipped branch is the active one) and ``ratio``; ``tokens`` (K).
    """
    log_ratio = logprobs - old_logprobs  # [K]
    ratio = torch.exp(log_ratio)  # [K]
    adv = advantages.to(logprobs.dtype)  # [K]
    pg_unclipped = -ratio * adv  # [K]
    pg_clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # [K]
    pg = torch.maximum(pg_unclipped, pg_clipped)  # [K]  = -min(ratio*A, clip(ratio)*A)
    if is_weights is not None:  # truncated importance weights against the rollout (detached)
        pg = pg * is_weights.to(pg.dtype)
    per_token = pg
    kl = torch.zeros_like(pg)  # [K]
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)  # [K]
        per_token = pg + kl_coef * kl
    w = weights.to(logprobs.dtype)
    loss = (per_token * w).sum()
    with torch.no_grad():
        n = float(logprobs.numel())
        denom = max(n, 1.0)
        stats = {
            "pg_loss": float((pg * w).sum()),
            "kl": float(kl.sum()) / denom,
            "clip_frac": float((pg_clipped > pg_unclipped).sum()) / denom,
            "ratio": float(ratio.sum()) / denom,
            "tokens": n,
        }
    return loss, stats


def loss_norm(completion_lengths: list[int], loss_agg: str, max_tokens: int | None = None) -> int:
    """The divisor of an aggregation over a whole update batch: completion tokens
    (``token_mean``), turns with at least one token (``seq_mean``, ``seq_mean_token_sum``), or
    those turns times the constant ``max_tokens`` (``dr_grpo``)."""
    _check_agg(loss_agg)
    if loss_agg == "token_mean":
        return max(1, sum(completion_lengths))
    turns = max(1, sum(1 for n in completion_lengths if n > 0))
    if loss_agg == "dr_grpo":
        if max_tokens is None or max_tokens < 1:
            raise ValueError(f"loss_agg dr_grpo needs the constant max_tokens >= 1 (found {max_tokens})")
        return turns * max_tokens
    return turns


def _check_agg(loss_agg: str) -> None:
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; valid: {list(LOSS_AGGS)}")


# --------------------------------------------------------------------------------------------
# the learning-rate schedule
# --------------------------------------------------------------------------------------------


def build_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``transformers.get_scheduler`` for a mas schedule name (module docstring for the values)."""
    from transformers import get_scheduler

    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {list(SCHEDULES)}")
    return get_scheduler(HF_SCHEDULES[schedule], optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(total_steps, 1))


# --------------------------------------------------------------------------------------------
# the learner
# --------------------------------------------------------------------------------------------


@contextmanager
def _mode(module: nn.Module, training: bool) -> Iterator[None]:
    """Put ``module`` in train or eval mode, restoring its previous mode afterwards."""
    was = module.training
    module.train(training)
    try:
        yield
    finally:
        module.train(was)


class Learner:
    """AdamW + schedule + PPO-clip updates for one trainable policy.

    Scoring (``optim`` fields, each with an off switch for debugging): ``packing`` lays the
    batch's turns out as a prefix tree, so every distinct token runs through the model once,
    at most ``micro_batch_tokens`` tokens per forward pass (``mas.learning.logprobs.pack``; off: one
    sequence per turn, ``micro_batch_size`` turns per pass); ``logprob_chunk`` makes the
    output head's logits that many completion tokens at a time, under activation
    checkpointing (off: all at once); ``gradient_checkpointing`` recomputes the decoder
    layers' activations in backward instead of keeping them.  Either set to "auto" is chosen
    from the memory it would save against the free device memory
    (``mas.learning.memory_plan.learner_savers``; the choice and its estimate are ``memory_plan``).
    """

    def __init__(
        self,
        policy: TrainablePolicy,
        optim: "OptimConfig",
        total_steps: int,
        clip_low: float,
        clip_high: float,
        kl_coef: float,
        loss_agg: LossAgg,
        ppo_epochs: int = 1,
        max_tokens: int | None = None,
        mixed_precision: str = "no",
        kl_estimator: KlEstimator = "k3",
        old_logprobs: OldLogprobs = "rollout",
        rollout_is: RolloutIS = "none",
        rollout_is_cap: float = 2.0,
    ):
        _check_agg(loss_agg)
        if old_logprobs not in ("rollout", "learner"):
            raise ValueError(f"policy {policy.name!r}: old_logprobs {old_logprobs!r}; valid: 'rollout', 'learner'")
        if rollout_is not in ("none", "token", "sequence") or (rollout_is != "none" and old_logprobs != "learner"):
            raise ValueError(f"policy {policy.name!r}: rollout_is {rollout_is!r} needs old_logprobs 'learner' (with the "
                             "rollout's own logprobs as old, every weight is 1); valid: 'none', 'token', 'sequence'")
        if kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"policy {policy.name!r}: unknown kl_estimator {kl_estimator!r}; valid: {list(KL_ESTIMATORS)}")
        if loss_agg == "dr_grpo" and (max_tokens is None or max_tokens < 1):
            raise ValueError(f"policy {policy.name!r}: loss_agg dr_grpo needs max_tokens >= 1 (the constant normaliser), found {max_tokens}")
        if ppo_epochs < 1:
            raise ValueError(f"ppo_epochs must be >= 1 (found {ppo_epochs})")
        self.policy = policy
        # not filtered on requires_grad: a LoRA policy's activate() sets it, and another
        # adapter may be the active one while this learner is built
        self.params = list(policy.trainable_parameters())
        if not self.params:
            raise ValueError(f"policy {policy.name!r} has no trainable parameters; frozen policies get no learner")
        self.micro_batch_size = optim.micro_batch_size
        self.packing = optim.packing
        self.micro_batch_tokens = optim.micro_batch_tokens
        # a pass's tokens: at most micro_batch_tokens with packing (without it, the debugging path,
        # micro_batch_size turns of unknown length: the same bound is the estimate)
        self.memory_plan = learner_savers(policy.model, optim.micro_batch_tokens, optim.gradient_checkpointing,
                                          optim.logprob_chunk, policy.device)
        self.logprob_chunk = self.memory_plan.logprob_chunk
        self.checkpointing = self.memory_plan.checkpointing and enable_checkpointing(policy.model)
        self.max_grad_norm = optim.max_grad_norm
        self.clip_low, self.clip_high = clip_low, clip_high
        self.kl_coef, self.loss_agg, self.ppo_epochs, self.max_tokens = kl_coef, loss_agg, ppo_epochs, max_tokens
        self.kl_estimator = kl_estimator
        self.recompute, self.rollout_is, self.rollout_is_cap = old_logprobs == "learner", rollout_is, rollout_is_cap
        self._optim, self._total_steps = optim, total_steps
        self.optimizer, self.scheduler = self._build_optimizer()
        self.sync: GradientSync | None = None  # set on data-parallel workers (mas.runtime.data_parallel)
        self.world = 1  # workers whose shards of the model FSDP averages over (sharded: see ``sharded``)
        self._autocast = _autocast_for(mixed_precision, torch.device(policy.device), policy.name)
        self._heads = split_model(policy.model)  # None: the model is scored whole (no chunked head)

    def _build_optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        o = self._optim
        optimizer = torch.optim.AdamW(self.params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
        return optimizer, build_scheduler(optimizer, o.schedule, o.warmup_steps, self._total_steps)

    def sharded(self, world: int) -> None:
        """The policy's model was just sharded over ``world`` workers with FSDP (``mas.runtime.sharding``):
        take its sharded parameters (a new AdamW over them; no step was taken yet), let FSDP reduce the
        gradients (the loss's backward is scaled by ``world``, since FSDP averages), and pad every update
        to the passes of the worker with the most, so their collectives pair up."""
        self.params = list(self.policy.trainable_parameters())
        self.optimizer, self.scheduler = self._build_optimizer()
        self.world = world
        self._heads = split_model(self.policy.model)

    # -- public API ----------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Version of the weights this learner updates (counts updates and loads)."""
        return self.policy.version

    def start_update(self, samples: list[TrainSample], seed: int | None = None,
                     abort: Callable[[], bool] | None = None) -> UpdateHandle:
        """Start an update: its gradients are computed now, its optimizer steps when the
        handle's ``result()`` is asked for (errors are raised there too, as a remote learner's
        are).  So a trainer that starts every policy's update before collecting any can still
        drop the whole step (``abort``) until the first optimizer steps: ``StepAbandoned``
        comes straight out of this call, and no weight has changed."""
        start = time.time()
        try:
            pending = self._begin(samples, seed, abort)
        except StepAbandoned:
            raise
        except Exception as e:  # noqa: BLE001 - handed to the caller through result()
            return CompletedUpdate(None, UpdateSpan(os.getpid(), _host(), start, time.time()), e)
        return _LocalUpdate(self, pending, start, time.time() - start)

    def update(self, samples: list[TrainSample], seed: int | None = None,
               abort: Callable[[], bool] | None = None) -> dict[str, float]:
        """``ppo_epochs`` optimizer steps over ``samples``, then one scheduler step.

        Metrics are token-weighted means over all epochs (``grad_norm``: mean pre-clip norm);
        ``lr`` is the rate these steps used; ``forward_tokens`` counts the token positions run
        through the model per epoch (padding included) and ``distinct_tokens`` the batch's
        distinct token positions (``mas.learning.logprobs.distinct_tokens``), the floor of that.  With
        no samples no optimizer step is taken, but the scheduler still steps (one step per
        update call, so the schedule follows the trainer's steps) and the same metric keys
        come back, at 0 (``lr``: this update's rate).  With a ``seed`` the update draws its
        randomness (dropout) from it, and the process's RNG state is left as it was; a model
        without dropout draws nothing, and its update does not touch the RNG at all (so a Ray
        actor's overlapped rollout, sampling in another thread from the same process-wide
        generator, is not reseeded under it).  ``abort`` is asked before each micro-batch of
        the first epoch: True drops the update (``StepAbandoned``; nothing stepped).  On a
        data-parallel worker ``samples`` is its shard and every worker must call ``update``
        (an empty shard too).
        """
        return self._finish(self._begin(samples, seed, abort))

    def compute_gradients(self, samples: list[TrainSample]) -> dict[str, float]:
        """Zero the gradients and accumulate one epoch's over ``samples`` (no step, no clip).

        What ``update`` does before clipping, exposed for gradient checks; gradients stay in
        ``.grad``.  Returns the loss metrics of ``update`` (no grad_norm, lr or samples).
        """
        batch = self._prepare(samples)
        return _means(self._accumulate(batch), 1)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    # -- the two phases of an update -------------------------------------------------------

    def _begin(self, samples: list[TrainSample], seed: int | None, abort: Callable[[], bool] | None) -> "_Pending":
        """Phase 1: the first epoch's gradients (abortable between micro-batches)."""
        total = len(samples) if self.sync is None else int(self._sum([float(len(samples))])[0])
        pending = _Pending(total=total, seed=seed)
        if not total:
            return pending
        with self._rng(pending):
            pending.batch = self._prepare(samples)
            pending.stats = self._accumulate(pending.batch, abort)
        release_freed_memory()  # the passes' activations: back to the system before the next policy's passes
        return pending

    def _finish(self, pending: "_Pending") -> dict[str, float]:
        """Phase 2: clip and step, the remaining epochs, the scheduler; the metrics."""
        lr = self.optimizer.param_groups[0]["lr"]
        if not pending.total:
            with warnings.catch_warnings():  # stepping before any optimizer.step() is intended here
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
                self.scheduler.step()
            metrics = dict.fromkeys(_METRIC_KEYS, 0.0)
            metrics["lr"] = float(lr)
            return metrics
        totals: dict[str, float] = {}
        grad_norms: list[float] = []
        try:
            with self._rng(pending):
                stats = pending.stats
                first = None
                for epoch in range(self.ppo_epochs):
                    if epoch:
                        stats = self._accumulate(pending.batch)
                    if self.sync is not None:  # every worker now holds the whole batch's gradient and stats
                        if self.world == 1:  # sharded: FSDP reduced the gradients into each worker's shard
                            self._sum_gradients()
                        largest = self._max(stats["mismatch_abs_max"])
                        stats = dict(zip(stats, self._sum(list(stats.values()))))
                        stats["mismatch_abs_max"] = largest
                    first = first or dict(stats)  # the first pass: the rollout/learner mismatch
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
                    if hasattr(grad_norm, "full_tensor"):  # sharded: the norm of the whole gradient
                        grad_norm = grad_norm.full_tensor()
                    if not torch.isfinite(grad_norm):
                        raise FloatingPointError(
                            f"policy {self.policy.name!r}: non-finite gradient norm {float(grad_norm)}; this optimizer step is not taken"
                        )
                    self.optimizer.step()
                    grad_norms.append(float(grad_norm))  # one per optimizer step taken
                    for k, v in stats.items():
                        totals[k] = totals.get(k, 0.0) + v
        finally:
            self.optimizer.zero_grad(set_to_none=True)  # free gradient memory between updates
            if grad_norms:  # the weights changed, even if a later epoch then failed
                self.policy.mark_updated()
        self.scheduler.step()
        metrics = {**_means(totals, self.ppo_epochs), **_first_pass(first)}
        metrics.update(grad_norm=sum(grad_norms) / self.ppo_epochs, lr=float(lr), samples=float(pending.total),
                       forward_tokens=float(pending.batch.forward_tokens),
                       distinct_tokens=float(pending.batch.distinct_tokens))
        return metrics

    @contextmanager
    def _rng(self, pending: "_Pending") -> Iterator[None]:
        """Run a phase on the update's own random stream (seeded in phase 1, carried to phase 2),
        leaving the process's RNG as it was; nothing at all when the model draws no random numbers."""
        if pending.seed is None or not draws_random_numbers(self.policy.model):
            yield
            return
        dev = torch.device(self.policy.device)
        devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if pending.rng is None:
                torch.manual_seed(pending.seed)
            else:
                torch.set_rng_state(pending.rng[0])
                if devices:
                    torch.cuda.set_rng_state(pending.rng[1], devices[0])
            try:
                yield
            finally:
                pending.rng = (torch.get_rng_state(), torch.cuda.get_rng_state(devices[0]) if devices else None)

    # -- internals -----------------------------------------------------------------------

    def _prepare(self, samples: list[TrainSample]) -> "_Batch":
        """The forward passes (packed, or one sequence per turn), the per-token data of every
        completion token, the whole batch's divisor, and reference logprobs for the KL term."""
        kept = [s for s in samples if s.completion_ids]  # a turn with no completion token adds nothing
        for i, s in enumerate(kept):
            if not s.prompt_ids:
                raise ValueError(f"sample {i}: empty prompt_ids; the first completion token needs a context")
            if len(s.old_logprobs) != len(s.completion_ids):
                raise ValueError(f"sample {i}: {len(s.old_logprobs)} old_logprobs for {len(s.completion_ids)} completion tokens")
        sequences = [list(s.prompt_ids) + list(s.completion_ids) for s in kept]
        packing = pack(sequences, [len(s.prompt_ids) for s in kept], self.micro_batch_tokens, share=self.packing)
        if self.packing:
            groups = passes(packing, max_tokens=self.micro_batch_tokens, pad_id=PAD_ID)
        else:
            groups = passes(packing, rows_per_pass=self.micro_batch_size, pad_id=PAD_ID)
        device = self.policy.device
        lengths = [len(s.completion_ids) for s in samples]
        if self.sync is None:
            norm = float(loss_norm(lengths, self.loss_agg, self.max_tokens))
        else:  # the divisor of the whole batch, over every worker's shard
            local = sum(lengths) if self.loss_agg == "token_mean" else sum(1 for n in lengths if n > 0)
            norm = max(1.0, self._sum([float(local)])[0])
            if self.loss_agg == "dr_grpo":  # turns x the constant
                norm *= self.max_tokens
        sample = torch.tensor(packing.sample, dtype=torch.long)  # [K]
        own = torch.tensor([float(len(s.completion_ids)) for s in kept])  # [n]  completion tokens of each kept turn
        weights = torch.full((len(packing.sample),), 1.0 / norm)  # [K]  each token's share of the aggregated loss
        if self.loss_agg == "seq_mean":  # a turn's token mean: 1 / its length
            weights = weights / own[sample]
        old = torch.tensor([kept[i].old_logprobs[j] for i, j in zip(packing.sample, packing.index)], dtype=torch.float32)
        per_token = {
            "old_logprobs": old,  # [K]
            "advantages": torch.tensor([float(kept[i].advantage) for i in packing.sample], dtype=torch.float32),  # [K]
            "temperatures": torch.tensor([kept[i].temperature if kept[i].temperature > 0 else 1.0 for i in packing.sample],
                                         dtype=torch.float32),  # [K]
            "weights": weights,  # [K]
            "turn": sample,  # [K]  which kept turn each token belongs to
        }
        batch = _Batch([g.to(device) for g in groups], {k: v.to(device) for k, v in per_token.items()},
                       forward_tokens=sum(g.tokens for g in groups), distinct_tokens=distinct_tokens(sequences))
        if self.world > 1:  # sharded: every worker runs as many passes as the one with the most
            batch.pad = int(self._max(float(len(batch.passes)))) - len(batch.passes)
        if self.kl_coef > 0:  # the reference never changes within an update: one pass
            with torch.no_grad(), self.policy.reference() as ref_model, _mode(ref_model, False), self._autocast():
                heads = split_model(ref_model)
                batch.ref = [self._logprobs(ref_model, heads, g, batch)[0] for g in batch.passes]
                self._dummy_passes(ref_model, heads, batch.pad)
        if self.recompute:  # the PPO old logprobs from these weights, before the update: one pass without gradient
            pt = batch.per_token
            pt["rollout_logprobs"] = pt["old_logprobs"]
            old = pt["old_logprobs"].clone()
            with torch.no_grad(), self.policy.activate(), _mode(self.policy.model, False), self._autocast():
                for g in batch.passes:
                    old[g.pairs] = self._logprobs(self.policy.model, self._heads, g, batch)[0].float()
                self._dummy_passes(self.policy.model, self._heads, batch.pad)
            pt["old_logprobs"] = old
            if self.rollout_is != "none":
                pt["is_weights"] = rollout_is_weights(old, pt["rollout_logprobs"], pt["turn"], self.rollout_is, self.rollout_is_cap)
        return batch

    def _dummy_passes(self, model: nn.Module, heads: Any, count: int, backward: bool = False) -> None:
        """``count`` passes over a two-token sequence that add nothing (loss 0): a sharded worker with
        fewer passes than the others runs these, so every all-gather and reduce-scatter pairs up."""
        if not count:
            return
        dummy = passes(pack([[PAD_ID, PAD_ID]], [1], 16, share=False), max_tokens=16, pad_id=PAD_ID)[0]
        dummy = dummy.to(self.policy.device)
        for _ in range(count):
            with self._autocast():
                logp, _ = token_logprobs_packed(model, dummy, torch.ones(1), chunk=self.logprob_chunk, heads=heads)
            if backward:
                (logp.sum() * 0.0).backward()

    def _logprobs(self, model: nn.Module, heads: Any, group: Pass, batch: "_Batch") -> tuple[torch.Tensor, torch.Tensor]:
        temps = batch.per_token["temperatures"][group.pairs]  # [Kp]
        return token_logprobs_packed(model, group, temps, chunk=self.logprob_chunk, heads=heads)

    def _sum(self, values: list[float]) -> list[float]:
        """``values`` summed over the data-parallel workers."""
        assert self.sync is not None
        t = torch.tensor(values, dtype=torch.float64, device=self.policy.device)
        self.sync.sum_([t])
        return t.tolist()

    def _max(self, value: float) -> float:
        """``value``'s largest over the data-parallel workers."""
        assert self.sync is not None
        t = torch.tensor([value], dtype=torch.float64, device=self.policy.device)
        self.sync.max_([t])
        return float(t[0])

    def _sum_gradients(self) -> None:
        """Sum every trainable parameter's gradient over the workers (a worker without samples adds zeros)."""
        assert self.sync is not None
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.sync.sum_([p.grad for p in self.params])

    def _accumulate(self, batch: "_Batch", abort: Callable[[], bool] | None = None) -> dict[str, float]:
        """Zero grads, then forward/backward every micro-batch; returns stats summed over them.
        ``abort`` is asked before each micro-batch: True zeroes the gradients and raises
        ``StepAbandoned``."""
        self.optimizer.zero_grad(set_to_none=True)
        keys = ("loss", "pg_loss", "kl_sum", "clip_sum", "ratio_sum", "entropy_sum", "tokens",
                "mismatch_abs_sum", "mismatch_abs_max", "mismatch_kl_sum", "is_sum", "is_capped")
        out = dict.fromkeys(keys, 0.0)
        model = self.policy.model
        with self.policy.activate(), _mode(model, True):
            for i, group in enumerate(batch.passes):
                if i and abort is not None:
                    pause_point("mid_update", None, resume_when=abort)  # a test's signal lands here (fault_points)
                if abort is not None and abort():
                    self.optimizer.zero_grad(set_to_none=True)
                    raise StepAbandoned(f"policy {self.policy.name!r}: update dropped before micro-batch {i + 1} of "
                                        f"{len(batch.passes)}; no optimizer step was taken")
                with self._autocast():
                    logprobs, entropy = self._logprobs(model, self._heads, group, batch)  # [Kp] each
                data = {k: v[group.pairs] for k, v in batch.per_token.items()}  # [Kp] each
                loss, stats = ppo_clip_tokens(
                    logprobs, data["old_logprobs"], data["advantages"], data["weights"],
                    self.clip_low, self.clip_high,
                    ref_logprobs=batch.ref[i] if batch.ref is not None else None, kl_coef=self.kl_coef,
                    kl_estimator=self.kl_estimator, is_weights=data.get("is_weights"),
                )
                mismatch = rollout_mismatch(logprobs.detach(), data.get("rollout_logprobs", data["old_logprobs"]),
                                            data.get("is_weights"), self.rollout_is_cap)
                if not torch.isfinite(loss) and self.sync is None:  # with workers: the summed gradient norm fails on all
                    raise FloatingPointError(
                        f"policy {self.policy.name!r}: non-finite loss {loss.item()} "
                        "(check advantages and old_logprobs); this optimizer step is not taken"
                    )
                (loss * self.world if self.world > 1 else loss).backward()  # sharded: FSDP averages over the workers
                n = stats["tokens"]
                out["loss"] += float(loss.detach())
                out["pg_loss"] += stats["pg_loss"]
                out["kl_sum"] += stats["kl"] * n
                out["clip_sum"] += stats["clip_frac"] * n
                out["ratio_sum"] += stats["ratio"] * n
                out["entropy_sum"] += float(entropy.sum())
                out["tokens"] += n
                for k, v in mismatch.items():
                    out[k] = max(out[k], v) if k == "mismatch_abs_max" else out[k] + v
            self._dummy_passes(model, self._heads, batch.pad, backward=True)
        return out


@dataclass
class _Batch:
    """A prepared update batch: forward passes and the per-token data of their completion tokens."""

    passes: list[Pass]
    per_token: dict[str, torch.Tensor]  # [K] each: old_logprobs, advantages, temperatures, weights
    forward_tokens: int  # token positions run per epoch (padding included)
    distinct_tokens: int  # the batch's distinct token positions
    ref: list[torch.Tensor] | None = None  # reference logprobs per pass (KL term)
    pad: int = 0  # dummy passes after the real ones (a sharded worker with fewer passes than the others)


@dataclass
class _Pending:
    """An update between its two phases."""

    total: int
    seed: int | None
    batch: _Batch | None = None
    stats: dict[str, float] | None = None
    rng: tuple[torch.Tensor, torch.Tensor | None] | None = None  # the update's RNG after phase 1


class _LocalUpdate:
    """A started update of this process: gradients done; ``result()`` steps the optimizer."""

    def __init__(self, learner: Learner, pending: _Pending, start: float, seconds: float):
        self._learner, self._pending = learner, pending
        self._start, self._seconds = start, seconds
        self._metrics: dict[str, float] | None = None
        self._error: BaseException | None = None
        self.span: UpdateSpan | None = None

    def result(self) -> dict[str, float]:
        if self.span is None:
            t0 = time.time()
            try:
                self._metrics = self._learner._finish(self._pending)
            except Exception as e:  # noqa: BLE001 - raised here, and again on every later call
                self._error = e
            self._pending = None
            work = self._seconds + time.time() - t0
            self.span = UpdateSpan(os.getpid(), _host(), self._start, time.time(), work=work)
        if self._error is not None:
            raise self._error
        assert self._metrics is not None
        return self._metrics


def draws_random_numbers(model: nn.Module) -> bool:
    """Whether a training forward pass of ``model`` may draw random numbers: a dropout module
    with p > 0 (LoRA's ``lora_dropout`` included), or a rate named ``*drop*`` above 0 in a
    module's config (transformers applies attention dropout functionally, with no module)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        cfg = getattr(m, "config", None)
        if hasattr(cfg, "to_dict"):
            for key, value in cfg.to_dict().items():
                if "drop" in key and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                    return True
    return False


def _autocast_for(mixed_precision: str, device: torch.device, policy: str) -> Callable[[], AbstractContextManager[Any]]:
    """The context the learner's forward passes run in: accelerate's bf16 autocast, or nothing.

    accelerate keeps one precision per process (its ``AcceleratorState``); every learner of a
    Ray actor shares its device and precision, and in the local runtime the first bf16
    learner sets it.
    """
    if mixed_precision == "no":
        return nullcontext
    if mixed_precision != "bf16":
        raise ValueError(f"policy {policy!r}: unknown mixed_precision {mixed_precision!r}; valid: ['no', 'bf16']")
    from accelerate import Accelerator

    return Accelerator(mixed_precision="bf16", cpu=device.type == "cpu").autocast


_MISMATCH_KEYS = ("mismatch_abs_mean", "mismatch_abs_max", "mismatch_kl", "first_clip_frac", "is_weight_mean", "is_capped_frac")
_METRIC_KEYS = ("loss", "pg_loss", "kl", "clip_frac", "ratio", "entropy", "tokens", "grad_norm", "lr", "samples", *_MISMATCH_KEYS,
                "forward_tokens", "distinct_tokens")


def _first_pass(stats: dict[str, float]) -> dict[str, float]:
    """The rollout/learner mismatch of an update's first pass (module docstring), per completion token."""
    n = max(stats["tokens"], 1.0)
    return {"mismatch_abs_mean": stats["mismatch_abs_sum"] / n, "mismatch_abs_max": stats["mismatch_abs_max"],
            "mismatch_kl": stats["mismatch_kl_sum"] / n, "first_clip_frac": stats["clip_sum"] / n,
            "is_weight_mean": stats["is_sum"] / n, "is_capped_frac": stats["is_capped"] / n}


def _means(totals: dict[str, float], epochs: int) -> dict[str, float]:
    """Turn summed micro-batch stats of ``epochs`` epochs into per-epoch / per-token means."""
    per_token = max(totals["tokens"], 1.0)
    return {
        "loss": totals["loss"] / epochs,  # micro-batch losses already carry the batch norm
        "pg_loss": totals["pg_loss"] / epochs,
        "kl": totals["kl_sum"] / per_token,
        "clip_frac": totals["clip_sum"] / per_token,
        "ratio": totals["ratio_sum"] / per_token,
        "entropy": totals["entropy_sum"] / per_token,
        "tokens": totals["tokens"] / epochs,
    }
