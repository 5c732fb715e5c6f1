"""Verified credit: each turn's reward mixes what a turn verifier checked with the team's outcome.

Most turns of a multi-agent episode can be checked on their own (``envs/verifiers.py``): a
specialist's sum, a relay part, an orchestrator's next step.  An outcome-only method cannot
tell from R who erred (in an AND of N parts, one agent's reward is its own correctness times
the other N−1 agents' luck); a verifier can.  This method uses it, as the turn-level reward
designs do: verifiable turns rewarded by exact verification, the rest by the outcome or a
judge (Wei et al., NeurIPS 2025, "turn-level reward design"; MAPPA, arXiv 2601.23228, for the
per-action judge; SWEET-RL, arXiv 2503.15478, and CriticSearch for judges with privileged
information such as the gold answer).

Per turn n (agent k, episode i, task group b), with v_n the verifier's score
(``batch.turn_rewards["verified"]``, present where the verifier gave one):

    R^{i,n} = R_i − invalid_penalty · invalid_n          (Dr. MAS's per-row reward)
    r_n     = w · v_n + (1 − w) · R^{i,n}                 where the verifier scored n
    r_n     = w · c_n + (1 − w) · R^{i,n}                 else, with ``critic`` set and its score parsed
    r_n     = R^{i,n}                                     else (and for agents outside ``agents``, when given)
    A_n     = (r_n − μ_{b,k}) / (σ_{b,k} + ε)             normaliser ``agent`` (Dr. MAS, Eq. 5)

with c_n = s_n / 10 the MAPPA coach's 0..10 score of the turn (the hybrid design: a turn the
verifier cannot check is judged by the critic, ``credit/critic.py``).  μ, σ (ddof 1), ε and the
zero-spread rule are dr_mas's (``normalise.py``): a (task, agent) segment whose values are all
equal, a single value included, gives 0.  The episode score for the ``group`` normaliser is
s_i = mean_n r_n (R_i for an episode without turns).

Properties (tests/credit/test_credit_verified.py):
  * w = 0 is ``dr_mas`` exactly (same invalid_penalty, normaliser, eps, scale_by_std), bit for
    bit: r_n is computed as R^{i,n} + w · (v_n − R^{i,n}), which is R^{i,n} when w = 0.
  * A turn without a score gets the outcome alone: a verifier rewards only what it checks.
  * With w < 1 the outcome stays in every turn's reward: the team's goal is never dropped
    unless the user asks for w = 1 [A].
  * Another agent's verifier scores never change a turn's credit under ``agent`` (segments
    are per agent), nor do another task group's.
Deviations and choices [A]: the mix is linear as in the turn-level reward design; w defaults
to 0.5 (docs/credit.md says why); an unparsed critique leaves the turn with the outcome alone
(MAPPA gives it 5/10, which here would reward a critic's failure to answer).

Breakdown: ``turn_reward`` r [N], ``outcome_reward`` R^{i,n} [N], ``verifier_score`` v [N] (0
where absent), ``verified`` [N] bool, ``critic_score`` [N] (the coach's 0..10, NaN where not
asked or not parsed), ``process_score`` [N] bool (v or c was used), ``episode_score`` [E],
``norm_mean``/``norm_std``/``norm_count`` [N], and scalars ``verified_share`` (turns the
verifier scored), ``critic_calls``, ``critic_parse_failures``.

Shapes: N flattened turns, E episodes, K agents.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from mas.envs.verifiers import VERIFIED
from mas.types import Credit, CreditBatch, EpisodeGroup, Results

from .base import CreditConfigBase
from .baselines import episode_scores, turn_rewards_with_penalty
from .critic import CriticConfig, critique_request, mappa_messages, parse_process_score, reply_text
from .critic_prompts import MAPPA_RETRY_PROMPT
from .normalise import NormaliserName, RawScores, eps_field, normalise_credit, normaliser_field, scale_by_std_field
from .registry import CREDIT_DTYPE, MethodCard, register_credit


class VerifiedConfig(CreditConfigBase):
    """Turn verifiers' scores mixed with the outcome, Dr. MAS normalisation (module docstring)."""

    method: Literal["verified"] = Field("verified", description="Credit method tag.")
    weight: float = Field(
        0.5, ge=0.0, le=1.0, allow_inf_nan=False,
        description="w: a scored turn's reward is w * score + (1 - w) * outcome. 0 is dr_mas exactly; 1 drops the team "
        "outcome from scored turns. Default 0.5: the verifier and the team's goal weigh the same (docs/credit.md) [A].",
    )
    key: str = Field(VERIFIED, min_length=1, description="Per-turn signal (Turn.extra_rewards key) read as the verifier's score.")
    agents: tuple[str, ...] = Field(
        (),
        description="Use the verifier's scores of these agents' turns only; the others keep the outcome (dr_mas's credit). "
        "() = every agent. E.g. the specialists of an orchestrator team, whose sums the outcome cannot attribute, "
        "while the orchestrator keeps the outcome that rewards its decision to delegate.",
    )
    normaliser: NormaliserName = normaliser_field("agent", "Default: agent (Dr. MAS).")
    scale_by_std: bool = scale_by_std_field()
    eps: float = eps_field()
    invalid_penalty: float = Field(
        0.1, allow_inf_nan=False,
        description="Subtracted from the outcome part of each turn whose output did not parse, as dr_mas does (0.1).",
    )
    critic: str | None = Field(
        None,
        description="Hybrid: a policy (frozen or remote, usually) that scores, MAPPA-style (0..10), each turn the verifier "
        "cannot check; its score / 10 takes the verifier's place. None: such turns get the outcome alone.",
    )
    critic_max_new_tokens: int = Field(512, ge=1, description="critic: reply length limit of each critique.")

    def critic_config(self) -> CriticConfig:
        """The MAPPA critique settings the hybrid asks with (``credit/critic.py``'s defaults)."""
        return CriticConfig(critic=self.critic, mode="mappa", max_new_tokens=self.critic_max_new_tokens)


