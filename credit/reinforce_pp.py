"""REINFORCE++ and REINFORCE++-baseline (Hu 2025, arXiv 2501.03262) — CREDIT_SPEC §1.4, §7.2.

REINFORCE++ as in OpenRLHF (vendored in MAPPA, ``ltjed/multiagent-coaching``) [C]:
  * per-token reward: the sequence reward on the last token, minus β·KL_t on every token;
  * returns: reverse cumulative sums with γ = 1;
  * advantages: whitened with ONE mean and std over all action tokens of the batch (no
    per-prompt grouping): mean = Σ_tokens x / #tokens, var = Σ_tokens (x − mean)² / #tokens
    (population variance), A = (x − mean) · rsqrt(max(var, 1e-8));
  * -baseline variant (``reinforce_baseline``): the per-prompt group mean of the sequence
    rewards is subtracted first (``rewards − rewards.mean(-1)`` over the n samples of a
    prompt), then the same global whitening.

In mas, per turn (one scalar per flattened turn):
  * a turn's return is its episode's reward R_i at every one of its tokens: γ = 1 and the
    reward sits on the last token, so the reverse cumulative sum is R_i everywhere.  The KL
    term is not folded into the reward here: mas's learner adds its own per-token KL
    (``trainer.kl_coef``, a k3 estimate to the reference policy) to the loss instead, so a
    turn's tokens all share one advantage [deviation, stated].
  * ``baseline``: x = R_i − mean over the G episodes of the task of R (one sample per
    episode; a constant or single-episode group gives exactly 0), else x = R_i.
  * whitening is token-weighted: turn n counts ``batch.completion_lengths[n]`` times (all
    its tokens carry the same x), so longer responses weigh more in the mean and the std.
    ``token_weighted=False`` counts each turn with tokens once (a sequence-weighted control)
    [A].  A batch without ``completion_lengths`` weighs every turn 1 [A].
  * ``per_agent`` (MAPPA §7.2 [C]): one token-weighted mean/std per agent over that agent's
    turns in the whole batch (all tasks), as MAPPA's per-agent trainers each whiten their own
    batch.  Agents are told apart by name (``agent_ids``), not by policy [A].
  * all turns take part in the statistics, trainable or not (the learner drops frozen and
    masked turns afterwards), as everywhere in ``mas.credit`` [A]; with ``per_agent`` a frozen
    agent's turns form their own segment and never change a trainable agent's credit.
  * a turn without completion tokens gets 0 (it has nothing to train) [A].
  * a segment whose weighted values are all equal gives exactly 0 (OpenRLHF's float32
    residue times rsqrt(1e-8) is replaced by an exact zero; statistics in float64) [A].
  * ``scale_by_std=False`` only centres (OpenRLHF ``--no_advantage_std_norm``) [C].

Breakdown: ``return`` x [N] (before whitening), ``baseline`` [N] (the task-group mean
subtracted, 0 without ``baseline``), ``token_weight`` [N], ``norm_mean``/``norm_std`` [N]
(token-weighted mean and population std of the turn's segment), ``norm_tokens`` [N] (tokens
in the segment).

Shapes: B task groups, E episodes, N flattened turns, K agents, S segments.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .normalise import Whitened, weighted_whiten  # noqa: F401  (Whitened re-exported for callers)
from .registry import CREDIT_DTYPE, MethodCard, register_credit


class ReinforcePPConfig(CreditConfigBase):
    """REINFORCE++ / REINFORCE++-baseline (arXiv 2501.03262), OpenRLHF flavour."""

    method: Literal["reinforce_pp"] = Field("reinforce_pp", description="Credit method tag.")
    baseline: bool = Field(
        False,
        description="REINFORCE++-baseline: subtract the per-task mean of the episode rewards before the global whitening "
        "(OpenRLHF reinforce_baseline) [C].",
    )
    per_agent: bool = Field(
        False,
        description="Whiten each agent's turns separately over the whole batch (MAPPA: one token-weighted mean/std per "
        "agent's batch) [C]; False: one mean/std over all turns of all agents.",
    )
    token_weighted: bool = Field(
        True,
        description="Weigh each turn by its completion tokens in the mean/std (OpenRLHF whitens over action tokens) [C]; "
        "False counts each turn once (sequence-weighted control) [A].",
    )
    scale_by_std: bool = Field(True, description="Divide by the std after centring; False only centres (OpenRLHF --no_advantage_std_norm) [C].")
    eps: float = Field(1e-8, gt=0.0, allow_inf_nan=False, description="Lower bound on the variance before rsqrt (OpenRLHF: var.clamp(min=1e-8)) [C]; must be > 0.")


def group_mean(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Mean of ``values`` [E] over each group, exact for a constant group, float64.  [B]"""
    v = values.to(torch.float64)
    g = group_ids.to(torch.long)
    count = torch.bincount(g, minlength=num_groups)  # [B]
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, g, v) / count.clamp(min=1)  # [B]
    vmax = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, g, v, reduce="amax")  # [B]
    vmin = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce_(0, g, v, reduce="amin")  # [B]
    return torch.where(vmax == vmin, vmax, mean)  # [B]


@register_credit(
    "reinforce_pp", ReinforcePPConfig,
    card=MethodCard('outcome reward, global whitening (REINFORCE++)', 'episode: one advantage for every turn of an episode', 'optional group mean, then token-weighted whitening over the batch'),
)
def reinforce_pp(batch: CreditBatch, cfg: ReinforcePPConfig, results: Results | None = None) -> Credit:
    """A_n = (x_n − μ) / σ with token-weighted μ, σ over the batch (or over each agent's turns).

    x_n = R_i of the turn's episode (REINFORCE++) or R_i − mean_task R (``baseline``).  See
    the module docstring for the sources and the per-turn reading of the per-token algorithm.
    """
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    ep = batch.episode_ids  # [N]
    rewards = batch.episode_rewards.to(torch.float64)  # [E]
    if cfg.baseline:
        num_groups = int(batch.episode_group_ids.max()) + 1 if batch.num_episodes else 0
        base = group_mean(rewards, batch.episode_group_ids, num_groups)[batch.episode_group_ids]  # [E]
    else:
        base = torch.zeros_like(rewards)  # [E]
    x = (rewards - base)[ep]  # [N] the return at every token of the turn
    if batch.completion_lengths is None:
        weight = torch.ones(batch.num_turns, dtype=torch.float64)  # [N]
    elif cfg.token_weighted:
        weight = batch.completion_lengths.to(torch.float64)  # [N]
    else:
        weight = (batch.completion_lengths > 0).to(torch.float64)  # [N] each turn with tokens once
    if cfg.per_agent:
        seg, num_segments = batch.agent_ids.to(torch.long), max(len(batch.agent_names), 1)  # [N]
    else:
        seg, num_segments = torch.zeros(batch.num_turns, dtype=torch.long), 1  # [N]
    white = weighted_whiten(x, weight, seg, scale_by_std=cfg.scale_by_std, eps=cfg.eps, num_segments=num_segments)
    breakdown = {
        "return": x.to(dtype),  # [N]
        "baseline": base[ep].to(dtype),  # [N]
        "token_weight": weight.to(dtype),  # [N]
        "norm_mean": white.mean.to(dtype),  # [N]
        "norm_std": white.std.to(dtype),  # [N]
        "norm_tokens": white.weight.to(dtype),  # [N]
    }
    return Credit(advantages=white.values.to(dtype), breakdown=breakdown)  # [N]
