"""Episode-level baselines: GRPO, Dr. GRPO and RLOO (CREDIT_SPEC §1.1–1.3).

Each method is a credit pipeline: the method computes one raw score per episode and
broadcasts it to every turn of the episode (``RawScores``); the configured ``normaliser``
(see ``normalise.py``) turns the scores into advantages.  With each method's default
normaliser every agent in a rollout gets the same credit (no per-agent assignment):

    method    raw score of episode i (and of each of its turns)        default normaliser
    grpo      s_i                                                      group, scale_by_std
    dr_grpo   s_i                                                      group, centring only
    rloo      s_i − mean_{j≠i} s_j  (the leave-one-out advantage)      none

Trajectory score [C, DrMAS repo "vanilla GRPO"]: each turn (verl row) has the per-row
reward R_i − invalid_penalty · invalid_t; the episode's score is the mean of its rows'
rewards, s_i = R_i − invalid_penalty · (fraction of the episode's turns that are invalid).
That average smears a per-turn penalty over the whole rollout.  An episode with no turns
has s_i = R_i [A] and still counts as one sample of its group.

Other normalisers (YAML ``credit: {method: grpo, normaliser: agent}``):
  * ``agent`` normalises the broadcast s_i per (task, agent) over that agent's turns; with
    invalid_penalty = 0 (or no invalid turn) grpo + agent is exactly ``dr_mas`` with the
    same penalty, because both give every turn the reward R_i.
  * ``global`` takes one mean/std over all turns of the batch (turn-weighted: a long
    episode counts once per turn).
  * ``none`` leaves s_i raw: plain REINFORCE for grpo/dr_grpo.
Dr. GRPO is defined by not dividing by a std, so ``DrGRPOConfig`` has no ``scale_by_std``
key: dr_grpo + X is grpo + X with ``scale_by_std=False``.
RLOO's leave-one-out baseline is part of the method, not a normaliser: its raw score is
already centred, and its default ``none`` gives the spec formula.  Another normaliser acts
on the RLOO advantages (``global`` whitens them over the batch, as some RLOO
implementations optionally do; ``group`` rescales them per task, which for groups of two
or more episodes gives GRPO's advantage up to eps).

Non-trainable turns (frozen agents, masked turns) get advantages too; the learner drops
them with ``batch.trainable``.

Breakdown (for reports): ``turn_reward`` [N], ``episode_score`` s_i [E],
``episode_advantage`` [E] (every turn's advantage, with normaliser group or none),
``baseline_mean``/``baseline_std``/``baseline_count`` [N] (the normaliser's statistics of the
turn's segment; for RLOO the leave-one-out mean and the group size instead),
``norm_mean``/``norm_std``/``norm_count`` [N] (the normaliser's statistics, every method) and,
for RLOO, ``loo_advantage`` [E] (the raw score before the normaliser).

Shapes: B task groups, G episodes per group (may vary per group), E episodes,
N flattened turns.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .normalise import CreditNormalised, NormaliserName, RawScores, eps_field, normalise_credit, normaliser_field, scale_by_std_field, segment_stats
from .registry import CREDIT_DTYPE, MethodCard, register_credit

_PENALTY = (
    "Subtracted from the reward of each turn whose output did not parse (DrMAS "
    "`apply_invalid_action_penalty`; its run scripts use 0.1). The episode score is the mean "
    "of its turns' rewards, so the penalty is averaged over the rollout [C]."
)


class GRPOConfig(CreditConfigBase):
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), verl flavour."""

    method: Literal["grpo"] = Field("grpo", description="Credit method tag.")
    normaliser: NormaliserName = normaliser_field("group", "GRPO default: group.")
    scale_by_std: bool = scale_by_std_field("False with group gives Dr. GRPO.")
    eps: float = eps_field()
    invalid_penalty: float = Field(0.0, allow_inf_nan=False, description=_PENALTY)


class DrGRPOConfig(CreditConfigBase):
    """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): centring only, never a std division.

    ``scale_by_std`` is a read-only property (always False), not a YAML key.
    """

    method: Literal["dr_grpo"] = Field("dr_grpo", description="Credit method tag.")
    normaliser: NormaliserName = normaliser_field("group", "Dr. GRPO default: group. Dr. GRPO only centres, so this picks which mean is subtracted.")
    eps: float = eps_field("Kept so all baselines share a schema; Dr. GRPO does not divide by the std, so it has no effect.")
    invalid_penalty: float = Field(0.0, allow_inf_nan=False, description=_PENALTY)

    @property
    def scale_by_std(self) -> bool:
        """Always False: Dr. GRPO only centres."""
        return False


