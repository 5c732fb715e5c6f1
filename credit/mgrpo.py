"""M-GRPO: hierarchical group-relative credit for a main agent and its sub-agents
(Hong et al. 2025, arXiv 2511.13288) — CREDIT_SPEC §3.

A vertical team: a main agent M (planner / orchestrator, ``main_agent``) and sub-agents S
(every other agent).  For task q the team produces K rollouts (the task group); rollout k
calls sub-agents d_k >= 0 times.

1. Main reward R_M^k (per episode).  r_correct = the episode reward R^k; r_format = 1 if
   every turn of the main agent in the episode parsed (``not batch.invalid``; vacuously 1
   for an episode without main turns), else 0.
     ``main_reward="mrlx"`` (default) [C, MrlX-DeepResearch main scorer]: 0 for an invalid
       format, ``format_score`` (0.1) for a valid format with a wrong answer, 1.0 when
       correct.  Correct = R^k >= ``correct_threshold`` (MrlX's exact-match / judge
       correctness is binary; the threshold maps mas's reward onto it) [A].
     ``main_reward="linear"`` [S, themoonlight review]: α₁·r_format + α₂·r_correct with
       ``alpha_format``/``alpha_correct`` (0.1/0.9 [A]: valid-and-wrong 0.1, valid-and-correct
       1.0, as MrlX).
2. Sub reward R_S^{k,j} (per sub turn).  r_format = 1 if the sub turn parsed, r_expert =
   ``batch.turn_rewards[expert_key]`` (a judge score, "judge"; 0 when absent).
     ``sub_reward="mrlx"`` (default) [C, MrlX sub reward]: 0 if the sub turn's own format is
       invalid; otherwise 1.0 if the main score of its rollout is 1, else ``sub_format_score``
       (0.1).  "Main score = 1" is the event "main format valid and answer correct", used
       whichever ``main_reward`` is chosen [A].  The judge score is not used (MrlX's release
       has none in the reward).
     ``sub_reward="linear"`` [A, spec §3.2 reconstruction]: β₁·r_format + β₂·r_expert +
       β₃·R_M^k with ``beta_format``/``beta_expert``/``beta_main`` (0.1/0.0/0.9 [A]; set
       ``beta_expert`` > 0 to use a judge).
3. Main advantage [P "group-relative"; form A]: GRPO over the K rollouts of the task,
   Â_M^k = (R_M^k − mean) / (std + ε) (ddof 1, ε; exact 0 for a constant group and for a
   group of one rollout, ``normalise.py``; ``scale_by_std=False`` only centres), broadcast to the main agent's turns.
4. Trajectory alignment [S, blog summary; details A].  Each rollout k with d_k >= 1 is
   aligned to exactly D_max items: if d_k > D_max a uniformly random subset of D_max of its
   sub turns is kept, if d_k < D_max it is padded with D_max − d_k copies of its own sub
   turns drawn uniformly with replacement ("randomly chosen"; the summary's "good" ones are
   not modelled).  Rollouts with d_k = 0 contribute nothing [A].  D_max per task (and per
   sub-agent, below): ``d_max="max"`` max_k d_k (nothing dropped, default) [A], "median" the
   median of the d_k >= 1 rounded up [A], or a fixed integer.
   ``align_per_agent=True`` (default) [A] aligns and normalises each sub-agent on its own, as
   if each had its own sub server (M-GRPO's decoupled pipeline trains one sub model per
   server); with one sub-agent this is the paper's setting.  ``False`` pools all sub-agents'
   invocations into one set of slots per rollout.
5. Sub advantage [A]: GRPO over the aligned multiset (duplicates count as samples, dropped
   turns do not), ``sub_norm``: "pooled" over the K·D_max items of the task (default),
   "rollout" over the D_max items of each rollout, "subtask" per sub-task across the K
   rollouts, where the sub-task of an invocation is its position j (0-based, in turn order,
   before alignment) among its rollout's sub invocations [A].  Copies of a turn share its
   position, hence its segment and its per-item advantage A_item.  The statistics are those of
   ``normalise.py`` (ddof 1, ε, exact 0 for a constant segment); a segment of a single aligned
   item gets 0, as a one-rollout GRPO group does [A].

One advantage per turn: a sub turn aligned c times contributes c identical samples, and
Σ_items A_item·∇logπ(item) = Σ_turns (c·A_item)·∇logπ(turn), so the returned advantage of a
sub turn is copies × A_item (0 for a dropped turn).  Deviation: the learner's token-mean
denominator counts a duplicated turn once, not c times (M-GRPO's mean over K·D_max items
would give each unique sub-trajectory the weight c/(K·D_max)); the PPO clip is unaffected
(min(ρcA, clip(ρ)cA) = c·min(ρA, clip(ρ)A) for c >= 0).

Randomness: the alignment draws come from a private ``torch.Generator`` seeded with
``seed`` and a CRC of the batch (rewards, agents, turn layout, lengths).  The function is
therefore pure (the same batch gives the same alignment; no global RNG is read or consumed)
while successive training steps, whose batches differ, draw afresh.

All turns take part, trainable or not (the learner drops frozen and masked turns); with
``align_per_agent`` a frozen sub-agent has its own slots and statistics, so it never changes
a trainable agent's D_max or normalisation set (only, through the seed's batch CRC, which
random draws are made).

Breakdown: ``main_reward`` R_M [E], ``main_format`` r_format [E], ``main_advantage`` [E],
``sub_invocations`` d [E] (all sub-agents), ``turn_reward`` [N] (R_M on main turns, R_S on
sub turns), ``is_main`` [N], ``copies`` [N] (1 on main turns, 0 for dropped sub turns),
``item_advantage`` [N] (A of one aligned item; the main advantage on main turns; 0 if
dropped), ``sub_position`` [N] (j, −1 on main turns), ``d_max`` [N] (D_max of the turn's
alignment pool, 0 on main turns), ``norm_mean``/``norm_std``/``norm_count`` [N] (statistics
of the turn's segment; the count is of episodes for main turns, of aligned items for sub
turns, 0 for dropped turns).

Shapes: B task groups, E episodes, N flattened turns, K agents, Ns sub turns,
U alignment units (rollout, or rollout × sub-agent), P alignment pools (task, or task ×
sub-agent), M aligned items.
"""

