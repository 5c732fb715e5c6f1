"""MAGRPO node advantage (Liu et al. 2025, arXiv 2508.04652; CoMLRL) — CREDIT_SPEC §1.5.

MAGRPO samples K joint actions at a node of a rollout tree and scores each joint action with
one shared reward.  Read from CoMLRL [C]:

    return of sibling j at node n   R_j = r_j + γ · mean(returns of the child node of j)
    advantage (``advantage_mode``)  mean  A_j = R_j − mean_j' R_j'          (the default)
                                    rloo  A_j = R_j − mean_{j'≠j} R_j' = K/(K−1) · (R_j − mean)
                                    max   A_j = R_j − max_j' R_j'
                                    raw   A_j = R_j
    every agent at the node gets the same A_j.

Std scaling, two CoMLRL versions [C]:
  * ``comlrl/trainers/magrpo.py`` (OpenMLRL/CoMLRL, commit 0090d3f, the trainer behind the
    paper's "Equation 1"): A_j = (R_j − mean) / std_j' R_j' with ``torch.std`` (ddof 1), no
    division when std <= 1e-8, then ``clamp(A, −10, 10)``.  With R = [1, 0, 0, 1] that is
    ±0.5/0.577 = ±0.866, not ±0.5.
  * ``comlrl/trainers/reinforce/magrpo.py`` (commit 1665784, which adds ``advantage_mode``):
    the node baseline only, no std, no clamp.
The default here is the first (``group_std: true``, ``advantage_clip: 10``), which is what
users of CoMLRL's MAGRPO trainer get; ``group_std: false`` and ``advantage_clip: null`` give
the second.  The std division applies to every ``advantage_mode`` [A] (CoMLRL's std version
has only the mean baseline).

In mas [A]:
  * node = task group.  The G episodes of one task are the K siblings of one node, each
    episode one joint sample ("aligned" joint mode: episode j's turns form joint action j).
  * mas rollouts are single-level: an episode is not expanded into child nodes by an
    external transition, so the tree's multi-turn return recursion reduces to R_j = the
    episode reward (there is no γ and no early termination to configure).
  * every turn of episode j, whatever its agent and position, gets A_j: no per-agent credit.
  * a group of one episode: mean, rloo and max give 0, raw gives R_j (CoMLRL's rloo falls
    back to R − mean for K ≤ 1 [C]; CoMLRL itself refuses K < 2).
  * a constant group gives exactly 0 (float64 statistics, exact group mean), as everywhere in
    ``mas.credit``.
The learning rule also differs: CoMLRL optimises −(Σ_tokens logπ)·A with no ratio and no
clipping; mas's learner applies its PPO-clip surrogate (on-policy at ppo_epochs = 1 the ratio
is 1 and the gradient matches up to the loss aggregation).

As a credit pipeline the node advantage A_j is the method's raw score (per turn and per
episode, like RLOO); the default normaliser ``none`` returns it unchanged.  With
``group_std`` and mode ``mean`` it equals GRPO with eps = 0 (up to the 1e-8 threshold and the
clamp), which is also C3's reimplementation of MAGRPO (r − group mean, divided by the group
std by default [C]).  With ``group`` on top the node advantages are re-centred and divided
by the group std again, which for any mode (a per-group shift/scale) is GRPO.

Breakdown: ``node_return`` R_j [E], ``node_baseline`` [E] (the subtracted baseline: group
mean, leave-one-out mean, group max, or 0), ``node_advantage`` A_j [E] (after the std scaling and clamp), ``node_std`` [E] (the
group's ddof-1 std of R; 0 for a singleton), ``node_size`` K [E],
``norm_mean``/``norm_std``/``norm_count`` [N] and ``episode_advantage`` [E] (normalisers
none and group).

Shapes: B task groups (nodes), E episodes, N flattened turns.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .normalise import NormaliserName, RawScores, eps_field, normalise_credit, normaliser_field, scale_by_std_field, segment_stats
from .registry import CREDIT_DTYPE, MethodCard, register_credit

AdvantageMode = Literal["mean", "rloo", "max", "raw"]
GROUP_STD_FLOOR = 1e-8  # CoMLRL divides only when the group std exceeds this [C]


class MAGRPOConfig(CreditConfigBase):
    """MAGRPO node advantage (arXiv 2508.04652, CoMLRL ``advantage_mode``)."""

    method: Literal["magrpo"] = Field("magrpo", description="Credit method tag.")
    advantage_mode: AdvantageMode = Field(
        "mean",
        description="Baseline subtracted from each episode reward within its task group (the node): "
        "'mean' R − mean (CoMLRL default) [C], 'rloo' R − mean of the others, 'max' R − max, 'raw' R. "
        "group_std then divides by the group's std.",
    )
    group_std: bool = Field(
        True,
        description="Divide the node advantage by the group's ddof-1 std of the returns when it exceeds 1e-8 (CoMLRL's "
        "MAGRPO trainer, comlrl/trainers/magrpo.py) [C]; false: the baseline only (CoMLRL's reinforce/magrpo.py) [C].",
    )
    advantage_clip: float | None = Field(
        10.0,
        gt=0.0,
        allow_inf_nan=False,
        description="Clamp the node advantage to [-clip, clip] after the std scaling (CoMLRL: 10) [C]; null: no clamp.",
    )
    normaliser: NormaliserName = normaliser_field(
        "none",
        "MAGRPO default: none (the node baseline and std scaling are part of the method); "
        "'group' on top re-standardises per task group, i.e. GRPO.",
    )
    scale_by_std: bool = scale_by_std_field("No effect with normaliser none.")
    eps: float = eps_field("No effect with normaliser none.")


def node_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, mode: str, num_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A_j, baseline_j, K_j) of every episode, float64, all [E].

    ``rewards`` [E] are the node returns R_j, ``group_ids`` [E] their node (task group).
    """
    if num_groups is None:
        num_groups = int(group_ids.max()) + 1 if group_ids.numel() else 0
    r = rewards.to(torch.float64)  # [E]
    g = group_ids.to(torch.long)  # [E]
    count = torch.bincount(g, minlength=num_groups)  # [B]
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, g, r)  # [B]
    mean = total / count.clamp(min=1)  # [B]
    gmax = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, g, r, reduce="amax")  # [B]
    gmin = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce_(0, g, r, reduce="amin")  # [B]
    mean = torch.where(gmax == gmin, gmax, mean)  # [B] exact mean of a constant group (its only value)
    k = count[g]  # [E] K of the episode's node
    if mode == "mean":
        baseline = mean[g]  # [E]
        adv = r - baseline
    elif mode == "rloo":
        many = k > 1  # [E]
        kf = k.to(torch.float64)  # [E] K/(K-1) in float64 (long / long would land in float32)
        factor = torch.where(many, kf / (kf - 1).clamp(min=1), torch.ones_like(kf))  # [E]
        adv = factor * (r - mean[g])  # [E]  = R − mean of the others; R − mean = 0 for K = 1
        baseline = r - adv  # [E] the leave-one-out mean (own reward for K = 1)
    elif mode == "max":
        baseline = gmax[g]  # [E]
        adv = r - baseline
    elif mode == "raw":
        baseline = torch.zeros_like(r)  # [E]
        adv = r
    else:
        raise ValueError(f"unknown advantage_mode {mode!r}; valid: mean, rloo, max, raw")
    return adv, baseline, k


