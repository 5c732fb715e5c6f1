"""Episode-level baselines: GRPO, Dr. GRPO and RLOO (CREDIT_SPEC §1.1–1.3).

Each method computes one advantage per episode and broadcasts it to every turn of the
episode, so every agent in a rollout gets the same credit (no per-agent assignment).

Trajectory score [C, DrMAS repo "vanilla GRPO"]: each turn (verl row) has the per-row
reward R_i − invalid_penalty · invalid_t; the episode's score is the mean of its rows'
rewards, s_i = R_i − invalid_penalty · (fraction of the episode's turns that are invalid).
That average smears a per-turn penalty over the whole rollout.  An episode with no turns
has s_i = R_i [A] and still counts as one sample of its group.

Non-trainable turns (frozen agents, masked turns) get advantages too; the learner drops
them with ``batch.trainable``.

Shapes: B task groups, G episodes per group (may vary per group), E episodes,
N flattened turns.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .normalise import normalise_group, segment_stats
from .registry import register_credit

_EPS = "Added to the std before dividing (verl: 1e-6) [C]."
_PENALTY = (
    "Subtracted from the reward of each turn whose output did not parse (DrMAS "
    "`apply_invalid_action_penalty`; its run scripts use 0.1). The episode score is the mean "
    "of its turns' rewards, so the penalty is averaged over the rollout [C]."
)


class GRPOConfig(CreditConfigBase):
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), verl flavour."""

    method: Literal["grpo"] = Field("grpo", description="Credit method tag.")
    scale_by_std: bool = Field(True, description="Divide by (group std + eps); False gives Dr. GRPO centring (verl norm_adv_by_std_in_grpo).")
    eps: float = Field(1e-6, ge=0.0, allow_inf_nan=False, description=_EPS)
    invalid_penalty: float = Field(0.0, allow_inf_nan=False, description=_PENALTY)


class DrGRPOConfig(CreditConfigBase):
    """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): group centring, no std division."""

    method: Literal["dr_grpo"] = Field("dr_grpo", description="Credit method tag.")
    eps: float = Field(
        1e-6, ge=0.0, allow_inf_nan=False, description="Kept so all baselines share a schema; Dr. GRPO does not divide by the std, so it has no effect."
    )
    invalid_penalty: float = Field(0.0, allow_inf_nan=False, description=_PENALTY)