from __future__ import annotations

import zlib
from typing import Annotated, Literal, NamedTuple

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, Results

from .base import CreditConfigBase
from .normalise import eps_field, normalise_segments, scale_by_std_field
from .registry import CREDIT_DTYPE, MethodCard, register_credit

RewardForm = Literal["mrlx", "linear"]
SubNorm = Literal["pooled", "rollout", "subtask"]


class MGRPOConfig(CreditConfigBase):
    """M-GRPO (arXiv 2511.13288): main/sub rewards, trajectory alignment, two-level GRPO."""

    method: Literal["m_grpo"] = Field("m_grpo", description="Credit method tag.")
    main_agent: str = Field(description="The main agent (planner / orchestrator); every other agent is a sub-agent. Required.")
    main_reward: RewardForm = Field(
        "mrlx",
        description="'mrlx': 0 invalid format, format_score valid but wrong, 1 correct (MrlX main scorer) [C]; "
        "'linear': alpha_format*r_format + alpha_correct*reward [S].",
    )
    format_score: float = Field(0.1, allow_inf_nan=False, description="mrlx main reward of a valid but wrong rollout (MrlX format_score) [C].")
    correct_threshold: float = Field(
        1.0, allow_inf_nan=False, description="A rollout is correct when its episode reward is >= this (mrlx main reward, mrlx sub reward) [A]."
    )
    alpha_format: float = Field(0.1, allow_inf_nan=False, description="linear main reward: weight of r_format [A].")
    alpha_correct: float = Field(0.9, allow_inf_nan=False, description="linear main reward: weight of the episode reward [A].")
    sub_reward: RewardForm = Field(
        "mrlx",
        description="'mrlx': 0 if the sub turn is invalid, else 1 if the main score is 1 (main valid and correct), else "
        "sub_format_score (MrlX) [C]; 'linear': beta_format*r_format + beta_expert*r_expert + beta_main*R_M [A].",
    )
    sub_format_score: float = Field(0.1, allow_inf_nan=False, description="mrlx sub reward of a valid sub turn whose main score is not 1 (MrlX) [C].")
    beta_format: float = Field(0.1, allow_inf_nan=False, description="linear sub reward: weight of the sub turn's r_format [A].")
    beta_expert: float = Field(0.0, allow_inf_nan=False, description="linear sub reward: weight of the judge score turn_rewards[expert_key] [A].")
    beta_main: float = Field(0.9, allow_inf_nan=False, description="linear sub reward: weight of the replicated main reward R_M [A].")
    expert_key: str = Field("judge", description="Per-turn signal (Turn.extra_rewards key) used as r_expert; 0 where absent.")
    d_max: Annotated[int, Field(ge=1)] | Literal["max", "median"] = Field(
        "max",
        description="Aligned sub items per rollout: 'max' (max d_k of the task, nothing dropped), 'median' (median of the "
        "d_k >= 1, rounded up), or a fixed integer >= 1 [A].",
    )
    align_per_agent: bool = Field(
        True, description="Align and normalise each sub-agent separately (one sub server each) [A]; False pools all sub-agents' invocations."
    )
    sub_norm: SubNorm = Field(
        "pooled",
        description="Sub advantage statistics over the aligned items: 'pooled' (K*D_max per task), 'rollout' (the D_max of a "
        "rollout), 'subtask' (per invocation position j across the K rollouts) [A].",
    )
    scale_by_std: bool = scale_by_std_field("Both levels.")
    eps: float = eps_field()
    seed: int = Field(0, description="Seed of the alignment draws (combined with a CRC of the batch, so each step draws afresh).")