def _unverified(groups: list[EpisodeGroup], cfg: "VerifiedConfig"):
    """(episode index e, turn position t, episode) of every turn without a verifier score that counts."""
    e = 0
    for g in groups:
        for ep in g.episodes:
            for t, turn in enumerate(ep.turns):
                if cfg.key not in turn.extra_rewards or (cfg.agents and turn.agent not in cfg.agents):
                    yield e, t, ep
            e += 1


def plan_verified(groups: list[EpisodeGroup], cfg: VerifiedConfig) -> list:
    """Hybrid only: one MAPPA critique of each turn the verifier did not score."""
    if cfg.critic is None:
        return []
    critic = cfg.critic_config()
    return [critique_request(f"critic/{e}/{t}", mappa_messages(ep, t, critic), critic) for e, t, ep in _unverified(groups, cfg)]


def plan_verified_retries(groups: list[EpisodeGroup], cfg: VerifiedConfig, results: Results) -> list:
    """Hybrid only: one format-reminder critique per first reply without a score (as ``critic`` does)."""
    if cfg.critic is None:
        return []
    critic = cfg.critic_config()
    out = []
    for e, t, ep in _unverified(groups, cfg):
        key = f"critic/{e}/{t}"
        reply = reply_text(results, key)
        if parse_process_score(reply) is None:
            previous = (("assistant", reply),) if reply.strip() else ()
            out.append(critique_request(f"{key}/retry", mappa_messages(ep, t, critic) + previous + (("user", MAPPA_RETRY_PROMPT),), critic))
    return out


def _critic_scores(batch: CreditBatch, present: torch.Tensor, results: Results | None) -> tuple[torch.Tensor, int, int]:
    """The coach's 0..10 score of each unverified turn [N] (NaN where none), calls read, parse failures."""
    scores = torch.full((batch.num_turns,), float("nan"), dtype=CREDIT_DTYPE)  # [N]
    calls = failures = 0
    for n, (e, t) in enumerate(zip(batch.episode_ids.tolist(), batch.turn_ids.tolist())):
        if bool(present[n]):
            continue
        key = f"critic/{e}/{t}"
        if results is None or key not in results:
            raise ValueError(f"verified credit: no result for planned critique {key!r}; run plan -> execute before the credit")
        calls += 1
        s = parse_process_score(reply_text(results, key))
        if s is None and f"{key}/retry" in results:
            failures += 1
            calls += 1
            s = parse_process_score(reply_text(results, f"{key}/retry"))
        if s is None:
            failures += 1
        else:
            scores[n] = s
    return scores, calls, failures


