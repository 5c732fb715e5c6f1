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
    ``torch.std`` (ddof = 1), ε = 1e-6, |Y_k| = 1 gives mean 0 and std 1 (the raw reward
    divided by 1 + ε comes back), ``norm_adv_by_std_in_grpo=False`` gives agent-wise
    centring only.
  * Per-row reward [C]: ``EpisodeRewardManager`` puts the episode reward on every agent
    row, ``apply_invalid_action_penalty`` subtracts 0.1 × invalid on that row only (0.1 in
    the run scripts, hence the default here).
  * Deviation [A]: a (task, agent) set of identical rewards gives exactly 0 (statistics in
    float64, see ``normalise.py``); verl can leave float32 rounding residue / ε.
Non-trainable turns are normalised like the others (the learner drops them).  A frozen
agent's turns form their own segments, so they never change a trainable agent's credit.

Shapes: B task groups, E episodes, N flattened turns, K agents.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .baselines import turn_rewards_with_penalty
from .normalise import agent_group_key, normalise_segments
from .registry import register_credit


class DrMasConfig(CreditConfigBase):
    """Dr. MAS agent-wise normalisation (arXiv 2602.08847)."""

    method: Literal["dr_mas"] = Field("dr_mas", description="Credit method tag.")
    scale_by_std: bool = Field(True, description="Divide by (agent std + eps); False gives Dr. GRPO-style agent-wise centring (verl norm_adv_by_std_in_grpo=False) [C].")
    eps: float = Field(1e-6, ge=0.0, allow_inf_nan=False, description="Added to the std before dividing (verl: 1e-6) [C].")
    invalid_penalty: float = Field(
        0.1, allow_inf_nan=False, description="Subtracted from the reward of each turn whose output did not parse, on that turn only (DrMAS run scripts: 0.1) [C]."
    )


@register_credit("dr_mas", DrMasConfig)
def dr_mas(batch: CreditBatch, cfg: DrMasConfig, results: Results | None = None) -> Credit:
    """A^{i,t} = (R^{i,t} − μ_k) / (σ_k + ε) per (task group, agent k) over all k's turns.

    See the module docstring for the formula, its sources and the one deviation.
    """
    dtype = batch.episode_rewards.dtype if batch.episode_rewards.is_floating_point() else torch.float32
    reward = turn_rewards_with_penalty(batch, cfg.invalid_penalty)  # [N] R^{i,t}
    key = agent_group_key(batch.group_ids, batch.agent_ids, num_agents=max(len(batch.agent_names), 1))  # [N] group*K + agent
    norm = normalise_segments(reward, key, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    return Credit(
        advantages=norm.values.to(dtype),  # [N]
        breakdown={
            "turn_reward": reward.to(dtype),  # [N]
            "baseline_mean": norm.mean.to(dtype),  # [N] μ_k of the turn's (task, agent) set
            "baseline_std": norm.std.to(dtype),  # [N] σ_k of the turn's (task, agent) set
            "baseline_count": norm.count,  # [N] |Y_k|
        },
    )
