"""The padded reference of the learner's packed PPO path (STYLE.md habit 3).

``mas.learning.learner`` scores an update batch packed (every distinct token through the model
once, completion tokens as a flat [K] list) and takes the PPO-clip surrogate over those tokens
(``ppo_clip_tokens``).  This module does the same the obvious way, one right-padded row per turn:
``collate`` pads the turns, ``token_logprobs`` scores each row whole, ``ppo_clip_loss`` applies the
surrogate and the aggregation over [N, S] tensors as the learner's module docstring writes them,
and ``slow_ppo_loss`` is the same again as a Python loop over turns and tokens.  The tests check
that the packed path gives these numbers (tests/test_learner.py, tests/test_scoring.py).

Shapes:
    N  turns (samples) in a batch
    S  padded sequence length (prompt + completion, right-padded)
    V  vocabulary size

Alignment: every ``[N, S]`` per-token tensor is aligned to the token being predicted.
Column ``t`` holds the value for ``input_ids[:, t]`` given ``input_ids[:, :t]``, so column 0
(which has no context) is always 0 and masked.  ``completion_mask[:, t]`` is 1 exactly when
``input_ids[:, t]`` is a completion token.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mas.learning.logprobs import TokenLogprob
from mas.learning.learner import LOSS_AGGS, PAD_ID, TrainSample, kl_penalty, loss_norm


def collate(samples: list[TrainSample], pad_id: int = PAD_ID) -> dict[str, torch.Tensor]:
    """Right-pad samples into one batch; per-token tensors are aligned to the predicted token."""
    if not samples:
        raise ValueError("collate: no samples")
    for i, s in enumerate(samples):
        if not s.prompt_ids:
            raise ValueError(f"sample {i}: empty prompt_ids; the first completion token needs a context")
        if len(s.old_logprobs) != len(s.completion_ids):
            raise ValueError(
                f"sample {i}: {len(s.old_logprobs)} old_logprobs for {len(s.completion_ids)} completion tokens"
            )
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    n, seq = len(samples), max(lengths)
    input_ids = torch.full((n, seq), pad_id, dtype=torch.long)  # [N, S]
    attention_mask = torch.zeros((n, seq), dtype=torch.long)  # [N, S]
    completion_mask = torch.zeros((n, seq), dtype=torch.bool)  # [N, S]
    old_logprobs = torch.zeros((n, seq), dtype=torch.float32)  # [N, S]
    for i, s in enumerate(samples):
        p, total = len(s.prompt_ids), lengths[i]
        input_ids[i, :total] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
        attention_mask[i, :total] = 1
        completion_mask[i, p:total] = True
        old_logprobs[i, p:total] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "old_logprobs": old_logprobs,
        "advantages": torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32),  # [N]
        "temperatures": torch.tensor(
            [s.temperature if s.temperature > 0 else 1.0 for s in samples], dtype=torch.float32
        ),  # [N]
    }


ENTROPY_CHUNK = 256  # positions per chunk of the entropy diagnostic


def token_logprobs(
    model: nn.Module, batch: dict[str, torch.Tensor], entropy_chunk: int = ENTROPY_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob and entropy of each token under ``model`` at the sampling temperature.

    One forward pass; ``logits / T`` so that an unchanged policy reproduces the sampling
    logprobs exactly (ratio 1).  Computed in float32 as gather − logsumexp, which keeps no
    [N, S, V] log-softmax alive for backward.

    Memory (the [N, S, V] logits dominate at large V): at most one float32 copy of the
    model's logits is made (none when they are float32 and every T is 1; a half-precision
    output is converted, then scaled in place), and it is the only [N, S, V] tensor kept for
    backward.  ``TokenLogprob`` gives autograd's gradient of gather − logsumexp with one
    [N, S, V] temporary instead of three.  All S positions are scored (the last one predicts
    nothing and is dropped from the [N, S] result), so no gradient is padded back from a
    sliced [N, S-1, V] view.  Entropy is a detached diagnostic computed under no_grad over at
    most ``entropy_chunk`` positions at a time, so its softmax temporaries are
    [entropy_chunk, V].
    """
    if entropy_chunk < 1:
        raise ValueError(f"entropy_chunk must be >= 1 (found {entropy_chunk})")
    input_ids = batch["input_ids"]  # [N, S]
    raw = model(input_ids=input_ids, attention_mask=batch["attention_mask"]).logits  # [N, S, V]
    temps = batch["temperatures"].to(device=raw.device, dtype=torch.float32)  # [N]
    scale = bool((temps != 1.0).any())
    if raw.dtype != torch.float32:
        logits = raw.float()  # [N, S, V]  our own copy: scale it in place
        if scale:
            logits.div_(temps[:, None, None])
    else:
        logits = raw / temps[:, None, None] if scale else raw  # [N, S, V]
    del raw  # the model's own (half-precision) logits are not needed for backward
    # position t predicts t+1; the last position predicts nothing (any in-vocabulary id, dropped)
    targets = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)  # [N, S]
    logp, lse = TokenLogprob.apply(logits, targets)  # [N, S] each
    entropy = _entropy(logits[:, :-1], lse[:, :-1], entropy_chunk)  # [N, S-1]
    zero = logp.new_zeros(logp.shape[0], 1)  # [N, 1]  column 0 predicts nothing
    return torch.cat([zero, logp[:, :-1]], dim=1), torch.cat([zero, entropy], dim=1)  # [N, S] each


