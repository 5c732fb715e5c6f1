"""Zero-variance groups: task groups whose episodes all scored the same (CREDIT_SPEC.md §8c).

A group of G episodes of one task whose outcome rewards are all equal carries no outcome
signal: every episode-level baseline gives its turns 0 (GRPO's and Dr. MAS's constant rule),
yet its tokens still count in the loss's divisor (``token_mean``) and dilute the signal of the
groups that have one.  DAPO's dynamic sampling (arXiv 2503.14476, "dynamic sampling") keeps
only groups with 0 < accuracy < 1 and samples more until the batch is full; this is the
filtering half: the constant groups are dropped from the update (``Credit.train_mask``) and
counted, no group is re-sampled, so the update's divisor is that of the groups that remain
(the loss aggregation's, ``mas.learning.learner.loss_norm``, over the kept turns).

Shapes: B task groups, E episodes, N flattened turns.
"""

from __future__ import annotations

import torch

from mas.types import Credit, CreditBatch

__all__ = ["constant_groups", "drop_constant_groups"]


def constant_groups(batch: CreditBatch, atol: float = 0.0) -> torch.Tensor:
    """[B] bool: the task groups whose episode rewards all lie within ``atol`` of each other
    (a group of one episode is constant)."""
    b = int(batch.episode_group_ids.max()) + 1 if batch.num_episodes else 0
    r = batch.episode_rewards  # [E]
    lo = torch.full((b,), float("inf"), dtype=r.dtype).scatter_reduce(0, batch.episode_group_ids, r, "amin")  # [B]
    hi = torch.full((b,), float("-inf"), dtype=r.dtype).scatter_reduce(0, batch.episode_group_ids, r, "amax")  # [B]
    return (hi - lo) <= atol  # [B]


def drop_constant_groups(batch: CreditBatch, credit: Credit) -> tuple[Credit, int]:
    """``credit`` with the turns of constant groups left out of the update (its ``train_mask``;
    advantages, breakdown and notes unchanged), and how many groups that was."""
    constant = constant_groups(batch)  # [B]
    keep = ~constant[batch.group_ids]  # [N]
    if credit.train_mask is not None:
        keep = keep & credit.train_mask
    return Credit(credit.advantages, credit.breakdown, keep, credit.notes), int(constant.sum())
