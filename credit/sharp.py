"""SHARP: Shapley credit + broadcast accuracy + tool-process reward, agent-wise normalised.

Li, Zhang, …, Shen, arXiv 2602.08335 (ICML 2026); CREDIT_SPEC §4.  No official code was
found and only the abstract was readable [P]; the rest comes from summaries [S] and is
filled in with assumptions [A], each a config option.

Per-agent reward of agent m in episode i, then agent-wise normalisation:

    R_{i,m} = R^b_i + λ_s · φ_{i,m} + λ_p · R^tool_{i,m}
    Â_{i,m} = (R_{i,m} − μ_m) / (σ_m + ε)        (normaliser ``agent``, per task group)

and every turn of m in episode i gets Â_{i,m}.

  * R^b_i  the episode's own outcome reward (the "broadcast accuracy" reward) [P].
  * φ_{i,m} the marginal credit of m over the players of episode i (``marginal``):
      exact  exact Shapley (``shapley.py``), the default up to ``max_exact_players`` = 8
             players, Monte-Carlo permutation Shapley with ``mc_permutations`` orderings
             beyond [A: the spec's recommendation];
      mc     Monte-Carlo permutation Shapley always (unbiased, P·n coalition look-ups);
      loo    the single-mask marginal v(N) − v(N∖{m}) that SHARP reportedly uses [S]
             (not Shapley unless the game is additive).
  * Players of episode i [A]: the agents (``players: agents``) that have at least one turn
    in i, minus ``exclude`` (agents that are always present and never masked, e.g. a
    planner or synthesiser; the spec's most plausible reading is "workers are players,
    the planner is always present" [A]).  Excluded agents get φ = 0.
  * Coalition value [A]: v_i(S) = score of episode i re-run through the engine with every
    player outside S masked (``mask_mode`` mask: "[masked]" placeholder text; remove: no
    message) and every other agent's realised output kept at its turn position
    (``InterventionRequest(keep_others=True)``).  v_i(N) is the episode's own reward (no
    re-run); v_i(∅) masks every player.  The agents in ``exclude`` (the planner /
    synthesiser, "always present") are *re-sampled* on every coalition
    (``InterventionRequest.resample``): the final answer is re-synthesised from the masked
    transcript, the reading of "masked re-evaluation" in the spec's pseudo-code.  With
    ``exclude`` empty nothing is re-sampled and the score is read from the kept transcript by
    the topology's own answer rule (latest answer, majority vote, ...): the "no LLM re-run"
    reading of the secondary notes [S].
  * An errored counterfactual episode counts as v = 0 [A] (the engine scores errored
    episodes 0 as well) and is counted in ``coalition_failures``.  An errored *source*
    episode (reward 0) is planned like any other: the batch does not carry episode status.
  * R^tool_{i,m} [A]: the per-turn signal ``batch.turn_rewards[tool_key]`` (default
    ``tool_valid``: the fraction of the turn's tool calls that were valid, set by the engine
    on every turn that made calls) averaged over m's turns in episode i that carry it
    (``batch.turn_reward_present``); 0 when m has no such turn in i.  Turns without calls
    (m's replies) are left out, so the reward measures validity, not volume: one valid call
    and four valid calls both score 1, a valid and a malformed call ½.
  * ``sparsify`` [A: the paper's "sparsification parameter", meaning unknown]: credits
    with |φ| < sparsify are set to 0 (0 disables it).
  * Normalisation: the shared normaliser machinery, default ``agent`` (per task group and
    agent over that agent's turns, as Dr. MAS).  The spec writes μ_m, σ_m "over the G
    rollouts", i.e. one sample per (episode, agent); ``agent_samples: episode`` does that,
    the default ``turn`` weights an agent by its number of turns (Dr. MAS).  Both agree
    when every agent acts once per episode [A: the paper's normalisation set is unknown].

Planning (docs/architecture.md plan -> execute -> assign): ``plan_sharp`` asks for ONE
``InterventionRequest`` per distinct (episode, coalition ≠ N), keyed
``coalition_key(e, masked)`` = ``"sharp/{e}/" + ",".join(sorted(masked))``, where e is the
running episode index of the batch.  The coalitions are exactly those the estimator
evaluates (``shapley.queried_coalitions``), so the MC orderings, which revisit the same
subsets, read the same keys and nothing is evaluated twice.  All requests of a step run in
one concurrent engine pass.  With λ_s = 0 nothing is planned and φ = 0.  MC orderings of
episode e come from a generator seeded with (``seed``, e) [A]: the batch carries no step
number, so the same orderings recur for episode index e at every step (each step's
estimate is still unbiased).

Identities: with λ_s = λ_p = 0, R_{i,m} = R_i, so SHARP is per-agent GRPO on the broadcast
reward (``grpo`` with normaliser agent, = ``dr_mas`` without penalty); when every agent acts
once per episode that equals plain GRPO.

Cost per group (n players): exact 2^n − 1 re-runs per episode, loo n, mc at most
min(P·(n − 1) + 1, 2^n − 1)
(distinct coalitions only).  ``coalition_evals`` counts the re-runs read.

Breakdown: ``marginal`` φ [N], ``broadcast`` R^b [N], ``tool`` R^tool [N], ``turn_reward``
R_{i,m} [N], ``players`` [E] (players per episode), ``coalition_evals`` and
``coalition_failures`` (scalar), ``norm_mean``/``norm_std``/``norm_count`` [N].

Shapes: B task groups, E episodes, N flattened turns, K agents (len(agent_names)),
n players of one episode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, EpisodeGroup, InterventionRequest, Request, Results

from .base import CreditConfigBase
from .normalise import NormaliserName, RawScores, agent_group_key, eps_field, normalise_credit, normaliser_field, normalise_segments, scale_by_std_field
from .registry import CREDIT_DTYPE, MethodCard, register_credit
from .shapley import Coalition, MarginalKind, marginal_contributions, queried_coalitions


class SharpConfig(CreditConfigBase):
    """SHARP (arXiv 2602.08335): R = R^b + λ_s·φ + λ_p·R^tool, agent-wise normalised.

    Every choice marked [A] is an assumption (the paper's method section was not readable).
    """

    method: Literal["sharp"] = Field("sharp", description="Credit method tag.")
    lambda_s: float = Field(1.0, allow_inf_nan=False, description="Weight λ_s of the marginal (Shapley) credit [A: paper value unknown]. 0 plans no coalition evaluations.")
    lambda_p: float = Field(
        0.0, allow_inf_nan=False,
        description="Weight λ_p of the tool-process reward [A: paper value unknown]. The tool reward is the per-turn signal named by tool_key averaged over the agent's turns in the episode that carry it (its tool-calling turns for tool_valid), 0 when it has none.",
    )
    tool_key: str = Field("tool_valid", min_length=1, description="Name of the per-turn signal (Turn.extra_rewards / CreditBatch.turn_rewards) used as the tool-process reward [A].")
    marginal: MarginalKind = Field(
        "exact",
        description="Marginal credit: 'exact' Shapley up to max_exact_players (Monte-Carlo permutation Shapley beyond), 'mc' permutation Shapley always, 'loo' the leave-one-out masking marginal v(N) - v(N minus m) SHARP reportedly uses [S].",
    )
    max_exact_players: int = Field(8, ge=1, le=16, description="Largest player count for exact Shapley (2^n - 1 re-runs per episode); above it 'exact' uses mc_permutations orderings.")
    mc_permutations: int = Field(64, ge=1, description="Orderings P of Monte-Carlo permutation Shapley (distinct coalitions are evaluated once).")
    players: Literal["agents"] = Field("agents", description="Who the credit is over [A]: 'agents' = every agent with at least one turn in the episode (minus exclude).")
    exclude: tuple[str, ...] | None = Field(
        None,
        description="Agents that are never players: always present, never masked, credit 0, and re-sampled (after the "
        "first masked message) on every coalition so the answer is re-synthesised from the masked team [A]. "
        "None = the agent of each episode's last turn, the one who gives the final answer; [] = nobody (the answer "
        "is then read from the kept transcript, e.g. a debate's majority vote).",
    )
    mask_mode: Literal["mask", "remove"] = Field("mask", description="How players outside a coalition are taken out: 'mask' (placeholder text) or 'remove' (no message) [A].")
    sparsify: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="Marginal credits with |phi| below this are set to 0 [A: the paper's sparsification parameter, meaning unknown]; 0 disables it.")
    seed: int = Field(0, description="Seed of the Monte-Carlo orderings (episode e uses a generator seeded from (seed, e)).")
    normaliser: NormaliserName = normaliser_field("agent", "SHARP default: agent.")
    agent_samples: Literal["turn", "episode"] = Field(
        "episode",
        description="With normaliser agent: 'turn' counts each of the agent's turns as a sample (Dr. MAS); 'episode' uses one sample per (episode, agent), the spec's 'over the G rollouts' [A]. Equal when every agent acts once per episode.",
    )
    scale_by_std: bool = scale_by_std_field()
    eps: float = eps_field()


# --- players, keys and coalitions (shared by plan and assign) -------------------------------


def episode_players(agents: Iterable[str], exclude: Iterable[str] = ()) -> list[str]:
    """Players of an episode: the distinct acting agents not in ``exclude``, sorted by name."""
    return sorted(set(agents) - set(exclude))


def coalition_key(episode: int, masked: Iterable[str]) -> str:
    """Canonical request key of the re-run of episode ``episode`` with ``masked`` players masked."""
    return f"sharp/{episode}/" + ",".join(sorted(masked))  # agent names are identifiers (no ","): no collisions


def _episode_seed(seed: int, episode: int) -> int:
    return (int(seed) * 1_000_003 + episode) % (1 << 63)


def _estimator_args(cfg: SharpConfig, episode: int) -> dict:
    return dict(permutations=cfg.mc_permutations, seed=_episode_seed(cfg.seed, episode), max_exact_players=cfg.max_exact_players)


def _masked(players: list[str], S: Coalition) -> list[str]:
    return [p for i, p in enumerate(players) if i not in S]


def plan_sharp(groups: list[EpisodeGroup], cfg: SharpConfig) -> list[Request]:
    """One intervention per distinct (episode, coalition ≠ N) the estimator evaluates."""
    if cfg.lambda_s == 0:
        return []
    requests: list[Request] = []
    episodes = [ep for g in groups for ep in g.episodes]
    for e, ep in enumerate(episodes):
        players = episode_players((t.agent for t in ep.turns), _excluded(cfg, ep.turns[-1].agent if ep.turns else None))
        for S in queried_coalitions(len(players), cfg.marginal, **_estimator_args(cfg, e)):
            masked = _masked(players, S)
            if masked:  # the full coalition is the episode itself
                requests.append(InterventionRequest(coalition_key(e, masked), ep, tuple(masked), mode=cfg.mask_mode,
                                                    keep_others=True, resample=_resampled(cfg, ep)))
    return requests


def _excluded(cfg: "SharpConfig", last_agent: str | None) -> set[str]:
    """Agents that are not players in an episode whose last turn is by ``last_agent``."""
    if cfg.exclude is None:
        return {last_agent} if last_agent is not None else set()
    return set(cfg.exclude)


def _resampled(cfg: "SharpConfig", ep) -> tuple[str, ...]:
    """Non-player agents of the episode that re-read the masked team (sorted, for stable keys)."""
    last = ep.turns[-1].agent if ep.turns else None
    return tuple(sorted({t.agent for t in ep.turns} & _excluded(cfg, last)))


# --- assign -----------------------------------------------------------------------------------


def _segment_mean(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean per segment with 0 for empty ones, count per segment).  ([S], [S])"""
    total = torch.zeros(num_segments, dtype=torch.float64).index_add_(0, segment_ids, values.to(torch.float64))  # [S]
    count = torch.bincount(segment_ids, minlength=num_segments)  # [S]
    return total / count.clamp(min=1), count


class Marginals(NamedTuple):
    """Marginal credit of every (episode, agent) from the coalition re-runs (also ``mas audit``'s ground truth)."""

    phi: torch.Tensor  # [E, K] float64; 0 for agents that are not players of the episode
    is_player: torch.Tensor  # [E, K] bool
    evals: int  # coalition re-runs read
    failures: int  # of which errored (value 0)


def coalition_marginals(batch: CreditBatch, cfg: SharpConfig, results: Results | None) -> Marginals:
    """φ per (episode, agent) from the results of ``plan_sharp`` (module docstring), before ``sparsify``."""
    phi, is_player, evals, failures = _marginals(batch, cfg, results, sparsify=False)
    return Marginals(phi, is_player, evals, failures)


def _marginals(batch: CreditBatch, cfg: SharpConfig, results: Results | None, sparsify: bool = True) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """φ per (episode, agent) [E, K], players [E, K] bool, re-runs read, failed re-runs."""
    E, K = batch.num_episodes, len(batch.agent_names)
    present = torch.zeros(E, K, dtype=torch.bool)
    present[batch.episode_ids, batch.agent_ids] = True  # [E, K] agent k acts in episode e
    excluded = torch.zeros(E, K, dtype=torch.bool)  # [E, K]
    if cfg.exclude is None:  # the agent of each episode's last turn
        last_turn = torch.full((E,), -1, dtype=torch.long).scatter_reduce_(0, batch.episode_ids, batch.turn_ids, reduce="amax")  # [E]
        is_last = batch.turn_ids == last_turn[batch.episode_ids]  # [N]
        excluded[batch.episode_ids[is_last], batch.agent_ids[is_last]] = True
    else:
        excluded[:, [k for k, a in enumerate(batch.agent_names) if a in cfg.exclude]] = True
    is_player = present & ~excluded  # [E, K]
    phi = torch.zeros(E, K, dtype=torch.float64)  # [E, K]
    if cfg.lambda_s == 0:
        return phi, is_player, 0, 0
    index = {name: k for k, name in enumerate(batch.agent_names)}
    rewards = batch.episode_rewards.to(torch.float64).tolist()  # [E]
    evals = failures = 0
    for e in range(E):  # per-episode loop: coalition values are dictionary look-ups
        players = episode_players(batch.agent_names[k] for k in torch.nonzero(is_player[e]).flatten().tolist())
        if not players:
            continue
        cache: dict[str, float] = {}

        def value(S: Coalition, e: int = e, players: list[str] = players, cache: dict[str, float] = cache) -> float:
            nonlocal evals, failures
            masked = _masked(players, S)
            if not masked:
                return rewards[e]
            key = coalition_key(e, masked)
            if key not in cache:
                if results is None or not results.get(key):
                    raise KeyError(f"sharp: no result for coalition re-run {key!r}; run the requests of plan_sharp through Engine.execute first")
                ep = results[key][0]
                evals += 1
                failures += ep.status == "error"
                cache[key] = 0.0 if ep.status == "error" else float(ep.reward)
            return cache[key]

        credit = marginal_contributions(len(players), value, cfg.marginal, **_estimator_args(cfg, e))  # [n]
        cols = torch.tensor([index[p] for p in players], dtype=torch.long)  # [n]
        phi[e, cols] = credit
    if sparsify and cfg.sparsify > 0:
        phi = torch.where(phi.abs() < cfg.sparsify, torch.zeros_like(phi), phi)  # [E, K]
    return phi, is_player, evals, failures


def _tool_rewards(batch: CreditBatch, key: str) -> torch.Tensor:
    """R^tool per turn: the signal ``key`` averaged over the agent's turns in the episode that
    carry it, 0 when none does.  [N]"""
    present = batch.has_turn_reward(key)  # [N] bool
    if not bool(present.any()):
        return torch.zeros(batch.num_turns, dtype=torch.float64)
    K = max(len(batch.agent_names), 1)
    pair = batch.episode_ids * K + batch.agent_ids  # [N] (episode, agent)
    mean, _ = _segment_mean(batch.turn_rewards[key][present], pair[present], batch.num_episodes * K)  # [E*K], 0 where no turn carries it
    return mean[pair]  # [N]


@register_credit(
    "sharp", SharpConfig, plan=plan_sharp,
    card=MethodCard('counterfactual: Shapley values from coalition re-runs (SHARP)', 'agent per episode (plus a per-turn tool reward)', 'agent-wise normalisation of broadcast + marginal + tool reward'),
)
def sharp(batch: CreditBatch, cfg: SharpConfig, results: Results | None = None) -> Credit:
    """Â_{i,m} for R_{i,m} = R^b_i + λ_s·φ_{i,m} + λ_p·R^tool_{i,m} (module docstring).

    ``results`` must hold every key ``plan_sharp`` asked for (unless λ_s = 0); a missing
    key is a KeyError, an errored re-run has value 0.
    """
    unknown = sorted(set(cfg.exclude or ()) - set(batch.agent_names))
    if unknown:
        raise ValueError(f"sharp: exclude names unknown agents {unknown}; valid: {sorted(batch.agent_names)}")
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    ep_ids, E = batch.episode_ids, batch.num_episodes  # [N]

    phi, is_player, evals, failures = _marginals(batch, cfg, results)  # [E, K], [E, K]
    players = is_player.sum(dim=1)  # [E]
    marginal = phi[ep_ids, batch.agent_ids]  # [N] φ_{i,m} of the turn's agent
    broadcast = batch.episode_rewards.to(torch.float64)[ep_ids]  # [N] R^b_i
    tool = _tool_rewards(batch, cfg.tool_key)  # [N] R^tool_{i,m}
    reward = broadcast + cfg.lambda_s * marginal + cfg.lambda_p * tool  # [N] R_{i,m}

    ep_mean, ep_count = _segment_mean(reward, ep_ids, E)  # [E]
    ep_score = torch.where(ep_count > 0, ep_mean, batch.episode_rewards.to(torch.float64))  # [E] turn-less: R_i
    if cfg.normaliser == "agent" and cfg.agent_samples == "episode":
        norm = _normalise_per_episode_agent(batch, reward, cfg)
    else:
        nc = normalise_credit(batch, RawScores(turn=reward, episode=ep_score), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
        norm = (nc.values, nc.mean, nc.std, nc.count)
    values, mean, std, count = norm
    breakdown = {
        "marginal": marginal.to(dtype),  # [N]
        "broadcast": broadcast.to(dtype),  # [N]
        "tool": tool.to(dtype),  # [N]
        "turn_reward": reward.to(dtype),  # [N]
        "players": players,  # [E]
        "coalition_evals": torch.tensor(evals),  # scalar
        "coalition_failures": torch.tensor(failures),  # scalar
        "norm_mean": mean.to(dtype),  # [N]
        "norm_std": std.to(dtype),  # [N]
        "norm_count": count,  # [N]
    }
    return Credit(advantages=values.to(dtype), breakdown=breakdown)  # [N]


def _normalise_per_episode_agent(batch: CreditBatch, reward: torch.Tensor, cfg: SharpConfig) -> tuple[torch.Tensor, ...]:
    """Agent-wise statistics with one sample per (episode, agent) instead of per turn.  4 × [N]"""
    K = max(len(batch.agent_names), 1)
    pair = batch.episode_ids * K + batch.agent_ids  # [N]
    uniq, inverse = torch.unique(pair, return_inverse=True)  # [U], [N]
    value = torch.zeros(uniq.numel(), dtype=torch.float64).scatter_reduce_(0, inverse, reward, reduce="mean", include_self=False)  # [U]
    first = torch.full((uniq.numel(),), batch.num_turns, dtype=torch.long).scatter_reduce_(0, inverse, torch.arange(batch.num_turns), reduce="amin")  # [U]
    segment = agent_group_key(batch.group_ids[first], batch.agent_ids[first], num_agents=K)  # [U] (task group, agent)
    norm = normalise_segments(value, segment, scale_by_std=cfg.scale_by_std, eps=cfg.eps)  # [U]
    return norm.values[inverse], norm.mean[inverse], norm.std[inverse], norm.count[inverse]