@register_credit(
    "magrpo", MAGRPOConfig,
    card=MethodCard('outcome reward, joint-action group baseline (MAGRPO)', 'episode: one advantage per joint rollout', 'node baseline over the K joint samples (mean, rloo or max)'),
)
def magrpo(batch: CreditBatch, cfg: MAGRPOConfig, results: Results | None = None) -> Credit:
    """A_j = (R_j − baseline(node)) [/ std(node)] for every turn of episode j (CoMLRL [C]).

    Node = task group, R_j = episode reward (single-level rollouts, see module docstring).
    Every agent's turns in episode j get the same A_j: no per-agent credit (CREDIT_SPEC §1.5).
    """
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    num_groups = int(batch.episode_group_ids.max()) + 1 if batch.num_episodes else 0
    adv, baseline, k = node_advantages(batch.episode_rewards, batch.episode_group_ids, cfg.advantage_mode, num_groups)  # [E] each
    std = segment_stats(batch.episode_rewards, batch.episode_group_ids, num_groups).std[batch.episode_group_ids]  # [E] ddof 1
    if cfg.group_std:
        adv = torch.where(std > GROUP_STD_FLOOR, adv / torch.where(std > GROUP_STD_FLOOR, std, torch.ones_like(std)), adv)  # [E]
    if cfg.advantage_clip is not None:
        adv = adv.clamp(-cfg.advantage_clip, cfg.advantage_clip)  # [E]
    ep = batch.episode_ids  # [N]
    norm = normalise_credit(batch, RawScores(turn=adv[ep], episode=adv), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    breakdown = {
        "node_return": batch.episode_rewards.to(dtype),  # [E] R_j
        "node_baseline": baseline.to(dtype),  # [E]
        "node_std": std.to(dtype),  # [E]
        "node_advantage": adv.to(dtype),  # [E] A_j before the normaliser
        "node_size": k,  # [E] K
        "norm_mean": norm.mean.to(dtype),  # [N]
        "norm_std": norm.std.to(dtype),  # [N]
        "norm_count": norm.count,  # [N]
    }
    if norm.episode_values is not None:  # none / group: one advantage per episode
        breakdown["episode_advantage"] = norm.episode_values.to(dtype)  # [E]
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)  # [N]
