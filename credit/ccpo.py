"""CCPO: counterfactual credit with the upstream agent removed (Li et al. 2026, arXiv 2603.21563).

CREDIT_SPEC §6.  The paper's dyad is a thinker (upstream) and a solver (downstream); the
counterfactual re-runs the solver alone on the bare question.  Here "remove agent k" is
generalised to any topology with the engine's intervention call: for every episode e,
``solo_samples`` requests ``InterventionRequest(key=f"ccpo/{e}/{i}", source=ep,
agents=(upstream,), mode="remove", keep_others=False)``: the upstream agent leaves no
message and every other agent is sampled afresh.  ``upstream`` defaults to the agent of
each episode's first turn; ``downstream`` is every other agent.  R_joint is the episode's
reward, R_solo the counterfactual's.

Rewards are used in ±1 form, as the verifier gives them in the paper (R ∈ {−1, +1} [C]):
with ``reward_sign`` (default) R ↦ 2R − 1, which maps 0/1 rewards to −1/+1 (and [0, 1]
linearly onto [−1, 1]) [A]; without it the env's rewards are used as they are.

v2 (default; §6.3–6.4 [C, ``CCPO/examples/gspo_trainer/two_model/two_model_trainer.py``]):
    b          = mean of the task group's solo rewards   (``counterfactual_use_group_solo_baseline``)
    bonus      = 1[R_joint > 0 ∧ b < 0] − 1[R_joint < 0 ∧ b > 0]   (``event_bonus``; "margin": (R_joint − b)/2)
    r_upstream = R_joint + λ·bonus,   r_downstream = R_joint       (λ = ``lam`` = 0.2)
    advantage  = r − mean_role, per (task group, role), no std division (``norm_adv_by_std_in_grpo=False``)
v1 (§6.2 [C, ``CCPO-v1`` ``leave_one_out_rema.py`` / ``historical_normalizer.py``]):
    Δ = R_joint − R_solo (R_solo the mean of the episode's solo samples)
    r_upstream   = r₁ = tanh(α (Δ − μ_Δ)/(σ_Δ + ε))
    r_downstream = r₂ = g·z_J + (1 − g)·z_S,  z_J = (R_joint − μ_J)/(σ_J + ε), z_S = (R_solo − μ_S)/(σ_S + ε),
                   g = sigmoid(η μ_Δ/(σ_Δ + ε))
    with (μ, σ) from EMAs (decay 0.99) of the batch mean and variance of Δ, R_joint and R_solo;
    the first update copies the batch statistics; σ = √m₂ (1 if m₂ ≤ ε).  Each batch is shaped
    with the *previous* statistics, then the EMAs are updated.  Until the history holds
    ``min_samples`` samples (and at least one: there are no statistics before) the rewards
    pass through [C]; what passes through is an [A] choice (``v1_warmup``): "shapley" gives
    the code's no-normaliser fallback, the 2-player Shapley split φ₁ = ½(R_joint − R_solo),
    φ₂ = ½(R_joint + R_solo) (``shapley_two_player``); "raw" gives r₁ = Δ, r₂ = R_joint.
    What the authors' code passes through could not be checked here: the public repository
    (``bhai114/ccpo``) lists ``leave_one_out_rema.py`` and ``historical_normalizer.py`` in
    ``CCPO-v1/src/verl/verl/workers/reward_manager/__init__.py``, but neither file could be
    read (the searchable copy holds only the ``__init__``).  What could be read: the v1 run
    script ``CCPO-v1/scripts/rl/separated_rema/example_test500_qwen2_5_7b.sh`` sets
    ``historical_min_samples=10``, ``historical_buffer_size=1000``, ``ema_decay=0.99``,
    ``alpha=1.0``, ``eta=1.0`` (the defaults here), and the separated trainer always applies
    GRPO per prompt group on top of the historically normalised rewards ("DOUBLE
    normalization"), as here.  The pass-through form therefore stays the documented [A]
    default until the normaliser's code can be read.
    A sample is an episode with turns.  The batch variance is the population variance [A].
    Then GRPO (with std, the code's "double normalisation") per (task group, role).

The per-role GRPO step: segments are (task group, role) over *turns* (verl rows; with one
upstream and one downstream turn per episode, as in the paper, that is per episode), with
the statistics of ``normalise.py`` (ddof 1, ε = 1e-6, a singleton or a constant
segment gives exactly 0).  ``grpo_scale_by_std`` None picks the version's recipe:
False for v2 [C], True for v1 [C].  A pipeline ``normaliser`` (default none) is applied to
the result.

State (v1): the EMA history must persist across training steps, so the method is not a
pure function of its inputs there.  It lives in a ``HistoryNormaliser`` held by this module,
one per config (keyed by the config's JSON).  ``state_dict()`` / ``load_state_dict()`` save
and restore all of them (a checkpoint must do so for an exact resume), ``reset_state()``
forgets them (a fresh run should start from it).  Every call of the v1 credit function
updates the history once.  v2 is stateless.

Other [A] choices and deviations:
  * Episodes without turns get no counterfactual.  A counterfactual episode that failed
    (``status == "error"``) is left out [A] and counted as ``counterfactual_failures``.
    v2: b averages the usable solo rewards of the task group, b = 0 if there are none (then
    no bonus fires).  v1: an episode without a usable solo sample takes the group's mean
    solo reward, or R_solo = R_joint (Δ = 0) if the group has none [A].
  * The alternating schedule (thinker and solver trained in turns every 10 steps [C]) is
    the trainer's ``trainer.alternate`` / ``trainer.switch_every``, not part of the credit.
  * The paper uses two separate models; any policy assignment works here.
  * Voting topology (v1 paper): no code found; not implemented beyond "remove agent k".

Breakdown: ``r_joint`` [E], ``r_solo`` [E] (signed, per-episode mean of the usable solo
samples; where there are none, R_joint for v2 and the fallback above for v1), ``has_solo`` [E] bool, ``r_upstream`` /
``r_downstream`` [E], ``turn_reward`` [N] (the reward each turn was given), ``upstream`` [N]
bool, ``counterfactuals`` / ``counterfactual_failures`` (scalars); v2 adds ``solo_baseline``
[E] (b of the episode's group) and ``bonus`` [E]; v1 adds ``delta`` [E], ``gate`` (scalar g; 0.5 in warm-up),
``warmup`` (scalar, 1 while passing through) and ``history_count`` (scalar, before the update).

Shapes: B task groups, E episodes, N flattened turns, M usable counterfactual episodes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field

from mas.types import Credit, CreditBatch, EpisodeGroup, InterventionRequest, Request, Results

from .base import CreditConfigBase
from .normalise import NormaliserName, RawScores, normalise_credit, normalise_segments, normaliser_field, scale_by_std_field, segment_moments
from .registry import CREDIT_DTYPE, MethodCard, register_credit, run_rewards


class CCPOConfig(CreditConfigBase):
    """CCPO (arXiv 2603.21563): remove-the-upstream-agent counterfactual; v2 bonus or v1 history normaliser."""

    method: Literal["ccpo"] = Field("ccpo", description="Credit method tag.")
    version: Literal["v2", "v1"] = Field("v2", description="v2: solo-baseline event bonus + centred GRPO [C]; v1: EMA history normaliser [C].")
    upstream: str | None = Field(
        None,
        description="Agent removed in the counterfactual (the paper's thinker). None: the agent of each episode's first "
        "turn [A]. Every other agent is downstream (the solver).",
    )
    solo_samples: int = Field(
        1, ge=1, description="Counterfactual (agent-removed) runs per episode; the paper uses one solo run per joint rollout [C]."
    )
    reward_sign: bool = Field(
        True,
        description="Map rewards to ±1 form with R -> 2R - 1 (0/1 -> -1/+1), as the paper's verifier scores [C]; the map is "
        "an assumption [A]. False uses the env's rewards as they are.",
    )
    lam: float = Field(0.2, allow_inf_nan=False, description="v2: weight λ of the thinker bonus (COUNTERFACTUAL_LAMBDA = 0.2) [C].")
    bonus: Literal["event", "margin"] = Field(
        "event",
        description="v2 bonus: event = +1 if R_joint > 0 and b < 0, -1 if R_joint < 0 and b > 0, else 0 (event_bonus=True) [C]; "
        "margin = (R_joint - b) / 2 [C].",
    )
    grpo_scale_by_std: bool | None = Field(
        None,
        description="Divide by the std in the per-(task group, role) GRPO step. None: the version's recipe (v2 False: centring "
        "only [C]; v1 True [C]).",
    )
    ema_decay: float = Field(0.99, gt=0.0, le=1.0, description="v1: decay of the EMA history statistics [C].")
    min_samples: int = Field(
        10, ge=0, description="v1: episodes the history must hold (at least one) before it shapes rewards; pass-through before [C]."
    )
    alpha: float = Field(1.0, allow_inf_nan=False, description="v1: α in r1 = tanh(α (Δ - μ_Δ)/(σ_Δ + ε)) [C].")
    eta: float = Field(1.0, allow_inf_nan=False, description="v1: η in the gate g = sigmoid(η μ_Δ/(σ_Δ + ε)) [C].")
    v1_warmup: Literal["shapley", "raw"] = Field(
        "shapley",
        description="v1 pass-through during warm-up [A]: shapley = r1 = (R_joint - R_solo)/2, r2 = (R_joint + R_solo)/2 (the code's "
        "no-normaliser fallback); raw = r1 = Δ, r2 = R_joint.",
    )
    normaliser: NormaliserName = normaliser_field("none", "CCPO default: none (the per-role GRPO step is part of the method).")
    scale_by_std: bool = scale_by_std_field("Only for the pipeline normaliser.")
    eps: float = Field(
        1e-6, gt=0.0, allow_inf_nan=False, description="ε of the v1 history normaliser, the per-role GRPO step and the pipeline normaliser (1e-6) [C]; must be > 0."
    )


# --- v1 history normaliser (state that persists across steps) ---------------------------------


@dataclass
class EMAStat:
    """EMA of a batch mean and a batch (population) variance; the first update copies."""

    mean: float = 0.0
    m2: float = 0.0
    initialised: bool = False

    def update(self, batch_mean: float, batch_var: float, decay: float) -> None:
        if not self.initialised:
            self.mean, self.m2, self.initialised = batch_mean, batch_var, True
        else:
            self.mean = decay * self.mean + (1.0 - decay) * batch_mean
            self.m2 = decay * self.m2 + (1.0 - decay) * batch_var

    def std(self, eps: float) -> float:
        return math.sqrt(self.m2) if self.m2 > eps else 1.0


@dataclass
class HistoryNormaliser:
    """CCPO v1's global-history statistics of Δ, R_joint and R_solo, and the samples seen."""

    delta: EMAStat = field(default_factory=EMAStat)
    joint: EMAStat = field(default_factory=EMAStat)
    solo: EMAStat = field(default_factory=EMAStat)
    count: int = 0

    def update(self, delta: torch.Tensor, joint: torch.Tensor, solo: torch.Tensor, decay: float) -> None:
        """Fold one batch ([M] each) into the EMAs."""
        if delta.numel() == 0:
            return
        for stat, x in ((self.delta, delta), (self.joint, joint), (self.solo, solo)):
            mean, std, _ = segment_moments(x, torch.zeros(x.numel(), dtype=torch.long, device=x.device), 1)  # population, overflow-safe
            stat.update(float(mean[0]), float(std[0]) ** 2, decay)
        self.count += int(delta.numel())

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> "HistoryNormaliser":
        return cls(delta=EMAStat(**d["delta"]), joint=EMAStat(**d["joint"]), solo=EMAStat(**d["solo"]), count=int(d["count"]))


