"""C3: contextual counterfactual credit on a context-frozen replay tree (Chen et al. 2026, arXiv 2603.06859).

CREDIT_SPEC §5.  C3 freezes the exact transcript up to a decision, resamples that decision
from the behaviour policy ("fixed-continuation replay"), and credits each message against a
leave-one-out (LOO) baseline over its context-matched siblings.

The tree [C, ``EIT-EAST-Lab/C3`` "Rule-B nested rollout", read as turn positions here]:
  * depth d = the turn's position in its episode (turn order).  The official code builds
    the tree over roles in topological order of a DAG (Reasoner → Actor); for a general
    topology (loops, orchestrators, debates) this module uses the turn position instead
    [A]: the context of the node at depth d is the task plus turns 0..d-1 of the branch.
    Only the first ``len(fanout)`` turns of an episode are tree nodes.
  * depth 0: the G rollouts of a task are the roots' siblings (their frozen context is the
    task alone).  ``fanout[0]`` is therefore not sampled here; ``plan`` checks that every
    task group has exactly ``fanout[0]`` episodes (set ``trainer.group_size`` to it).
  * depth d ≥ 1: for every recorded episode e, ``plan`` asks for
    ``ReplayRequest(key=f"c3/{e}/{d}", source=ep, freeze_upto=d, num_samples=fanout[d]-1)``:
    turns 0..d-1 reused token for token, turn d and everything after resampled.  The
    recorded episode is itself one of the fanout[d] siblings, so the sibling group at
    (e, d) is {recorded turn d} ∪ {the fanout[d]-1 replays}.  fanout[d] = 1 plans nothing
    (a sibling group of one).

No replay [C, ``c3/credit/c3/provider.py`` docstring, ``--c3_no_replay``]: C3's no-replay
ablation keeps the tree's depths but collapses the parent id at every depth d >= 1, so a
depth-d sibling group holds all prod(fanout[:d+1]) nodes of that depth under the question.
``no_replay`` does the same here: the depth-d group of a task pools the recorded depth-d
nodes of all its episodes (and their replays, if any).  Its default (None) turns it on
exactly for fanout (G, 1, ...), C3's ablation setting, where per-parent groups would hold
one node each and give every turn after the first 0.

Node values (``reward_source="subtree_mean"`` [C]):
  * a leaf = its terminal reward;
  * an interior node = mean reward of its leaf subtree.  The subtree of the recorded turn
    at depth d holds the recorded episode and every replay of e at a depth d' > d (they
    all share turns 0..d of e):  Q̂(e, d) = (R_e + Σ_{d'>d} Σ_j R_{e,d',j}) / (1 + Σ_{d'>d} n_{e,d'}).
  * a replay at depth d is one continuation, so its value is its own terminal reward.
Credit of the recorded turn at depth d, in its sibling group of size n with values Q̂_j:
    loo        A = Q̂_rec − (1/(n−1)) Σ_{j≠rec} Q̂_j     (= n/(n−1)·(Q̂_rec − mean Q̂));  n = 1: A = 0
    full_mean  A = Q̂_rec − mean_j Q̂_j                   (the "no LOO" ablation [C])
then, with ``std_norm`` [C, default on], every sibling group's credits are standardised:
    A ← (A − mean_g A) / sqrt(var_g A + 1e-8),  var the population variance (OpenRLHF-style),
so a constant group (or a group of one) gives exactly 0.  With LOO and std_norm the
n/(n−1) factor cancels: ``reward_only`` C3 ≡ GRPO with population std in each sibling
group (CREDIT_SPEC §5.7).  Turns beyond the tree depth (position ≥ len(fanout)) get the
advantage of their deepest tree ancestor, the node at position len(fanout)−1 of the same
episode [A].  A pipeline ``normaliser`` (default none) is applied to the result.

Deviations from the paper / official code:
  * Only the recorded turns (the main rollout) are trained; the replays are context-matched
    alternatives that only enter the sibling baselines and the node values.  C3 trains
    every node of the tree [deviation].  The recorded turn's credit is exactly C3's for
    that node; the alternatives' own gradients are not used.
  * A replay at depth d is a single continuation, not a subtree of Π_{t>d} F_t leaves, so
    for trees deeper than two levels an alternative's Q̂ is a one-sample estimate (still
    unbiased, noisier) [deviation].  For the default (2, 4) every alternative is a leaf,
    as in the paper.
  * ``variant`` is ``reward_only`` only: the parameter-free form the paper claims.  The
    code's default ``value_assisted`` (α = 1) and ``value_only`` need a learned Q-critic and
    are not implemented.
  * A replay whose episode failed (``status == "error"``) is left out of its sibling group
    and of the node values [A] (an infrastructure failure is not a sample of π_old); the
    count is reported as ``replay_failures``.  A recorded episode that failed keeps its
    reward 0 as a depth-0 sibling (as in every other method); the trainer does not train
    its turns.
  * The official code standardises after a whole-batch pass; here the statistics are per
    sibling group, in float64.

Cost per task (CREDIT_SPEC §5.4): G rollouts plus G·Σ_{d≥1}(F_d − 1) replays, each
resampling every turn from position d on; for (2, 4) on a two-turn chain, 2 + 6 = 8
actor generations beyond the 2 reasoner messages, i.e. 10 messages as in the paper.

Breakdown: ``node_value`` [N] Q̂ of the turn's (recorded) node, ``sibling_baseline`` [N] the
baseline subtracted from it (LOO or full mean), ``sibling_count`` [N] n, ``tree_depth`` [N]
the node depth that gave the turn its credit, ``raw_credit`` [N] the credit before
``std_norm``, ``replays`` (scalar) replay episodes used, ``replay_failures`` (scalar).

Shapes: B task groups, E episodes, N flattened turns, D = len(fanout) tree depths,
M replay episodes used, K = tree nodes (recorded nodes + M replays), S sibling groups.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator

from mas.types import Credit, CreditBatch, EpisodeGroup, ReplayRequest, Request, Results

from .base import CreditConfigBase
from .normalise import NormaliserName, RawScores, eps_field, normalise_credit, normaliser_field, scale_by_std_field, segment_moments
from .registry import CREDIT_DTYPE, MethodCard, register_credit, run_rewards

STD_NORM_EPS = 1e-8  # inside the sqrt, as in the official code [C]


class C3Config(CreditConfigBase):
    """C3 (arXiv 2603.06859): replay tree over turn positions [A], subtree-mean values, LOO baseline."""

    method: Literal["c3"] = Field("c3", description="Credit method tag.")
    fanout: tuple[int, ...] = Field(
        (2, 4),
        min_length=1,
        description="Siblings per tree depth, depth = turn position in the episode [A: the paper's roles in topological "
        "order]. fanout[0] must equal trainer.group_size (the G rollouts are the root siblings); fanout[d] - 1 replays "
        "are sampled per episode at depth d >= 1. Paper: (2, 4) for K = 8; (K, 1) is the no-replay ablation [C] (see no_replay).",
    )
    variant: Literal["reward_only"] = Field(
        "reward_only",
        description="Node signal: subtree-mean reward (the paper's parameter-free form). The code's Q-critic variants "
        "(value_only, value_assisted) are not implemented.",
    )
    baseline: Literal["loo", "full_mean"] = Field(
        "loo", description="Sibling baseline: leave-one-out mean (C3) or the mean including the node itself (the 'no LOO' ablation) [C]."
    )
    std_norm: bool = Field(
        True,
        description="Standardise the credits of each sibling group: (A - mean) / sqrt(var + 1e-8), population variance "
        "(C3 code default; --no_advantage_std_norm turns it off) [C].",
    )
    no_replay: bool | None = Field(
        None,
        description="Sibling groups at depth >= 1 pool every node of that depth in the task group, ignoring the parent "
        "(C3's --c3_no_replay ablation: its rollout collapses the parent id, so a depth-d group holds prod(fanout[:d+1]) "
        "nodes) [C]. None: on exactly when every fanout[d] for d >= 1 is 1, i.e. fanout [G, 1], where per-parent groups "
        "would have one node each and give every turn after the first 0.",
    )
    normaliser: NormaliserName = normaliser_field("none", "C3 default: none (std_norm already standardises each sibling group).")
    scale_by_std: bool = scale_by_std_field("Only for the pipeline normaliser.")
    eps: float = eps_field("Only for the pipeline normaliser.")

    @field_validator("fanout")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(f < 1 for f in v):
            raise ValueError(f"every fanout entry must be >= 1, got {list(v)}")
        return v


def no_replay(cfg: C3Config) -> bool:
    """Whether depth >= 1 siblings are pooled over the task group (``no_replay``, or its automatic value)."""
    if cfg.no_replay is not None:
        return cfg.no_replay
    return len(cfg.fanout) > 1 and all(f == 1 for f in cfg.fanout[1:])


def replay_key(episode: int, depth: int) -> str:
    """Canonical request key of the replays of episode ``episode`` at tree depth ``depth``."""
    return f"c3/{episode}/{depth}"


def _replay_depths(num_turns: int, fanout: tuple[int, ...]) -> list[int]:
    """Depths d >= 1 of an episode with ``num_turns`` turns that get replays."""
    return [d for d in range(1, min(len(fanout), num_turns)) if fanout[d] > 1]


def plan_c3(groups: list[EpisodeGroup], cfg: C3Config) -> list[Request]:
    """One ``ReplayRequest`` per (episode, depth d ≥ 1 with fanout[d] > 1 and a turn at d).

    Raises ValueError if a task group does not have exactly fanout[0] episodes.
    """
    requests: list[Request] = []
    e = 0
    for b, group in enumerate(groups):
        if len(group.episodes) != cfg.fanout[0]:
            raise ValueError(
                f"c3: task group {b} has {len(group.episodes)} episodes but fanout[0] = {cfg.fanout[0]}; "
                f"the G rollouts of a task are the root siblings, so set trainer.group_size = fanout[0]"
            )
        for ep in group.episodes:
            for d in _replay_depths(len(ep.turns), cfg.fanout):
                requests.append(ReplayRequest(key=replay_key(e, d), source=ep, freeze_upto=d, num_samples=cfg.fanout[d] - 1))
            e += 1
    return requests


def _collect_replays(batch: CreditBatch, cfg: C3Config, results: Results | None) -> tuple[list[int], list[int], list[float], int]:
    """(episode, depth, reward) of every usable replay episode, and the number that failed."""
    turns_per_episode = torch.bincount(batch.episode_ids, minlength=batch.num_episodes).tolist()  # [E]
    rep_e: list[int] = []
    rep_d: list[int] = []
    rep_r: list[float] = []
    failures = 0
    for e, n_turns in enumerate(turns_per_episode):
        for d in _replay_depths(n_turns, cfg.fanout):
            rewards, failed = run_rewards(results, replay_key(e, d), "c3", "replay")
            failures += failed
            rep_e += [e] * len(rewards)
            rep_d += [d] * len(rewards)
            rep_r += rewards
    return rep_e, rep_d, rep_r, failures


@register_credit(
    "c3", C3Config, plan=plan_c3,
    card=MethodCard('counterfactual: context-frozen replays, leave-one-out (C3)', 'turn', 'mean of the sibling replays from the same frozen context'),
)
def c3(batch: CreditBatch, cfg: C3Config, results: Results | None = None) -> Credit:
    """Per-turn C3 credit Q̂(recorded node) − sibling baseline, standardised per sibling group.

    See the module docstring for the tree, the formulas, the [A] choices and the deviations.
    """
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    dev = batch.episode_ids.device
    E, B, D = batch.num_episodes, int(batch.episode_group_ids.max()) + 1 if batch.num_episodes else 0, len(cfg.fanout)
    rep_e, rep_d, rep_r, failures = _collect_replays(batch, cfg, results)
    re_ = torch.tensor(rep_e, dtype=torch.long, device=dev)  # [M]
    rd = torch.tensor(rep_d, dtype=torch.long, device=dev)  # [M]
    rr = torch.tensor(rep_r, dtype=torch.float64, device=dev)  # [M]
    R = batch.episode_rewards.to(torch.float64)  # [E]

    # node values: Q̂(e, d) = mean of R_e and every replay of e deeper than d
    flat = re_ * D + rd  # [M] index into the [E, D] grid
    rep_sum = torch.zeros(E * D, dtype=torch.float64, device=dev).index_add_(0, flat, rr).view(E, D)  # [E, D]
    rep_cnt = torch.zeros(E * D, dtype=torch.float64, device=dev).index_add_(0, flat, torch.ones_like(rr)).view(E, D)  # [E, D]
    deeper_sum = rep_sum.flip(1).cumsum(1).flip(1) - rep_sum  # [E, D] Σ_{d'>d}
    deeper_cnt = rep_cnt.flip(1).cumsum(1).flip(1) - rep_cnt  # [E, D]
    q_rec = (R[:, None] + deeper_sum) / (1.0 + deeper_cnt)  # [E, D]

    # tree nodes: the recorded node (e, d) for d < min(T_e, D), then the replays
    n_turns = torch.bincount(batch.episode_ids, minlength=E)  # [E]
    depth = torch.arange(D, device=dev)  # [D]
    exists = depth[None, :] < n_turns[:, None].clamp(max=D)  # [E, D]
    node_e, node_d = exists.nonzero(as_tuple=True)  # [R_n] each
    ep_group = batch.episode_group_ids.to(torch.long)  # [E]
    # sibling group: depth 0 -> the task group b; depth d >= 1 -> (e, d), numbered after the B task groups;
    # without replay (C3's c3_no_replay) depth d >= 1 -> (b, d): every depth-d node of the task, parents ignored
    if no_replay(cfg):
        rec_sib = torch.where(node_d == 0, ep_group[node_e], B + ep_group[node_e] * D + node_d)  # [R_n]
        rep_sib = B + ep_group[re_] * D + rd  # [M]
    else:
        rec_sib = torch.where(node_d == 0, ep_group[node_e], B + node_e * D + node_d)  # [R_n]
        rep_sib = B + re_ * D + rd  # [M]
    sib = torch.cat([rec_sib, rep_sib])  # [K]
    value = torch.cat([q_rec[node_e, node_d], rr])  # [K]
    S = B + max(E, B) * D

    count = torch.bincount(sib, minlength=S).to(torch.float64)  # [S]
    total = torch.zeros(S, dtype=torch.float64, device=dev).index_add_(0, sib, value)  # [S]
    n = count[sib]  # [K]
    if cfg.baseline == "loo":
        # (total − own) / (n − 1); a lone node is its own baseline, so its credit is 0
        base = torch.where(n > 1, (total[sib] - value) / (n - 1).clamp(min=1), value)  # [K]
    else:
        base = total[sib] / n  # [K]
    credit = value - base  # [K]
    raw = credit
    if cfg.std_norm:
        mean, std, _ = segment_moments(credit, sib, S)  # [S] each: population std, overflow-safe
        credit = (credit - mean[sib]) / torch.hypot(std[sib], torch.tensor(math.sqrt(STD_NORM_EPS), dtype=torch.float64))  # [K] sqrt(var + 1e-8)

    # back to the recorded turns: a turn at position t takes the node at depth min(t, D − 1)
    R_n = node_e.numel()
    grid = lambda x: torch.zeros(E, D, dtype=torch.float64, device=dev).index_put_((node_e, node_d), x[:R_n])  # noqa: E731
    adv_grid, base_grid, raw_grid, cnt_grid = grid(credit), grid(base), grid(raw), grid(n)  # [E, D] each
    ep = batch.episode_ids  # [N]
    tdepth = batch.turn_ids.clamp(max=D - 1)  # [N]
    turn_adv = adv_grid[ep, tdepth]  # [N]

    ep_score = torch.zeros(E, dtype=torch.float64, device=dev).index_add_(0, ep, turn_adv) / n_turns.clamp(min=1)  # [E]
    norm = normalise_credit(batch, RawScores(turn=turn_adv, episode=ep_score), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    breakdown = {
        "node_value": q_rec[ep, tdepth].to(dtype),  # [N]
        "sibling_baseline": base_grid[ep, tdepth].to(dtype),  # [N]
        "sibling_count": cnt_grid[ep, tdepth].to(torch.long),  # [N]
        "tree_depth": tdepth,  # [N]
        "raw_credit": raw_grid[ep, tdepth].to(dtype),  # [N]
        "replays": torch.tensor(float(rr.numel()), dtype=dtype),  # scalar
        "replay_failures": torch.tensor(float(failures), dtype=dtype),  # scalar
    }
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)  # [N]
