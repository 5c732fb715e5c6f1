"""Normalisers: the second half of a credit pipeline (method + normaliser, named in YAML).

A credit pipeline is ``credit: {method: <name>, normaliser: <none|group|global|agent>}``.
The *method* computes raw scores (``RawScores``: one per turn [N] and one per episode [E]);
the *normaliser* turns them into advantages with a mean and a standard deviation taken over
*segments*.  ``normalise_credit`` is the batch-level entry point every method calls; the
four levels, precisely (b = task group, i = episode, t = turn, k = agent):

    none    no statistics: A^{i,t} = x^{i,t}, the raw per-turn score (centred by nothing;
            for RLOO the score already carries the leave-one-out baseline).
    group   GRPO's trajectory level (arXiv 2402.03300).  One sample per episode: the
            method's episode score s_i (for every built-in method the mean of the
            episode's turn scores, or the episode reward for an episode with no turns).
            Mean/std per task group b over its G episodes (turn-less episodes count);
            every turn of episode i gets A_i = (s_i − μ_b) / (σ_b + ε).  Differences
            between turns of one episode are averaged away (DrMAS "vanilla GRPO").
    agent   Dr. MAS (arXiv 2602.08847) Eq. 5.  Mean/std per (task group b, agent k) over
            the multiset of all k's turns in the G episodes of b (an agent invoked three
            times in an episode contributes three samples); A^{i,t} = (x^{i,t} − μ_{b,k})
            / (σ_{b,k} + ε).
    global  One mean/std over *all turns of the batch*, pooling every step of every agent
            of every task: the "global step-level normalisation" control arm of DrMAS
            issue #81 (also REINFORCE++-style batch whitening).  Turn-weighted: an episode
            with more turns contributes more samples; turn-less episodes contribute none.

All turns take part in the statistics, trainable or not (the learner drops non-trainable
turns afterwards); ``scale_by_std=False`` only centres (Dr. GRPO, verl
``norm_adv_by_std_in_grpo=False``).

The same levels exist as flat tensor functions ``fn(values, *, group_ids=None,
agent_ids=None, scale_by_std=True, eps=1e-6) -> Normalised`` in ``NORMALISERS`` (``group``
there normalises whatever values it is given per ``group_ids``; ``normalise_credit`` feeds
it the [E] episode scores).

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
B task groups, K agents (len(agent_names)), E episodes, N flattened turns.
"""

from __future__ import annotations

import typing
from typing import Any, Callable, Literal, NamedTuple

import torch
from pydantic import Field

from mas.types import CreditBatch

NormaliserName = Literal["none", "group", "global", "agent"]
NORMALISER_NAMES: tuple[str, ...] = typing.get_args(NormaliserName)


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


# --- config fields shared by the method configs -------------------------------------------

_NORMALISER_DOC = (
    "Statistics that turn the method's raw scores into advantages: 'none' (raw scores), "
    "'group' (per task group over episodes, one sample per episode: GRPO), 'agent' (per task "
    "group and agent over that agent's turns: Dr. MAS), 'global' (one mean/std over all turns "
    "of the batch)."
)


def normaliser_field(default: NormaliserName, note: str = "") -> Any:
    """``Field`` for a method config's ``normaliser``; ``note`` adds the method's default."""
    return Field(default, description=f"{_NORMALISER_DOC} {note}".strip())


def scale_by_std_field(note: str = "") -> Any:
    """``Field`` for ``scale_by_std`` (default True)."""
    return Field(True, description=f"Divide by (segment std + eps) after centring; False only centres (Dr. GRPO, verl norm_adv_by_std_in_grpo=False). {note}".strip())


def eps_field(note: str = "") -> Any:
    """``Field`` for ``eps`` (default 1e-6, >= 0, finite)."""
    return Field(1e-6, ge=0.0, allow_inf_nan=False, description=f"Added to the std before dividing (verl: 1e-6) [C]. {note}".strip())


# --- the pipeline step -------------------------------------------------------------------------


class RawScores(NamedTuple):
    """What a credit method hands to the normaliser.

    ``turn`` is the score x^{i,t} of every flattened turn (used by none, agent and global);
    ``episode`` is the one sample per episode (used by group).  Methods keep them consistent:
    an episode's score is the mean of its turns' scores (any value for a turn-less episode).
    """

    turn: torch.Tensor  # [N] float64
    episode: torch.Tensor  # [E] float64


class CreditNormalised(NamedTuple):
    """Result of ``normalise_credit``, float64."""

    values: torch.Tensor  # [N] advantages
    mean: torch.Tensor  # [N] mean of the turn's segment (0 for none / a singleton)
    std: torch.Tensor  # [N] ddof-1 std of the turn's segment (1 for none / a singleton)
    count: torch.Tensor  # [N] long, samples in the turn's segment (episodes for group, turns otherwise; 1 for none)
    episode_values: torch.Tensor | None  # [E] per-episode advantage for group; the raw episode scores for none; None otherwise