class RLOOConfig(CreditConfigBase):
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740)."""

    method: Literal["rloo"] = Field("rloo", description="Credit method tag.")
    normaliser: NormaliserName = normaliser_field(
        "none",
        "RLOO default: none (the leave-one-out baseline is part of the method; another "
        "normaliser is applied to the RLOO advantages).",
    )
    scale_by_std: bool = scale_by_std_field("No effect with normaliser none.")
    eps: float = eps_field("No effect with normaliser none.")
    invalid_penalty: float = Field(0.0, allow_inf_nan=False, description=_PENALTY)


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


def _breakdown(batch: CreditBatch, norm: CreditNormalised, dtype: torch.dtype, invalid_penalty: float, score: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {
        "turn_reward": turn_rewards_with_penalty(batch, invalid_penalty).to(dtype),  # [N]
        "episode_score": score.to(dtype),  # [E] s_i
        "norm_mean": norm.mean.to(dtype),  # [N]
        "norm_std": norm.std.to(dtype),  # [N]
        "norm_count": norm.count,  # [N]
    }
    if norm.episode_values is not None:  # group / none: one advantage per episode
        out["episode_advantage"] = norm.episode_values.to(dtype)  # [E]
    return out


def _grpo(batch: CreditBatch, cfg: GRPOConfig | DrGRPOConfig) -> Credit:
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    score = episode_scores(batch, cfg.invalid_penalty)  # [E]
    norm = normalise_credit(batch, RawScores(turn=score[batch.episode_ids], episode=score), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    breakdown = _breakdown(batch, norm, dtype, cfg.invalid_penalty, score)
    breakdown.update(
        baseline_mean=breakdown["norm_mean"],  # [N]
        baseline_std=breakdown["norm_std"],  # [N]
        baseline_count=breakdown["norm_count"],  # [N] episodes in the group (group), turns in the segment (agent, global)
    )
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)  # [N]


@register_credit(
    "grpo", GRPOConfig,
    card=MethodCard('outcome reward, group-relative baseline (GRPO)', 'episode: one advantage for every turn of an episode', 'mean (and std) of the G episodes of the same task'),
)
def grpo(batch: CreditBatch, cfg: GRPOConfig, results: Results | None = None) -> Credit:
    """GRPO outcome advantage A_i = (s_i − mean_j s_j) / (std_j s_j + eps), per task group.

    Paper: arXiv 2402.03300 (outcome supervision).  From verl's
    ``compute_grpo_outcome_advantage`` [C]: std is ddof = 1, eps = 1e-6.  s_i is the
    trajectory score described in the module docstring.
    Deviations [A] (``normalise.py``): a group of identical scores gives exactly 0 (verl can
    leave float32 rounding residue divided by eps), and so does a group of one episode
    (verl returns s_i / (1 + eps) there: no comparison, no group-relative signal).
    That is the default normaliser (group); ``cfg.normaliser`` swaps the statistics
    applied to the broadcast s_i (module docstring).
    """
    return _grpo(batch, cfg)


@register_credit(
    "dr_grpo", DrGRPOConfig,
    card=MethodCard('outcome reward, group-relative baseline (Dr. GRPO)', 'episode: one advantage for every turn of an episode', 'mean of the G episodes of the same task, no std scaling'),
)
def dr_grpo(batch: CreditBatch, cfg: DrGRPOConfig, results: Results | None = None) -> Credit:
    """Dr. GRPO advantage A_i = s_i − mean_j s_j (arXiv 2503.20783).

    Identical to ``grpo`` with ``scale_by_std=False`` (verl ``norm_adv_by_std_in_grpo=False``,
    whose docstring cites Dr. GRPO [C]), for every normaliser.  A singleton group gives 0
    (``normalise.py``; verl keeps the raw score).  The paper's other change, dropping the 1/|o_i|
    length normalisation, belongs to loss aggregation, not here.
    """
    return _grpo(batch, cfg)


def rloo_scores(batch: CreditBatch, invalid_penalty: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RLOO's raw episode score, float64: (advantage, leave-one-out mean, group size, s_i), all [E].

    A_i = s_i − (1/(G−1)) Σ_{j≠i} s_j = G/(G−1) · (s_i − mean_j s_j); 0 for a group of one.
    """
    score = episode_scores(batch, invalid_penalty)  # [E]
    stats = segment_stats(score, batch.episode_group_ids)
    g = batch.episode_group_ids  # [E]
    size = stats.count[g]  # [E] G of the episode's group (long)
    many = size > 1  # [E]
    n = size.to(torch.float64)  # [E] the ratio G/(G-1) in float64 (long / long would land in float32)
    factor = torch.where(many, n / (n - 1).clamp(min=1), torch.zeros_like(n))  # [E]
    adv = factor * (score - torch.where(many, stats.mean[g], score))  # [E]
    loo_mean = score - adv  # [E] mean of the other episodes' scores (own score for G = 1)
    return adv, loo_mean, size, score


@register_credit(
    "rloo", RLOOConfig,
    card=MethodCard('outcome reward, leave-one-out baseline (RLOO)', 'episode: one advantage for every turn of an episode', 'mean of the other G-1 episodes of the same task'),
)
def rloo(batch: CreditBatch, cfg: RLOOConfig, results: Results | None = None) -> Credit:
    """RLOO advantage A_i = s_i − (1/(G−1)) Σ_{j≠i} s_j = G/(G−1) · (s_i − mean_j s_j).

    Kool et al. 2019 ("Buy 4 REINFORCE samples, get a baseline for free!"); Ahmadian et al.
    2024, arXiv 2402.14740.  verl computes the second form [C]; so does this function, in
    float64, with the group mean exact for constant groups, so identical scores give 0.
    Group of one episode: A = 0 (there is no other sample to form a baseline) [A], as for
    every normaliser here; verl leaves the raw score for a singleton group.
    A_i is the method's raw score; the default normaliser ``none`` returns it unchanged,
    another one is applied to it (module docstring).
    """
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    adv, loo_mean, size, score = rloo_scores(batch, cfg.invalid_penalty)  # [E] each
    ep = batch.episode_ids  # [N]
    norm = normalise_credit(batch, RawScores(turn=adv[ep], episode=adv), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    breakdown = _breakdown(batch, norm, dtype, cfg.invalid_penalty, score)
    breakdown.update(
        loo_advantage=adv.to(dtype),  # [E] raw score before the normaliser
        baseline_mean=loo_mean[ep].to(dtype),  # [N] leave-one-out mean
        baseline_count=size[ep],  # [N] episodes in the group
    )
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)  # [N]
