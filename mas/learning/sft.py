"""Supervised steps on one policy: next-token loss on demonstration completions (the warm-up).

The format warm-up (``mas.training.warmup``) fine-tunes each trainable policy on demonstrations of its
agents' turns before RL.  This module is the learner-level part: given (prompt, completion)
token pairs, take AdamW steps of the mean negative log-likelihood of the completion tokens,
scored like the RL learner scores turns (prefix-tree packing, chunked logits,
``mas.learning.logprobs``), on the policy's own trainable weights (its LoRA adapter, or all weights).

A ``SupervisedRun`` takes its steps in parts (``run(n)``), so that the caller can show progress,
ask whether to stop and carry on between parts; its optimizer is the warm-up's own and is
dropped at ``close()``, so RL starts with fresh optimizer state.  ``supervised_steps`` is the
whole run in one call.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mas.learning.logprobs import pack, passes, split_model, token_logprobs_packed
from mas.types import StepAbandoned

Demonstration = tuple[list[int], list[int]]  # (prompt_ids, completion_ids)


class SupervisedRun:
    """Steps of ``batch_size`` demonstrations drawn at random (``seed``) without replacement
    within an epoch (each epoch a fresh permutation).  ``policy``: a ``PolicyHandle`` (activate,
    trainable_parameters, model, device, mark_updated)."""

    def __init__(self, policy: Any, demonstrations: Sequence[Demonstration], batch_size: int, lr: float, seed: int,
                 micro_batch_tokens: int = 4096, logprob_chunk: int | None = 1024, max_grad_norm: float = 1.0):
        self.demos = [(list(p), list(c)) for p, c in demonstrations if p and c]
        if not self.demos:
            raise ValueError(f"policy {policy.name!r}: no demonstration with a prompt and a completion to train on")
        self.policy, self.batch_size = policy, batch_size
        self.micro_batch_tokens, self.logprob_chunk, self.max_grad_norm = micro_batch_tokens, logprob_chunk, max_grad_norm
        self.params = list(policy.trainable_parameters())
        self.optimizer: torch.optim.Optimizer | None = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.heads = split_model(policy.model)
        self.losses: list[float] = []
        self.tokens = 0
        self.seconds = 0.0

    def _batch(self) -> list[Demonstration]:
        batch = []
        while len(batch) < self.batch_size:
            if not self.order:
                self.order = list(range(len(self.demos)))
                self.rng.shuffle(self.order)
            batch.append(self.demos[self.order.pop()])
        return batch

    def run(self, steps: int) -> list[float]:
        """``steps`` more optimizer steps; their losses."""
        if self.optimizer is None:
            raise RuntimeError(f"policy {self.policy.name!r}: this warm-up is closed")
        model, policy, optimizer = self.policy.model, self.policy, self.optimizer
        was_training = model.training
        t0 = time.perf_counter()
        start = len(self.losses)
        try:
            with policy.activate():
                model.train(True)
                for _ in range(steps):
                    batch = self._batch()
                    seqs = [p + c for p, c in batch]
                    packing = pack(seqs, [len(p) for p, _ in batch], self.micro_batch_tokens)
                    n = len(packing.sample)
                    optimizer.zero_grad(set_to_none=True)
                    total = 0.0
                    for group in passes(packing, max_tokens=self.micro_batch_tokens):
                        group = group.to(policy.device)
                        temps = torch.ones(len(group.pairs))
                        logp, _ = token_logprobs_packed(model, group, temps, chunk=self.logprob_chunk, heads=self.heads)
                        loss = -logp.sum() / n  # the batch's mean over its completion tokens
                        loss.backward()
                        total += float(loss.detach())
                    torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
                    optimizer.step()
                    self.losses.append(total)
                    self.tokens += n
        finally:
            optimizer.zero_grad(set_to_none=True)  # no gradients held between parts
            model.train(was_training)
            if len(self.losses) > start:
                policy.mark_updated()
            self.seconds += time.perf_counter() - t0
        return self.losses[start:]

    def state_dict(self) -> dict[str, Any]:
        """Where this run stands (its optimizer's moments, its draw of demonstrations, its
        losses), for a warm-up stopped part-way to go on from (``load_state_dict``)."""
        if self.optimizer is None:
            raise RuntimeError(f"policy {self.policy.name!r}: this warm-up is closed")
        return {"optimizer": self.optimizer.state_dict(), "rng": self.rng.getstate(), "order": list(self.order),
                "losses": list(self.losses), "tokens": self.tokens, "seconds": self.seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state_dict()``'s record: the next step is the one the stopped run would have taken."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])
        self.losses = list(state["losses"])
        self.tokens, self.seconds = int(state["tokens"]), float(state["seconds"])

    def close(self) -> dict[str, Any]:
        """Drop the optimizer; the run's record: the loss of every step, the tokens trained on,
        the seconds its steps took and the number of demonstrations."""
        self.optimizer = None
        self.params = []
        return {"losses": list(self.losses), "tokens": self.tokens, "seconds": self.seconds, "demonstrations": len(self.demos)}


def supervised_steps(
    policy: Any,
    demonstrations: Sequence[Demonstration],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    micro_batch_tokens: int = 4096,
    logprob_chunk: int | None = 1024,
    max_grad_norm: float = 1.0,
    abort: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """``steps`` steps of one ``SupervisedRun`` in one call; ``abort`` is asked before each step."""
    run = SupervisedRun(policy, demonstrations, batch_size, lr, seed, micro_batch_tokens, logprob_chunk, max_grad_norm)
    try:
        for step in range(steps):
            if abort is not None and abort():
                raise StepAbandoned(f"policy {policy.name!r}: warm-up stopped before step {step + 1} of {steps}")
            run.run(1)
    finally:
        got = run.close()
    return got
