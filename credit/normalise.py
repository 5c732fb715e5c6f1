"""Normalisers: the second half of a credit pipeline (method + normaliser, named in YAML).

A credit pipeline is ``credit: {method: <name>, normaliser: <none|group|group_batch_std|global|agent>}``.
The *method* computes raw scores (``RawScores``: one per turn [N] and one per episode [E]);
the *normaliser* turns them into advantages with a mean and a standard deviation taken over
*segments*.  ``normalise_credit`` is the batch-level entry point every method calls; the
five levels, precisely (b = task group, i = episode, t = turn, k = agent):

    none    no statistics: A^{i,t} = x^{i,t}, the raw per-turn score (centred by nothing;
            for RLOO the score already carries the leave-one-out baseline).
    group   GRPO's trajectory level (arXiv 2402.03300).  One sample per episode: the
            method's episode score s_i (for every built-in method the mean of the
            episode's turn scores, or the episode reward for an episode with no turns).
            Mean/std per task group b over its G episodes (turn-less episodes count);
            every turn of episode i gets A_i = (s_i − μ_b) / (σ_b + ε).  Differences
            between turns of one episode are averaged away (DrMAS "vanilla GRPO").
    group_batch_std  TRL's ``scale_rewards="batch"``: one sample per episode as ``group``,
            centred by the task group's mean μ_b but divided by ONE ddof-1 std of the
            episode scores over the whole batch: A_i = (s_i − μ_b) / (σ_batch + ε).
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
DrMAS repo) where verl is well defined:
  * std is ``torch.std``, i.e. unbiased (ddof = 1); eps = 1e-6 is added to the std.
  * ``scale_by_std=False`` only centres (verl ``norm_adv_by_std_in_grpo=False``,
    Dr. GRPO arXiv 2503.20783).
Deliberate deviations [A], one rule for all of them: a segment without spread gets 0.
  * A segment of two or more *identical* values gets exactly 0.  verl computes the mean in
    float32 and divides the rounding residue by eps, which can give values like 0.06 for a
    constant group (e.g. three copies of 0.9).
  * A segment of ONE value (a one-episode task group, an agent that spoke once in its
    group) also gets 0, with mean = that value and std = 0 in the breakdown.  verl gives it
    mean 0 and std 1, so its raw value comes back divided by 1 + eps beside unit-variance
    segments: a reward-scaled advantage next to standardised ones, and a baseline that
    the sample itself cannot have.  A lone sample has no comparison, exactly like a
    zero-variance group, so it carries no group-relative signal.
  * Statistics are computed in float64, with every segment's values scaled by their largest
    magnitude before they are summed or squared, so rewards of any finite magnitude (1e155
    included) give the same advantages as the same rewards divided by 1e155, instead of an
    overflowing variance that silently turns every advantage into 0.
  * eps must be > 0 wherever it divides (a config error otherwise: ``eps_field``); the
    functions here raise ValueError for eps <= 0 with ``scale_by_std``.

Shapes: M values being normalised (E episodes or N turns), S segments,
B task groups, K agents (len(agent_names)), E episodes, N flattened turns.
"""

from __future__ import annotations

import math
import typing
from typing import Any, Callable, Literal, NamedTuple

import torch
from pydantic import Field

from mas.types import CreditBatch

NormaliserName = Literal["none", "group", "group_batch_std", "global", "agent"]
NORMALISER_NAMES: tuple[str, ...] = typing.get_args(NormaliserName)


class Normalised(NamedTuple):
    """Result of a normaliser; every field is aligned with the input values ([M]), float64."""

    values: torch.Tensor  # [M] normalised values
    mean: torch.Tensor  # [M] mean of the element's segment (the value itself for a singleton)
    std: torch.Tensor  # [M] ddof-1 std of the element's segment (0 for a singleton or a constant segment)
    count: torch.Tensor  # [M] long, number of elements in the element's segment


class SegmentStats(NamedTuple):
    """Per-segment statistics, float64."""

    mean: torch.Tensor  # [S]
    std: torch.Tensor  # [S]
    count: torch.Tensor  # [S] long


def check_eps(eps: float, scale_by_std: bool = True) -> None:
    """eps divides (std + eps): it must be a finite number > 0 when scaling."""
    if scale_by_std and not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0 when dividing by the std (found {eps}); eps = 0 divides by a zero std")


