"""Composable advantage normalisers: pure tensor functions over segment ids.

A normaliser maps M values to M normalised values using a mean and a standard deviation
taken over *segments* of the values (all values sharing a segment id):

    none    no segments: values are returned unchanged
    global  one segment holding every value (REINFORCE++-style whitening, or the
            "global step-level normalisation" control arm of Dr. MAS issue #81)
    group   one segment per task group (GRPO, arXiv 2402.03300): pass per-episode values
            [E] with ``episode_group_ids`` to normalise over the G episodes of each task
    agent   one segment per (task group, agent) pair (Dr. MAS, arXiv 2602.08847): pass
            per-turn values [N] with ``group_ids`` and ``agent_ids``; an agent invoked
            several times in an episode contributes one sample per invocation

Every normaliser has the same signature
``fn(values, *, group_ids=None, agent_ids=None, scale_by_std=True, eps=1e-6) -> Normalised``
and is listed in ``NORMALISERS`` under its name, so a credit pipeline can name one in YAML.

Statistics follow verl's ``compute_grpo_outcome_advantage`` [C] (as vendored in the
DrMAS repo):
  * std is ``torch.std``, i.e. unbiased (ddof = 1); eps = 1e-6 is added to the std.
  * a segment with one element gets mean 0 and std 1, so its value comes back raw
    (divided by 1 + eps when scaling), not as 0.  This is a verl quirk kept on purpose.
  * ``scale_by_std=False`` only centres (verl ``norm_adv_by_std_in_grpo=False``,
    Dr. GRPO arXiv 2503.20783).
Deliberate deviation [A]: a segment of two or more *identical* values gets exactly 0.
verl computes the mean in float32 and divides the rounding residue by eps, which can give
values like 0.06 for a constant group (e.g. three copies of 0.9).  Here the statistics are
computed in float64 and a constant segment's mean is set to its value, so zero-variance
groups give exactly 0 (DESIGN "Numerical safety").  With eps = 0 a zero std gives 0, not
NaN.

Shapes: M values being normalised (E episodes or N turns), S segments,
B task groups, K agents (len(agent_names)).
"""

from __future__ import annotations

from typing import Callable, Literal, NamedTuple

import torch
from pydantic import Field

from .base import CreditConfigBase

NormaliserName = Literal["none", "group", "global", "agent"]


class Normalised(NamedTuple):
    """Result of a normaliser; every field is aligned with the input values ([M])."""

    values: torch.Tensor  # [M] normalised values, dtype of the input
    mean: torch.Tensor  # [M] mean of the element's segment (0 for a singleton segment)
    std: torch.Tensor  # [M] ddof-1 std of the element's segment (1 for a singleton segment)
    count: torch.Tensor  # [M] long, number of elements in the element's segment


class SegmentStats(NamedTuple):
    """Per-segment statistics, float64."""

    mean: torch.Tensor  # [S]
    std: torch.Tensor  # [S]
    count: torch.Tensor  # [S] long


def segment_stats(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int | None = None) -> SegmentStats:
    """Mean and ddof-1 std of ``values`` per segment, with verl's singleton rule.

    A segment of one element gets mean 0 and std 1 [C]; a segment whose elements are all
    equal gets its exact value as mean and std 0 [A, see module docstring]; an empty
    segment gets mean 0 and std 1 (it is never gathered).
    """
    if values.shape != segment_ids.shape or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)} and segment_ids {tuple(segment_ids.shape)} must be equal 1-d shapes")
    if num_segments is None:
        num_segments = int(segment_ids.max()) + 1 if segment_ids.numel() else 0
    v = values.to(torch.float64)  # [M]
    seg = segment_ids.to(torch.long)  # [M]
    count = torch.bincount(seg, minlength=num_segments)  # [S]
    total = torch.zeros(num_segments, dtype=torch.float64, device=v.device).index_add_(0, seg, v)  # [S]
    mean = total / count.clamp(min=1)  # [S]
    dev = v - mean[seg]  # [M]
    sq = torch.zeros(num_segments, dtype=torch.float64, device=v.device).index_add_(0, seg, dev * dev)  # [S]
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [S] ddof = 1
    vmax = torch.full((num_segments,), -torch.inf, dtype=torch.float64, device=v.device)
    vmax = vmax.scatter_reduce_(0, seg, v, reduce="amax", include_self=True)  # [S]
    vmin = torch.full((num_segments,), torch.inf, dtype=torch.float64, device=v.device)
    vmin = vmin.scatter_reduce_(0, seg, v, reduce="amin", include_self=True)  # [S]
    constant = (count > 1) & (vmax == vmin)  # [S] zero-variance segment: centre exactly to 0
    mean = torch.where(constant, vmax, mean)  # [S]
    std = torch.where(constant, torch.zeros_like(std), std)  # [S]
    lonely = count <= 1  # [S] singleton (or empty): verl's mean 0, std 1
    mean = torch.where(lonely, torch.zeros_like(mean), mean)  # [S]
    std = torch.where(lonely, torch.ones_like(std), std)  # [S]
    return SegmentStats(mean=mean, std=std, count=count)