class RLOOConfig(CreditConfigBase):
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740)."""

    method: Literal["rloo"] = Field("rloo", description="Credit method tag.")
    eps: float = Field(
        1e-6, ge=0.0, allow_inf_nan=False, description="Kept so all baselines share a schema; RLOO does not divide by a std, so it has no effect."
    )
    invalid_penalty: float = Field(0.0, allow_inf_nan=False, description=_PENALTY)


def _float_dtype(batch: CreditBatch) -> torch.dtype:
    return batch.episode_rewards.dtype if batch.episode_rewards.is_floating_point() else torch.float32


def turn_rewards_with_penalty(batch: CreditBatch, invalid_penalty: float) -> torch.Tensor:
    """Per-row reward R_i − penalty · invalid_t of every turn, float64.  [N]"""
    rewards = batch.episode_rewards.to(torch.float64)[batch.episode_ids]  # [N]
    return rewards - invalid_penalty * batch.invalid.to(torch.float64)  # [N]


def episode_scores(batch: CreditBatch, invalid_penalty: float) -> torch.Tensor:
    """Trajectory score s_i = mean over the episode's turns of the per-row reward, float64.

    Equals R_i − penalty · (#invalid turns / #turns); R_i for an episode without turns.  [E]
    """
    E = batch.num_episodes
    n_turns = torch.bincount(batch.episode_ids, minlength=E)  # [E]
    n_invalid = torch.zeros(E, dtype=torch.float64, device=batch.episode_ids.device)
    n_invalid.index_add_(0, batch.episode_ids, batch.invalid.to(torch.float64))  # [E]
    return batch.episode_rewards.to(torch.float64) - invalid_penalty * n_invalid / n_turns.clamp(min=1)  # [E]


def _grpo(batch: CreditBatch, *, scale_by_std: bool, eps: float, invalid_penalty: float) -> Credit:
    dtype = _float_dtype(batch)
    score = episode_scores(batch, invalid_penalty)  # [E]
    norm = normalise_group(score, group_ids=batch.episode_group_ids, scale_by_std=scale_by_std, eps=eps)
    ep = batch.episode_ids  # [N]
    return Credit(
        advantages=norm.values[ep].to(dtype),  # [N]
        breakdown={
            "turn_reward": turn_rewards_with_penalty(batch, invalid_penalty).to(dtype),  # [N]
            "episode_score": score.to(dtype),  # [E]
            "episode_advantage": norm.values.to(dtype),  # [E]
            "baseline_mean": norm.mean[ep].to(dtype),  # [N]
            "baseline_std": norm.std[ep].to(dtype),  # [N]
            "baseline_count": norm.count[ep],  # [N] episodes in the group
        },
    )


@register_credit("grpo", GRPOConfig)
def grpo(batch: CreditBatch, cfg: GRPOConfig, results: Results | None = None) -> Credit:
    """GRPO outcome advantage A_i = (s_i − mean_j s_j) / (std_j s_j + eps), per task group.

    Paper: arXiv 2402.03300 (outcome supervision).  From verl's
    ``compute_grpo_outcome_advantage`` [C]: std is ddof = 1, eps = 1e-6, and a group of one
    episode gets mean 0 and std 1, so its advantage is s_i / (1 + eps) (≈ the raw score),
    not 0.  s_i is the trajectory score described in the module docstring.
    Deviation [A]: a group of identical scores gives exactly 0 (verl can leave float32
    rounding residue divided by eps).
    """
    return _grpo(batch, scale_by_std=cfg.scale_by_std, eps=cfg.eps, invalid_penalty=cfg.invalid_penalty)


@register_credit("dr_grpo", DrGRPOConfig)
def dr_grpo(batch: CreditBatch, cfg: DrGRPOConfig, results: Results | None = None) -> Credit:
    """Dr. GRPO advantage A_i = s_i − mean_j s_j (arXiv 2503.20783).

    Identical to ``grpo`` with ``scale_by_std=False`` (verl ``norm_adv_by_std_in_grpo=False``,
    whose docstring cites Dr. GRPO [C]).  A singleton group keeps its raw score (mean 0,
    verl quirk [C]).  The paper's other change, dropping the 1/|o_i| length normalisation,
    belongs to loss aggregation, not here.
    """
    return _grpo(batch, scale_by_std=False, eps=cfg.eps, invalid_penalty=cfg.invalid_penalty)


@register_credit("rloo", RLOOConfig)
def rloo(batch: CreditBatch, cfg: RLOOConfig, results: Results | None = None) -> Credit:
    """RLOO advantage A_i = s_i − (1/(G−1)) Σ_{j≠i} s_j = G/(G−1) · (s_i − mean_j s_j).

    Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free!"); Ahmadian et al.
    2024, arXiv 2402.14740.  verl computes the second form [C]; so does this function, in
    float64, with the group mean exact for constant groups, so identical scores give 0.
    Group of one episode: A = 0 (there is no other sample to form a baseline) [A].  This
    deviates from verl, which leaves the raw score for a singleton group.
    """
    dtype = _float_dtype(batch)
    score = episode_scores(batch, cfg.invalid_penalty)  # [E]
    stats = segment_stats(score, batch.episode_group_ids)
    g = batch.episode_group_ids  # [E]
    size = stats.count[g]  # [E] G of the episode's group
    many = size > 1  # [E]
    factor = torch.where(many, size / (size - 1).clamp(min=1), torch.zeros_like(size, dtype=torch.float64))  # [E]
    adv = factor * (score - torch.where(many, stats.mean[g], score))  # [E]
    loo_mean = score - adv  # [E] mean of the other episodes' scores (own score for G = 1)
    ep = batch.episode_ids  # [N]
    return Credit(
        advantages=adv[ep].to(dtype),  # [N]
        breakdown={
            "turn_reward": turn_rewards_with_penalty(batch, cfg.invalid_penalty).to(dtype),  # [N]
            "episode_score": score.to(dtype),  # [E]
            "episode_advantage": adv.to(dtype),  # [E]
            "baseline_mean": loo_mean[ep].to(dtype),  # [N] leave-one-out mean
            "baseline_count": size[ep],  # [N] episodes in the group
        },
    )