def segment_moments(
    values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Overflow-safe weighted mean and population standard deviation per segment, float64.

    Returns (mean [S], std [S], total weight [S]).  The std is returned, not the variance:
    for values of order 1e155 the variance itself (1e310) is not a float64 number.  ``weights`` default to 1 (counts).  Each
    segment's values are divided by their largest magnitude before being summed and
    squared (and the results scaled back), so any finite values give finite statistics.  A
    segment whose weighted values are all equal gets exactly that value as mean and std 0;
    an empty segment gets mean 0 and std 0.
    """
    x = values.to(torch.float64)  # [M]
    seg = segment_ids.to(torch.long)  # [M]
    w = torch.ones_like(x) if weights is None else weights.to(torch.float64)  # [M]
    live = w > 0  # [M]
    zeros = torch.zeros(num_segments, dtype=torch.float64, device=x.device)
    W = zeros.clone().index_add_(0, seg, w)  # [S]
    tiny = torch.finfo(torch.float64).tiny
    inf = torch.full_like(x, torch.inf)
    vmax = torch.full((num_segments,), -torch.inf, dtype=torch.float64, device=x.device).scatter_reduce_(0, seg, torch.where(live, x, -inf), reduce="amax")  # [S]
    vmin = torch.full((num_segments,), torch.inf, dtype=torch.float64, device=x.device).scatter_reduce_(0, seg, torch.where(live, x, inf), reduce="amin")  # [S]
    scale = torch.maximum(vmax.abs(), vmin.abs())  # [S] largest magnitude of the segment's values
    scale = torch.where(torch.isfinite(scale) & (scale > 0), scale, torch.ones_like(scale))  # [S]
    mean = scale * zeros.clone().index_add_(0, seg, w * (x / scale[seg])) / W.clamp(min=tiny)  # [S]
    constant = vmax == vmin  # [S] every weighted value equal (empty segments: inf != -inf)
    mean = torch.where(constant, vmax, torch.where(W > 0, mean, zeros))  # [S] exact for a constant segment
    dev = x - mean[seg]  # [M]
    dscale = torch.zeros(num_segments, dtype=torch.float64, device=x.device).scatter_reduce_(0, seg, torch.where(live, dev.abs(), torch.zeros_like(dev)), reduce="amax")  # [S]
    dscale = torch.where(torch.isfinite(dscale) & (dscale > 0), dscale, torch.ones_like(dscale))  # [S]
    r = dev / dscale[seg]  # [M] within [-1, 1] on live elements
    std = dscale * torch.sqrt(zeros.clone().index_add_(0, seg, w * r * r) / W.clamp(min=tiny))  # [S] population
    std = torch.where(constant | (W <= 0), zeros, std)  # [S]
    return mean, std, W


def segment_stats(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int | None = None) -> SegmentStats:
    """Mean and ddof-1 std of ``values`` per segment.

    A segment without spread (one element, or all elements equal) gets its exact value as
    mean and std 0, so it normalises to 0 [A, see module docstring]; an empty segment gets
    mean 0 and std 0 (it is never gathered).  Overflow-safe (``segment_moments``).
    """
    if values.shape != segment_ids.shape or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)} and segment_ids {tuple(segment_ids.shape)} must be equal 1-d shapes")
    if num_segments is None:
        num_segments = int(segment_ids.max()) + 1 if segment_ids.numel() else 0
    mean, pop_std, W = segment_moments(values, segment_ids, num_segments)  # [S] each
    count = torch.bincount(segment_ids.to(torch.long), minlength=num_segments)  # [S]
    n = count.to(torch.float64)
    std = pop_std * torch.sqrt(n / (n - 1).clamp(min=1))  # [S] ddof = 1 (population std * sqrt(n/(n-1))); 0 for n <= 1
    return SegmentStats(mean=mean, std=std, count=count)


def normalise_segments(
    values: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    num_segments: int | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """(x − mean_s) / (std_s + eps) per segment s, or x − mean_s without ``scale_by_std``; float64."""
    check_eps(eps, scale_by_std)
    stats = segment_stats(values, segment_ids, num_segments)
    seg = segment_ids.to(torch.long)  # [M]
    mean = stats.mean[seg]  # [M]
    std = stats.std[seg]  # [M]
    centred = values.to(torch.float64) - mean  # [M]
    out = centred / (std + eps) if scale_by_std else centred  # [M]
    return Normalised(values=out, mean=mean, std=std, count=stats.count[seg])


def normalise_none(
    values: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    agent_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """Identity: values unchanged (float64), mean 0, std 1, each element its own 'segment' of size 1."""
    v = values.to(torch.float64)
    return Normalised(values=v, mean=torch.zeros_like(v), std=torch.ones_like(v), count=torch.ones_like(v, dtype=torch.long))


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


def normalise_group_batch_std(
    values: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    agent_ids: torch.Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """Centre per task group, divide by ONE ddof-1 std of the values over the whole batch.

    TRL's ``scale_rewards="batch"`` [C, trl GRPOTrainer]: ``(r − group mean) / (std(r over the
    batch) + eps)`` (TRL's eps is 1e-4; here the method's ``eps``).  Groups are compared on
    one scale, so a group whose rewards barely differ is not blown up to unit variance.
    ``mean``/``count`` in the result are the group's, ``std`` the batch's.
    """
    if group_ids is None:
        raise ValueError("normalise_group_batch_std needs group_ids")
    check_eps(eps, scale_by_std)
    group = segment_stats(values, group_ids)
    seg = group_ids.to(torch.long)  # [M]
    whole = segment_stats(values, torch.zeros_like(seg), 1)  # one segment: the batch
    centred = values.to(torch.float64) - group.mean[seg]  # [M]
    std = whole.std.expand_as(centred)  # [M]
    out = centred / (std + eps) if scale_by_std else centred  # [M]
    return Normalised(values=out, mean=group.mean[seg], std=std, count=group.count[seg])


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
    "group_batch_std": normalise_group_batch_std,
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
    "of the batch), 'group_batch_std' (centred per task group, divided by one std over the batch's "
    "episodes: TRL scale_rewards='batch')."
)


def normaliser_field(default: NormaliserName, note: str = "") -> Any:
    """``Field`` for a method config's ``normaliser``; ``note`` adds the method's default."""
    return Field(default, description=f"{_NORMALISER_DOC} {note}".strip())


def scale_by_std_field(note: str = "") -> Any:
    """``Field`` for ``scale_by_std`` (default True)."""
    return Field(True, description=f"Divide by (segment std + eps) after centring; False only centres (Dr. GRPO, verl norm_adv_by_std_in_grpo=False). {note}".strip())


def eps_field(note: str = "") -> Any:
    """``Field`` for ``eps`` (default 1e-6, > 0, finite: eps = 0 is a config error)."""
    return Field(1e-6, gt=0.0, allow_inf_nan=False, description=f"Added to the std before dividing (verl: 1e-6) [C]; must be > 0. {note}".strip())


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
    mean: torch.Tensor  # [N] mean of the turn's segment (0 for none; the value itself for a singleton)
    std: torch.Tensor  # [N] ddof-1 std of the turn's segment (1 for none; 0 for a singleton)
    count: torch.Tensor  # [N] long, samples in the turn's segment (episodes for group, turns otherwise; 1 for none)
    episode_values: torch.Tensor | None  # [E] per-episode advantage for group / group_batch_std; the raw episode scores for none; None otherwise


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
    if normaliser in ("group", "group_batch_std"):  # one sample per episode
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
    check_eps(eps, scale_by_std)
    x = values.to(torch.float64)  # [M]
    w = weights.to(torch.float64)  # [M]
    seg = segment_ids.to(torch.long)  # [M]
    mean, std, W = segment_moments(x, seg, num_segments, w)  # [S] each, overflow-safe (population std)
    live = w > 0  # [M] elements that carry tokens
    constant = std == 0  # [S] all weighted values equal (or empty)
    dev = x - mean[seg]  # [M]
    if scale_by_std:
        std_eps = torch.clamp(std, min=math.sqrt(eps)) if variance_floor else std + eps  # [S] sqrt(max(var, eps)) or std + eps
        out = dev / std_eps[seg]  # [M] OpenRLHF: rsqrt(clamp(var, 1e-8))
    else:
        out = dev  # [M]
    out = torch.where(live & ~constant[seg], out, torch.zeros_like(out))  # [M]
    return Whitened(values=out, mean=mean[seg], std=std[seg], weight=W[seg])