def normalise_credit(batch: CreditBatch, scores: RawScores, normaliser: str, *, scale_by_std: bool = True, eps: float = 1e-6) -> CreditNormalised:
    """Turn a method's raw scores into per-turn advantages with the named normaliser.

    See the module docstring for the exact segments of each level.  Raises ValueError for
    an unknown name (listing the valid ones) or mis-shaped scores.
    """
    if scores.turn.shape != (batch.num_turns,) or scores.episode.shape != (batch.num_episodes,):
        raise ValueError(
            f"raw scores of shape turn {tuple(scores.turn.shape)}, episode {tuple(scores.episode.shape)}; "
            f"expected ({batch.num_turns},) and ({batch.num_episodes},)"
        )
    fn = get_normaliser(normaliser)
    turn = scores.turn.to(torch.float64)  # [N]
    if normaliser == "group":
        ep = batch.episode_ids  # [N]
        norm = fn(scores.episode.to(torch.float64), group_ids=batch.episode_group_ids, scale_by_std=scale_by_std, eps=eps)  # [E]
        return CreditNormalised(norm.values[ep], norm.mean[ep], norm.std[ep], norm.count[ep], norm.values)
    if normaliser == "agent":
        norm = normalise_segments(
            turn, agent_group_key(batch.group_ids, batch.agent_ids, num_agents=max(len(batch.agent_names), 1)), scale_by_std=scale_by_std, eps=eps
        )
    else:  # none, global
        norm = fn(turn, scale_by_std=scale_by_std, eps=eps)
    episode_values = scores.episode.to(torch.float64) if normaliser == "none" else None
    return CreditNormalised(norm.values, norm.mean, norm.std, norm.count, episode_values)


# --- token-weighted whitening (REINFORCE++, MAPPA's per-agent critic rewards) -----------------------


class Whitened(NamedTuple):
    """Result of ``weighted_whiten``, float64; every field is [M]."""

    values: torch.Tensor  # (x − mean) / std, 0 where the weight is 0
    mean: torch.Tensor  # weighted mean of the element's segment
    std: torch.Tensor  # weighted population std of the element's segment (0 for a constant segment)
    weight: torch.Tensor  # total weight of the element's segment


def weighted_whiten(
    values: torch.Tensor,
    weights: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-8,
    num_segments: int | None = None,
    variance_floor: bool = True,
) -> Whitened:
    """(x − μ_s) / d_s with weighted mean μ_s and population variance σ²_s per segment.

    d_s = sqrt(max(σ²_s, eps)) with ``variance_floor`` (OpenRLHF's masked whitening, used by
    REINFORCE++), else σ_s + eps (the other normalisers' convention, used by the critic).

    μ_s = Σ w x / Σ w, σ²_s = Σ w (x − μ_s)² / Σ w over the segment's elements (OpenRLHF's
    masked whitening when w counts tokens).  Elements of weight 0 get 0; a segment whose
    weighted elements are all equal gives exactly 0.  [M] in, [M] out.
    """
    if not (values.shape == weights.shape == segment_ids.shape) or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)}, weights {tuple(weights.shape)} and segment_ids {tuple(segment_ids.shape)} must be equal 1-d shapes")
    if num_segments is None:
        num_segments = int(segment_ids.max()) + 1 if segment_ids.numel() else 0
    x = values.to(torch.float64)  # [M]
    w = weights.to(torch.float64)  # [M]
    seg = segment_ids.to(torch.long)  # [M]
    zeros = torch.zeros(num_segments, dtype=torch.float64, device=x.device)
    W = zeros.clone().index_add_(0, seg, w)  # [S]
    mean = zeros.clone().index_add_(0, seg, w * x) / W.clamp(min=torch.finfo(torch.float64).tiny)  # [S]
    live = w > 0  # [M] elements that carry tokens
    inf = torch.full_like(x, torch.inf)  # [M]
    vmax = torch.full((num_segments,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, seg, torch.where(live, x, -inf), reduce="amax")  # [S]
    vmin = torch.full((num_segments,), torch.inf, dtype=torch.float64).scatter_reduce_(0, seg, torch.where(live, x, inf), reduce="amin")  # [S]
    constant = vmax == vmin  # [S] all weighted values equal
    mean = torch.where(constant, vmax, mean)  # [S] exact
    dev = x - mean[seg]  # [M]
    var = zeros.clone().index_add_(0, seg, w * dev * dev) / W.clamp(min=torch.finfo(torch.float64).tiny)  # [S] population
    var = torch.where(constant, torch.zeros_like(var), var)  # [S]
    if scale_by_std:
        std_eps = torch.sqrt(var.clamp(min=eps)) if variance_floor else torch.sqrt(var) + eps  # [S]
        denom = std_eps[seg]  # [M] OpenRLHF: rsqrt(clamp(var, 1e-8))
        out = dev / torch.where(denom > 0, denom, torch.ones_like(denom))  # [M] (denom is 0 only for eps = 0 and a zero variance)
    else:
        out = dev  # [M]
    out = torch.where(live & ~constant[seg], out, torch.zeros_like(out))  # [M]
    return Whitened(values=out, mean=mean[seg], std=torch.sqrt(var)[seg], weight=W[seg])