@register_credit(
    "verified", VerifiedConfig, plan=plan_verified, followup=plan_verified_retries,
    card=MethodCard("process reward: turn verifiers' scores mixed with the outcome (turn-level reward design)",
                    "turn: each turn's own verifier score, agent-wise normalisation",
                    "mean and std of the agent's own turns in the task group (Dr. MAS)"),
)
def verified(batch: CreditBatch, cfg: VerifiedConfig, results: Results | None = None) -> Credit:
    """A_n = normalise(R^{i,n} + w · (p_n − R^{i,n})) with p_n the verifier's (or the critic's) score
    where there is one; see the module docstring for the formula, its sources and properties."""
    dtype = CREDIT_DTYPE
    w = cfg.weight
    outcome = turn_rewards_with_penalty(batch, cfg.invalid_penalty)  # [N] R^{i,n}
    present = batch.has_turn_reward(cfg.key)  # [N] bool
    if cfg.agents:  # only the named agents' scores count
        chosen = torch.tensor([a in cfg.agents for a in batch.agent_names], dtype=torch.bool)  # [K]
        present = present & chosen[batch.agent_ids]  # [N]
    zeros = torch.zeros(batch.num_turns, dtype=dtype)
    score = batch.turn_rewards[cfg.key].to(dtype) if cfg.key in batch.turn_rewards else zeros  # [N] v, 0 where absent
    score = torch.where(present, score, zeros)  # [N]
    process, used = score, present  # [N], [N] bool
    critic_scores = torch.full((batch.num_turns,), float("nan"), dtype=dtype)  # [N]
    calls = failures = 0
    if cfg.critic is not None:
        critic_scores, calls, failures = _critic_scores(batch, present, results)
        judged = ~present & ~torch.isnan(critic_scores)  # [N]
        process = torch.where(judged, critic_scores / 10.0, score)  # [N]
        used = present | judged  # [N]
    delta = torch.where(used, process - outcome, zeros)  # [N] p_n − R^{i,n} where a process score exists
    reward = outcome + w * delta  # [N] r_n; exactly R^{i,n} for w = 0
    E = batch.num_episodes
    n_turns = torch.bincount(batch.episode_ids, minlength=E).clamp(min=1).to(dtype)  # [E]
    shift = torch.zeros(E, dtype=dtype).index_add_(0, batch.episode_ids, delta) / n_turns  # [E] mean_n (p_n − R) · used
    episode = episode_scores(batch, cfg.invalid_penalty) + w * shift  # [E] s_i = mean_n r_n (R_i without turns)
    norm = normalise_credit(batch, RawScores(turn=reward, episode=episode), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    breakdown = {
        "turn_reward": reward,  # [N] r_n
        "outcome_reward": outcome,  # [N] R^{i,n}
        "verifier_score": score,  # [N] v_n, 0 where absent
        "verified": present,  # [N] bool
        "critic_score": critic_scores,  # [N] 0..10, NaN where not asked or not parsed
        "process_score": used,  # [N] bool
        "episode_score": episode,  # [E]
        "norm_mean": norm.mean.to(dtype),  # [N]
        "norm_std": norm.std.to(dtype),  # [N]
        "norm_count": norm.count,  # [N]
        "verified_share": torch.tensor(float(present.double().mean()) if batch.num_turns else 0.0, dtype=dtype),
        "critic_calls": torch.tensor(float(calls), dtype=dtype),
        "critic_parse_failures": torch.tensor(float(failures), dtype=dtype),
    }
    if norm.episode_values is not None:
        breakdown["episode_advantage"] = norm.episode_values.to(dtype)  # [E]
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)