_HISTORY: dict[str, HistoryNormaliser] = {}


def _history_key(cfg: CCPOConfig) -> str:
    return cfg.model_dump_json()


def history(cfg: CCPOConfig) -> HistoryNormaliser:
    """The v1 history of ``cfg`` (created empty on first use)."""
    return _HISTORY.setdefault(_history_key(cfg), HistoryNormaliser())


def state_dict() -> dict[str, Any]:
    """All v1 histories, keyed by config JSON; JSON-serialisable (for a checkpoint)."""
    return {k: h.state_dict() for k, h in _HISTORY.items()}


def load_state_dict(state: dict[str, Any]) -> None:
    """Replace all v1 histories with those of ``state_dict()`` (on resume)."""
    _HISTORY.clear()
    _HISTORY.update({k: HistoryNormaliser.from_state_dict(v) for k, v in state.items()})


def reset_state() -> None:
    """Forget every v1 history (a fresh run starts from none)."""
    _HISTORY.clear()


# --- helpers -------------------------------------------------------------------------------------


def shapley_two_player(r_joint: torch.Tensor, r_solo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """2-player Shapley split with v(∅) = v({thinker}) = 0, v({solver}) = R_solo, v(both) = R_joint.

    φ₁ (thinker) = ½(R_joint − R_solo), φ₂ (solver) = ½R_joint + ½R_solo; φ₁ + φ₂ = R_joint.
    CCPO-v1's fallback without the history normaliser [C, code docstring].
    """
    return 0.5 * (r_joint - r_solo), 0.5 * r_joint + 0.5 * r_solo


def event_bonus(r_joint: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """+1 where R_joint > 0 and b < 0, −1 where R_joint < 0 and b > 0, else 0 (CCPO v2 [C])."""
    return (r_joint > 0).to(torch.float64) * (baseline < 0).to(torch.float64) - (r_joint < 0).to(torch.float64) * (baseline > 0).to(torch.float64)


def solo_key(episode: int, sample: int) -> str:
    """Canonical request key of the ``sample``-th counterfactual of episode ``episode``."""
    return f"ccpo/{episode}/{sample}"


def plan_ccpo(groups: list[EpisodeGroup], cfg: CCPOConfig) -> list[Request]:
    """``solo_samples`` remove-the-upstream-agent interventions per episode with turns."""
    requests: list[Request] = []
    e = 0
    for group in groups:
        for ep in group.episodes:
            if ep.turns:
                up = cfg.upstream or ep.turns[0].agent
                for i in range(cfg.solo_samples):
                    requests.append(InterventionRequest(key=solo_key(e, i), source=ep, agents=(up,), mode="remove", keep_others=False))
            e += 1
    return requests


def _signed(x: torch.Tensor, on: bool) -> torch.Tensor:
    return 2.0 * x - 1.0 if on else x


def _collect_solo(batch: CreditBatch, cfg: CCPOConfig, results: Results | None) -> tuple[list[int], list[float], int]:
    """(episode, reward) of every usable counterfactual episode, and the number that failed."""
    has_turns = torch.bincount(batch.episode_ids, minlength=batch.num_episodes) > 0  # [E]
    sol_e: list[int] = []
    sol_r: list[float] = []
    failures = 0
    for e in torch.nonzero(has_turns).flatten().tolist():
        for i in range(cfg.solo_samples):
            rewards, failed = run_rewards(results, solo_key(e, i), "ccpo", "counterfactual")
            failures += failed
            sol_e += [e] * len(rewards)
            sol_r += rewards
    return sol_e, sol_r, failures


def _upstream_turns(batch: CreditBatch, cfg: CCPOConfig) -> torch.Tensor:
    """[N] bool: the turn is by its episode's upstream agent."""
    if cfg.upstream is not None:
        if cfg.upstream not in batch.agent_names:
            raise ValueError(f"ccpo: upstream agent {cfg.upstream!r} is not one of {batch.agent_names}")
        return batch.agent_ids == batch.agent_names.index(cfg.upstream)  # [N]
    first = batch.turn_ids == 0  # [N]
    up_agent = torch.full((batch.num_episodes,), -1, dtype=torch.long, device=batch.agent_ids.device)  # [E]
    up_agent[batch.episode_ids[first]] = batch.agent_ids[first]
    return batch.agent_ids == up_agent[batch.episode_ids]  # [N]


def _segment_mean(values: torch.Tensor, ids: torch.Tensor, num: int) -> tuple[torch.Tensor, torch.Tensor]:
    total = torch.zeros(num, dtype=torch.float64, device=values.device).index_add_(0, ids, values)
    count = torch.zeros(num, dtype=torch.float64, device=values.device).index_add_(0, ids, torch.ones_like(values))
    return total, count


class _State:
    """The module's v1 histories as the registry's state hook (saved in checkpoints)."""

    state_dict = staticmethod(state_dict)
    load_state_dict = staticmethod(load_state_dict)
    reset = staticmethod(reset_state)


@register_credit(
    "ccpo", CCPOConfig, plan=plan_ccpo, state=_State,
    card=MethodCard('counterfactual: solo re-runs without the upstream agent (CCPO)', 'agent role: upstream vs downstream turns', 'the solo counterfactual reward; then GRPO per (task, role)'),
)
def ccpo(batch: CreditBatch, cfg: CCPOConfig, results: Results | None = None) -> Credit:
    """Upstream turns get r_upstream, downstream turns r_downstream; then GRPO per (task group, role).

    See the module docstring for v1/v2, the [A] choices and the state v1 keeps.
    """
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    dev = batch.episode_ids.device
    E = batch.num_episodes
    B = int(batch.episode_group_ids.max()) + 1 if E else 0
    sol_e, sol_r, failures = _collect_solo(batch, cfg, results)
    se = torch.tensor(sol_e, dtype=torch.long, device=dev)  # [M]
    sr = _signed(torch.tensor(sol_r, dtype=torch.float64, device=dev), cfg.reward_sign)  # [M]
    rj = _signed(batch.episode_rewards.to(torch.float64), cfg.reward_sign)  # [E]
    grp = batch.episode_group_ids.to(torch.long)  # [E]

    ep_sum, ep_cnt = _segment_mean(sr, se, E)  # [E] each
    has_solo = ep_cnt > 0  # [E]
    g_sum, g_cnt = _segment_mean(sr, grp[se], B)  # [B] each, over every usable solo sample of the group
    group_solo = torch.where(g_cnt > 0, g_sum / g_cnt.clamp(min=1), torch.zeros_like(g_sum))  # [B] (0 if none)
    breakdown: dict[str, torch.Tensor] = {}

    if cfg.version == "v2":
        b = group_solo[grp]  # [E]
        bonus = event_bonus(rj, b) if cfg.bonus == "event" else 0.5 * (rj - b)  # [E]
        r_up, r_down = rj + cfg.lam * bonus, rj  # [E] each
        rs = torch.where(has_solo, ep_sum / ep_cnt.clamp(min=1), rj)  # [E] for the report
        breakdown.update(solo_baseline=b.to(dtype), bonus=bonus.to(dtype))
        scale = False if cfg.grpo_scale_by_std is None else cfg.grpo_scale_by_std
    else:
        fallback = torch.where(g_cnt[grp] > 0, group_solo[grp], rj)  # [E] no usable solo sample of its own [A]
        rs = torch.where(has_solo, ep_sum / ep_cnt.clamp(min=1), fallback)  # [E]
        delta = rj - rs  # [E]
        hist = history(cfg)
        sampled = torch.bincount(batch.episode_ids, minlength=E) > 0  # [E] episodes that were planned
        breakdown["history_count"] = torch.tensor(float(hist.count), dtype=dtype)
        if hist.count < max(cfg.min_samples, 1):  # pass-through warm-up (also while the history is empty)
            r_up, r_down = shapley_two_player(rj, rs) if cfg.v1_warmup == "shapley" else (delta, rj)
            gate = torch.tensor(0.5, dtype=torch.float64)
            warm = 1.0
        else:
            sd_d, sd_j, sd_s = hist.delta.std(cfg.eps), hist.joint.std(cfg.eps), hist.solo.std(cfg.eps)
            # tanh saturates to exactly ±1.0 in floating point for large arguments; keep |r1| < 1 (§6.7)
            r_up = torch.tanh(cfg.alpha * (delta - hist.delta.mean) / (sd_d + cfg.eps)).clamp(-1 + 1e-12, 1 - 1e-12)  # [E]
            z_j = (rj - hist.joint.mean) / (sd_j + cfg.eps)  # [E]
            z_s = (rs - hist.solo.mean) / (sd_s + cfg.eps)  # [E]
            gate = torch.sigmoid(torch.tensor(cfg.eta * hist.delta.mean / (sd_d + cfg.eps), dtype=torch.float64))  # scalar g
            r_down = gate * z_j + (1.0 - gate) * z_s  # [E] r2
            warm = 0.0
        hist.update(delta[sampled], rj[sampled], rs[sampled], cfg.ema_decay)  # shape first, then update
        breakdown.update(delta=delta.to(dtype), gate=gate.to(dtype), warmup=torch.tensor(warm, dtype=dtype))
        scale = True if cfg.grpo_scale_by_std is None else cfg.grpo_scale_by_std

    # per-turn reward by role, then GRPO per (task group, role) over turns
    ep = batch.episode_ids  # [N]
    is_up = _upstream_turns(batch, cfg)  # [N]
    turn_reward = torch.where(is_up, r_up[ep], r_down[ep])  # [N]
    segment = batch.group_ids.to(torch.long) * 2 + (~is_up).to(torch.long)  # [N] (task group, role)
    adv = normalise_segments(turn_reward, segment, num_segments=2 * B, scale_by_std=scale, eps=cfg.eps).values  # [N]

    n_turns = torch.bincount(ep, minlength=E)  # [E]
    ep_score = torch.zeros(E, dtype=torch.float64, device=dev).index_add_(0, ep, adv) / n_turns.clamp(min=1)  # [E]
    norm = normalise_credit(batch, RawScores(turn=adv, episode=ep_score), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    breakdown.update(
        r_joint=rj.to(dtype),  # [E]
        r_solo=rs.to(dtype),  # [E]
        has_solo=has_solo,  # [E]
        r_upstream=r_up.to(dtype),  # [E]
        r_downstream=r_down.to(dtype),  # [E]
        turn_reward=turn_reward.to(dtype),  # [N]
        upstream=is_up,  # [N]
        counterfactuals=torch.tensor(float(sr.numel()), dtype=dtype),
        counterfactual_failures=torch.tensor(float(failures), dtype=dtype),
    )
    return Credit(advantages=norm.values.to(dtype), breakdown=breakdown)  # [N]
