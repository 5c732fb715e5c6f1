"""Dr. MAS: agent-wise advantage normalisation (Feng et al. 2026, arXiv 2602.08847).

CREDIT_SPEC §2.1 / §2.3.  For the G rollouts of task q, let Y_k be the multiset of *all*
turns of agent k across those rollouts (an agent invoked 3 times in a rollout contributes
3 samples).  Each turn (i, t) has the per-row reward
    R^{i,t} = R^i − invalid_penalty · invalid_t
and its advantage is
    A^{i,t} = (R^{i,t} − μ_k) / (σ_k + ε),   μ_k = mean over Y_k,  σ_k = std over Y_k.

Provenance:
  * Eq. 5 as quoted in DrMAS issue #81 [S]; the code [C] (verl in ``langfengQ/DrMAS``):
    group key ``f"{uid}_{agent_id}"`` (``algorithm.group_by_agent_id=True``), σ is
    ``torch.std`` (ddof = 1), ε = 1e-6, ``norm_adv_by_std_in_grpo=False`` gives agent-wise
    centring only.  verl's |Y_k| = 1 gives mean 0 and std 1 (the raw reward divided by
    1 + ε comes back); here it gives 0 [A, ``normalise.py``: a lone turn has no comparison].
  * Per-row reward [C]: ``EpisodeRewardManager`` puts the episode reward on every agent
    row, ``apply_invalid_action_penalty`` subtracts 0.1 × invalid on that row only (0.1 in
    the run scripts, hence the default here).
  * Deviation [A]: a (task, agent) set of identical rewards gives exactly 0 (statistics in
    float64, see ``normalise.py``); verl can leave float32 rounding residue / ε.
As a credit pipeline: the method's raw scores are the per-row rewards R^{i,t} (per turn)
and the DrMAS "vanilla GRPO" trajectory score s_i = mean_t R^{i,t} (per episode, R^i for an
episode without turns); the normaliser defaults to ``agent``, which is Eq. 5 above.  Other
normalisers (YAML ``credit: {method: dr_mas, normaliser: global}``):
  * ``group``  GRPO's trajectory-level statistics over the episodes' s_i, every turn of an
    episode gets its episode's advantage: exactly ``grpo`` with the same invalid_penalty,
    scale_by_std and eps (the DrMAS repo's "vanilla GRPO" arm; the row penalty is averaged
    over the rollout).
  * ``global`` one mean/std over every turn of the batch, all agents and tasks pooled (the
    "global step-level normalisation" control arm of DrMAS issue #81).
  * ``none``   the raw per-row rewards (no baseline).
Identity: ``grpo`` with normaliser agent equals ``dr_mas`` when invalid_penalty = 0 (or no
turn is invalid): both then score every turn with R^i.

Non-trainable turns are normalised like the others (the learner drops them).  With the
agent normaliser a frozen agent's turns form their own segments, so they never change a
trainable agent's credit.

Shapes: B task groups, E episodes, N flattened turns, K agents.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .baselines import episode_scores, turn_rewards_with_penalty
from .normalise import NormaliserName, RawScores, eps_field, normalise_credit, normaliser_field, scale_by_std_field
from .registry import CREDIT_DTYPE, MethodCard, register_credit


class DrMasConfig(CreditConfigBase):
    """Dr. MAS agent-wise normalisation (arXiv 2602.08847)."""

    method: Literal["dr_mas"] = Field("dr_mas", description="Credit method tag.")
    normaliser: NormaliserName = normaliser_field("agent", "Dr. MAS default: agent.")
    scale_by_std: bool = scale_by_std_field("With agent: Dr. GRPO-style agent-wise centring [C].")
    eps: float = eps_field()
    invalid_penalty: float = Field(
        0.1, allow_inf_nan=False, description="Subtracted from the reward of each turn whose output did not parse, on that turn only (DrMAS run scripts: 0.1) [C]."
    )


@register_credit(
    "dr_mas", DrMasConfig,
    card=MethodCard('outcome reward, agent-wise normalisation (Dr. MAS)', 'agent: statistics per agent', "mean and std of the agent's own turns in the batch"),
)
def dr_mas(batch: CreditBatch, cfg: DrMasConfig, results: Results | None = None) -> Credit:
    """A^{i,t} = (R^{i,t} − μ_k) / (σ_k + ε) per (task group, agent k) over all k's turns.

    That is the default normaliser (agent); see the module docstring for the formula, its
    sources, the one deviation and the other normalisers.  Breakdown: ``turn_reward`` R^{i,t}
    [N], ``episode_score`` s_i [E], ``baseline_mean``/``baseline_std``/``baseline_count`` [N]
    (μ, σ and sample count of the turn's segment; also as ``norm_*``), and
    ``episode_advantage`` [E] with the group normaliser.
    """
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    reward = turn_rewards_with_penalty(batch, cfg.invalid_penalty)  # [N] R^{i,t}
    score = episode_scores(batch, cfg.invalid_penalty)  # [E] s_i = mean_t R^{i,t}
    norm = normalise_credit(batch, RawScores(turn=reward, episode=score), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    mean, std = norm.mean.to(dtype), norm.std.to(dtype)  # [N]
    breakdown = {
        "turn_reward": reward.to(dtype),  # [N]
        "episode_score": score.to(dtype),  # [E]
        "baseline_mean": mean,  # [N] μ of the turn's segment
        "baseline_std": std,  # [N] σ of the turn's segment
        "baseline_count": norm.count,  # [N] |Y_k| for agent
        "norm_mean": mean,  # [N]
        "norm_std": std,  # [N]
        "norm_count": norm.count,  # [N]
    }
    if cfg.normaliser in ("group", "group_batch_std"):
        breakdown["episode_advantage"] = norm.episode_values.to(dtype)  # [E]
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)  # [N]
