"""Supervised steps on one policy: next-token loss on demonstration completions (the warm-up).

The format warm-up (``mas.training.warmup``) fine-tunes each trainable policy on demonstrations of its
agents' turns before RL.  This module is the learner-level part: given (prompt, completion)
token pairs, take ``steps`` AdamW steps of the mean negative log-likelihood of the completion
tokens, scored like the RL learner scores turns (prefix-tree packing, chunked logits,
``mas.learning.logprobs``), on the policy's own trainable weights (its LoRA adapter, or all weights).
The optimizer is the warm-up's own and is dropped afterwards, so RL starts with fresh
optimizer state.
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
    """``steps`` steps of ``batch_size`` demonstrations drawn at random (``seed``) with
    replacement across epochs (each epoch a fresh permutation); returns the loss of every step,
    the tokens trained on and the seconds taken.  ``policy``: a ``PolicyHandle`` (activate,
    trainable_parameters, model, device, mark_updated).  ``abort`` is asked before each step."""
    demos = [(list(p), list(c)) for p, c in demonstrations if p and c]
    if not demos:
        raise ValueError(f"policy {policy.name!r}: no demonstration with a prompt and a completion to train on")
    params = list(policy.trainable_parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    model = policy.model
    heads = split_model(model)
    losses: list[float] = []
    tokens = 0
    t0 = time.perf_counter()
    was_training = model.training
    try:
        with policy.activate():
            model.train(True)
            for step in range(steps):
                if abort is not None and abort():
                    raise StepAbandoned(f"policy {policy.name!r}: warm-up stopped before step {step + 1} of {steps}")
                batch = []
                while len(batch) < batch_size:
                    if not order:
                        order = list(range(len(demos)))
                        rng.shuffle(order)
                    batch.append(demos[order.pop()])
                seqs = [p + c for p, c in batch]
                packing = pack(seqs, [len(p) for p, _ in batch], micro_batch_tokens)
                n = len(packing.sample)
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for group in passes(packing, max_tokens=micro_batch_tokens):
                    group = group.to(policy.device)
                    temps = torch.ones(len(group.pairs))
                    logp, _ = token_logprobs_packed(model, group, temps, chunk=logprob_chunk, heads=heads)  # [Kp]
                    loss = -logp.sum() / n  # the batch's mean over its completion tokens
                    loss.backward()
                    total += float(loss.detach())
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
                optimizer.step()
                losses.append(total)
                tokens += n
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
        if losses:
            policy.mark_updated()
    return {"losses": losses, "tokens": tokens, "seconds": time.perf_counter() - t0, "demonstrations": len(demos)}