def normalise_segments(
    values: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    num_segments: int | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """(x − mean_s) / (std_s + eps) per segment s, or x − mean_s without ``scale_by_std``."""
    stats = segment_stats(values, segment_ids, num_segments)
    seg = segment_ids.to(torch.long)  # [M]
    mean = stats.mean[seg]  # [M]
    std = stats.std[seg]  # [M]
    centred = values.to(torch.float64) - mean  # [M]
    if scale_by_std:
        denom = std + eps  # [M]
        # denom is 0 only for a constant segment with eps = 0, where centred is exactly 0
        out = centred / torch.where(denom > 0, denom, torch.ones_like(denom))  # [M]
    else:
        out = centred  # [M]
    dtype = values.dtype if values.is_floating_point() else torch.float32
    return Normalised(values=out.to(dtype), mean=mean.to(dtype), std=std.to(dtype), count=stats.count[seg])


def normalise_none(
    values: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    agent_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """Identity: values unchanged, mean 0, std 1, each element its own 'segment' of size 1."""
    dtype = values.dtype if values.is_floating_point() else torch.float32
    return Normalised(
        values=values.to(dtype),
        mean=torch.zeros_like(values, dtype=dtype),
        std=torch.ones_like(values, dtype=dtype),
        count=torch.ones_like(values, dtype=torch.long),
    )


def normalise_global(
    values: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    agent_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """One mean and std over all M values (ids are ignored)."""
    seg = torch.zeros(values.shape, dtype=torch.long, device=values.device)  # [M]
    return normalise_segments(values, seg, num_segments=1, scale_by_std=scale_by_std, eps=eps)


def normalise_group(
    values: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    agent_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """Mean and std per task group (GRPO): ``group_ids`` [M] gives each value's group.

    For GRPO pass per-episode scores [E] with ``batch.episode_group_ids``, so each episode
    is one sample whatever its number of turns.
    """
    if group_ids is None:
        raise ValueError("normalise_group needs group_ids")
    return normalise_segments(values, group_ids, scale_by_std=scale_by_std, eps=eps)


def agent_group_key(group_ids: torch.Tensor, agent_ids: torch.Tensor, num_agents: int | None = None) -> torch.Tensor:
    """Combined segment id of a (task group, agent) pair: group * K + agent.  [M] long."""
    if num_agents is None:
        num_agents = int(agent_ids.max()) + 1 if agent_ids.numel() else 1
    return group_ids.to(torch.long) * num_agents + agent_ids.to(torch.long)  # [M]


def normalise_agent(
    values: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    agent_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """Mean and std per (task group, agent) over all that agent's turns (Dr. MAS Eq. 5).

    verl's key is ``f"{uid}_{agent_id}"`` [C]; here it is ``group * K + agent``.
    """
    if group_ids is None or agent_ids is None:
        raise ValueError("normalise_agent needs group_ids and agent_ids")
    key = agent_group_key(group_ids, agent_ids)  # [M]
    return normalise_segments(values, key, scale_by_std=scale_by_std, eps=eps)


Normaliser = Callable[..., Normalised]

NORMALISERS: dict[str, Normaliser] = {
    "none": normalise_none,
    "global": normalise_global,
    "group": normalise_group,
    "agent": normalise_agent,
}


def get_normaliser(name: str) -> Normaliser:
    """The normaliser called ``name``; an unknown name is a ValueError listing valid ones."""
    try:
        return NORMALISERS[name]
    except KeyError:
        raise ValueError(f"unknown normaliser {name!r}; valid: {sorted(NORMALISERS)}") from None


class NormaliserConfig(CreditConfigBase):
    """A normaliser as a config section, for credit pipelines that compose one."""

    kind: NormaliserName = Field("agent", description="Which segments share a mean/std: none, global, group (per task) or agent (per task and agent).")
    scale_by_std: bool = Field(True, description="Divide by (std + eps) after centring; False only centres (Dr. GRPO style).")
    eps: float = Field(1e-6, ge=0.0, allow_inf_nan=False, description="Added to the std before dividing (verl: 1e-6).")

    def apply(self, values: torch.Tensor, *, group_ids: torch.Tensor | None = None, agent_ids: torch.Tensor | None = None) -> Normalised:
        return NORMALISERS[self.kind](values, group_ids=group_ids, agent_ids=agent_ids, scale_by_std=self.scale_by_std, eps=self.eps)