@torch.no_grad()
def _entropy(logits: torch.Tensor, lse: torch.Tensor, chunk: int) -> torch.Tensor:
    """``lse - sum(softmax(logits) * logits, -1)`` ([N, L] from [N, L, V]), ``chunk`` positions at a time."""
    n, length = lse.shape
    out = torch.empty((n, length), dtype=lse.dtype, device=lse.device)  # [N, L]
    for i in range(n):
        for j in range(0, length, chunk):
            x = logits[i, j : j + chunk]  # [c, V]
            p = torch.softmax(x, dim=-1)  # [c, V]
            out[i, j : j + chunk] = lse[i, j : j + chunk] - p.mul_(x).sum(-1)
            del p
    return out


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    norm: float | None = None,
    max_tokens: int | None = None,
    kl_estimator: str = "k3",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip surrogate with an optional KL term, ``kl_estimator`` (mas.learning.learner's docstring).

    ``norm`` divides the aggregated sum; by default it is ``loss_norm`` of this call's turns
    (``max_tokens`` is dr_grpo's constant).  Pass the whole update batch's divisor when
    calling per micro-batch.  Stats (token means over completion tokens): ``pg_loss``
    (the surrogate alone, same aggregation), ``kl``, ``clip_frac`` (share of tokens where the
    clipped branch is the active one), ``ratio``, and ``tokens``.
    """
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; valid: {list(LOSS_AGGS)}")
    mask = completion_mask.to(logprobs.dtype)  # [N, S]
    log_ratio = (logprobs - old_logprobs).masked_fill(mask == 0, 0.0)  # [N, S]
    ratio = torch.exp(log_ratio)  # [N, S]
    adv = advantages.to(logprobs.dtype)[:, None]  # [N, 1]
    pg_unclipped = -ratio * adv  # [N, S]
    pg_clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # [N, S]
    pg = torch.maximum(pg_unclipped, pg_clipped)  # [N, S]  = -min(ratio*A, clip(ratio)*A)
    per_token = pg
    kl = torch.zeros_like(pg)  # [N, S]
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator).masked_fill(mask == 0, 0.0)  # [N, S]
        per_token = pg + kl_coef * kl

    lengths = mask.sum(-1)  # [N]
    if norm is None:
        norm = float(loss_norm([int(n) for n in lengths.tolist()], loss_agg, max_tokens))

    def agg(x: torch.Tensor) -> torch.Tensor:
        if loss_agg == "seq_mean":
            per_seq = (x * mask).sum(-1) / lengths.clamp(min=1.0)  # [N]  token mean of each turn
            return per_seq.sum() / norm
        return (x * mask).sum() / norm  # token_mean, seq_mean_token_sum and dr_grpo differ only in norm

    loss = agg(per_token)

    with torch.no_grad():
        tokens = mask.sum()
        denom = tokens.clamp(min=1.0)
        stats = {
            "pg_loss": float(agg(pg)),
            "kl": float((kl * mask).sum() / denom),
            "clip_frac": float(((pg_clipped > pg_unclipped).to(mask.dtype) * mask).sum() / denom),
            "ratio": float((ratio * mask).sum() / denom),
            "tokens": float(tokens),
        }
    return loss, stats


def slow_ppo_loss(logp, old, adv, mask, lo, hi, agg, ref=None, kl_coef=0.0, max_tokens=None):
    """The loss as a loop straight from the formula, on nested lists (``[N][S]`` as ``ppo_clip_loss``'s
    tensors, ``adv`` [N]); the KL term is k3."""
    seq_means, seq_sums, total, count = [], [], 0.0, 0
    for i in range(len(logp)):
        row = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            r = math.exp(logp[i][t] - old[i][t])
            a = adv[i]
            term = -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
            if ref is not None:
                dd = ref[i][t] - logp[i][t]
                term += kl_coef * (math.exp(dd) - dd - 1)
            row.append(term)
        total, count = total + sum(row), count + len(row)
        if row:
            seq_means.append(sum(row) / len(row))
            seq_sums.append(sum(row))
    if agg == "token_mean":
        return total / count
    if agg == "seq_mean":
        return sum(seq_means) / len(seq_means)
    if agg == "seq_mean_token_sum":
        return sum(seq_sums) / len(seq_sums)
    return sum(seq_sums) / (len(seq_sums) * max_tokens)  # dr_grpo