class Alignment(NamedTuple):
    """Result of ``align``."""

    copies: torch.Tensor  # [Ns] long, aligned items of each sub turn (0 = dropped)
    position: torch.Tensor  # [Ns] long, j: index of the sub turn among its unit's sub turns, in turn order
    d: torch.Tensor  # [U] long, sub turns of each unit
    D: torch.Tensor  # [U] long, D_max of the unit's pool (0 for a unit without sub turns)


def align(
    unit: torch.Tensor, turn_pos: torch.Tensor, unit_pool: torch.Tensor, num_pools: int, d_max: int | str, generator: torch.Generator
) -> Alignment:
    """Trajectory alignment: every unit with d >= 1 sub turns gets exactly D items of its own.

    ``unit`` [Ns] is the alignment unit (rollout, or rollout × sub-agent) of each sub turn,
    ``turn_pos`` [Ns] its position in the episode (orders the turns of a unit), ``unit_pool``
    [U] the pool (task, or task × sub-agent) of each unit, over which "max"/"median" pick D.
    d > D: a uniformly random subset of D is kept; d < D: D − d extra copies drawn uniformly
    with replacement from the unit's own sub turns.
    """
    U = unit_pool.numel()
    Ns = unit.numel()
    dev = unit.device
    d = torch.bincount(unit, minlength=U)  # [U]
    start = torch.cumsum(d, 0) - d  # [U] first slot of each unit in unit-sorted order
    by_turn = torch.argsort(unit * (int(turn_pos.max()) + 1 if Ns else 1) + turn_pos)  # [Ns] sub turns sorted by (unit, turn)
    position = torch.empty(Ns, dtype=torch.long, device=dev)
    position[by_turn] = torch.arange(Ns, device=dev) - start[unit[by_turn]]  # [Ns] j

    active = d > 0  # [U]
    if isinstance(d_max, int):
        D_pool = torch.full((num_pools,), d_max, dtype=torch.long, device=dev)  # [P]
    elif d_max == "max":
        D_pool = torch.zeros(num_pools, dtype=torch.long, device=dev).scatter_reduce_(0, unit_pool, d, reduce="amax")  # [P]
    elif d_max == "median":
        dv, pv = d[active], unit_pool[active]  # [U'] the d >= 1 and their pools
        o = torch.argsort(pv * (int(dv.max()) + 1 if dv.numel() else 1) + dv)  # sort by (pool, d)
        dv, pv = dv[o], pv[o]
        cnt = torch.bincount(pv, minlength=num_pools)  # [P]
        first = torch.cumsum(cnt, 0) - cnt  # [P]
        has = cnt > 0  # [P]
        last = max(dv.numel() - 1, 0)
        lo = dv[(first + (cnt - 1).clamp(min=0) // 2).clamp(max=last)] if dv.numel() else torch.zeros_like(cnt)  # [P]
        hi = dv[(first + cnt // 2).clamp(max=last)] if dv.numel() else torch.zeros_like(cnt)  # [P]
        D_pool = torch.where(has, (lo + hi + 1) // 2, torch.zeros_like(cnt))  # [P] median rounded up
    else:
        raise ValueError(f"d_max must be an int >= 1, 'max' or 'median', got {d_max!r}")
    D = torch.where(active, D_pool[unit_pool], torch.zeros_like(d))  # [U]

    # keep: a random rank within each unit; the first D ranks survive (all of them when d <= D)
    u = torch.rand(Ns, generator=generator, dtype=torch.float64).to(dev)  # [Ns]
    shuffled = torch.argsort(unit.to(torch.float64) + u)  # [Ns] grouped by unit, random order inside
    rank = torch.empty(Ns, dtype=torch.long, device=dev)
    rank[shuffled] = torch.arange(Ns, device=dev) - start[unit[shuffled]]  # [Ns]
    keep = rank < D[unit]  # [Ns]

    # pad: D − d extra copies per unit, each a uniform draw from the unit's own sub turns
    need = (D - d).clamp(min=0)  # [U]
    draw_unit = torch.repeat_interleave(torch.arange(U, device=dev), need)  # [M_extra]
    r = torch.rand(draw_unit.numel(), generator=generator, dtype=torch.float64).to(dev)  # [M_extra]
    pick = torch.minimum((r * d[draw_unit]).long(), d[draw_unit] - 1)  # [M_extra] j of the copied turn
    extra = torch.bincount(by_turn[start[draw_unit] + pick], minlength=Ns)  # [Ns]
    copies = keep.long() + extra  # [Ns]
    return Alignment(copies=copies, position=position, d=d, D=D)


def _generator(batch: CreditBatch, seed: int) -> torch.Generator:
    """Private generator seeded by ``seed`` and a CRC of the batch's contents (see module docstring)."""
    h = 0
    parts = [batch.episode_rewards.to(torch.float64), batch.episode_ids, batch.agent_ids, batch.turn_ids, batch.invalid.to(torch.int64)]
    if batch.completion_lengths is not None:
        parts.append(batch.completion_lengths.to(torch.int64))
    for t in parts:
        h = zlib.crc32(t.detach().cpu().contiguous().numpy().tobytes(), h)
    return torch.Generator().manual_seed((seed * 0x9E3779B97F4A7C15 + h) % (2**63))


def main_rewards(batch: CreditBatch, cfg: MGRPOConfig, is_main: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R_M, r_format, main success) per episode, [E] each (float64, float64, bool)."""
    E = batch.num_episodes
    R = batch.episode_rewards.to(torch.float64)  # [E]
    bad = torch.zeros(E, dtype=torch.float64).index_add_(0, batch.episode_ids, (batch.invalid & is_main).to(torch.float64))  # [E]
    r_format = (bad == 0).to(torch.float64)  # [E]
    correct = R >= cfg.correct_threshold  # [E]
    if cfg.main_reward == "mrlx":
        RM = r_format * torch.where(correct, torch.ones_like(R), torch.full_like(R, cfg.format_score))  # [E]
    else:
        RM = cfg.alpha_format * r_format + cfg.alpha_correct * R  # [E]
    return RM, r_format, (r_format > 0) & correct


def sub_rewards(batch: CreditBatch, cfg: MGRPOConfig, RM: torch.Tensor, success: torch.Tensor) -> torch.Tensor:
    """R_S of every turn as if it were a sub turn (main turns are overwritten by the caller), float64.  [N]"""
    ep = batch.episode_ids  # [N]
    fmt = (~batch.invalid).to(torch.float64)  # [N]
    if cfg.sub_reward == "mrlx":
        return fmt * torch.where(success[ep], torch.ones_like(fmt), torch.full_like(fmt, cfg.sub_format_score))  # [N]
    expert = batch.turn_rewards.get(cfg.expert_key)
    expert = torch.zeros_like(fmt) if expert is None else expert.to(torch.float64)  # [N]
    return cfg.beta_format * fmt + cfg.beta_expert * expert + cfg.beta_main * RM[ep]  # [N]


@register_credit(
    "m_grpo", MGRPOConfig,
    card=MethodCard('outcome reward, hierarchical group-relative (M-GRPO)', 'agent role: main agent vs aligned sub-agent invocations', 'group mean and std of the main and of the sub-agent rewards, separately'),
)
def m_grpo(batch: CreditBatch, cfg: MGRPOConfig, results: Results | None = None) -> Credit:
    """Main turns: GRPO of R_M over the task's rollouts; sub turns: copies × GRPO of R_S over the aligned set.

    See the module docstring for the rewards, the alignment and the normalisation sets.
    Raises ValueError when ``main_agent`` is not one of ``batch.agent_names``.
    """
    if cfg.main_agent not in batch.agent_names:
        raise ValueError(f"m_grpo: main_agent {cfg.main_agent!r} is not an agent of the team; valid: {batch.agent_names}")
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    N, E = batch.num_turns, batch.num_episodes
    B = int(batch.episode_group_ids.max()) + 1 if E else 0
    K = len(batch.agent_names)
    ep, gid, aid = batch.episode_ids, batch.group_ids.to(torch.long), batch.agent_ids.to(torch.long)  # [N] each
    is_main = aid == batch.agent_names.index(cfg.main_agent)  # [N]

    # 1-3. rewards and the main advantage (GRPO over the K rollouts of each task)
    RM, r_format, success = main_rewards(batch, cfg, is_main)  # [E] each
    main = normalise_segments(RM, batch.episode_group_ids, num_segments=B, scale_by_std=cfg.scale_by_std, eps=cfg.eps)  # [E]
    RS = sub_rewards(batch, cfg, RM, success)  # [N]

    # 4. alignment of the sub turns, per unit (rollout [× sub-agent]) within pools (task [× sub-agent])
    sub_idx = torch.nonzero(~is_main).flatten()  # [Ns] flattened index of each sub turn
    if cfg.align_per_agent:
        unit, pool = ep[sub_idx] * K + aid[sub_idx], gid[sub_idx] * K + aid[sub_idx]  # [Ns]
        unit_pool = (batch.episode_group_ids.to(torch.long)[:, None] * K + torch.arange(K)[None, :]).flatten()  # [U = E*K]
        num_pools = B * K
    else:
        unit, pool = ep[sub_idx], gid[sub_idx]  # [Ns]
        unit_pool = batch.episode_group_ids.to(torch.long)  # [U = E]
        num_pools = B
    al = align(unit, batch.turn_ids[sub_idx].to(torch.long), unit_pool, num_pools, cfg.d_max, _generator(batch, cfg.seed))

    # 5. sub advantage: GRPO over the aligned multiset, then summed back per turn (copies × A_item)
    item = torch.repeat_interleave(torch.arange(sub_idx.numel()), al.copies)  # [M] which sub turn each item is
    if cfg.sub_norm == "pooled":
        seg = pool[item]  # [M]
    elif cfg.sub_norm == "rollout":
        seg = unit[item]  # [M]
    else:  # subtask: (pool, position j)
        J = int(al.position.max()) + 1 if al.position.numel() else 1
        seg = pool[item] * J + al.position[item]  # [M]
    norm = normalise_segments(RS[sub_idx][item], seg, scale_by_std=cfg.scale_by_std, eps=cfg.eps)  # [M]
    turn_of_item = sub_idx[item]  # [M]

    zeros = torch.zeros(N, dtype=torch.float64)
    sub_adv = zeros.clone().index_add_(0, turn_of_item, norm.values.to(torch.float64))  # [N] copies × A_item
    item_adv = zeros.clone().index_copy_(0, turn_of_item, norm.values.to(torch.float64))  # [N] copies share A_item
    mean_n = zeros.clone().index_copy_(0, turn_of_item, norm.mean.to(torch.float64))  # [N]
    std_n = zeros.clone().index_copy_(0, turn_of_item, norm.std.to(torch.float64))  # [N]
    count_n = torch.zeros(N, dtype=torch.long).index_copy_(0, turn_of_item, norm.count)  # [N]

    main_adv = main.values.to(torch.float64)[ep]  # [N]
    advantages = torch.where(is_main, main_adv, sub_adv)  # [N]
    copies = torch.ones(N, dtype=torch.long)
    copies[sub_idx] = al.copies  # [N]
    position = torch.full((N,), -1, dtype=torch.long)
    position[sub_idx] = al.position  # [N]
    d_max_n = torch.zeros(N, dtype=torch.long)
    d_max_n[sub_idx] = al.D[unit]  # [N]
    sub_count = torch.bincount(ep[sub_idx], minlength=E)  # [E]

    breakdown = {
        "main_reward": RM.to(dtype),  # [E]
        "main_format": r_format.to(dtype),  # [E]
        "main_advantage": main.values.to(dtype),  # [E]
        "sub_invocations": sub_count,  # [E]
        "turn_reward": torch.where(is_main, RM[ep], RS).to(dtype),  # [N]
        "is_main": is_main,  # [N]
        "copies": copies,  # [N]
        "item_advantage": torch.where(is_main, main_adv, item_adv).to(dtype),  # [N]
        "sub_position": position,  # [N]
        "d_max": d_max_n,  # [N]
        "norm_mean": torch.where(is_main, main.mean.to(torch.float64)[ep], mean_n).to(dtype),  # [N]
        "norm_std": torch.where(is_main, main.std.to(torch.float64)[ep], std_n).to(dtype),  # [N]
        "norm_count": torch.where(is_main, main.count[ep], count_n),  # [N]
    }
    # a dropped sub turn (copies = 0) is not in the aligned set: leave it out of the update too,
    # rather than train it with A = 0 (which would dilute the token-mean of the others)
    return Credit(advantages=advantages.to(dtype), breakdown=breakdown, train_mask=copies > 0)  # [N]
