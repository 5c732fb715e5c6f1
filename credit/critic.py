"""LLM-as-critic credit: MAPPA per-action coach scores and LLM-MCA reward decomposition.

CREDIT_SPEC §7 (MAPPA, Li, Ren, Yan, arXiv 2601.23228; code ``ltjed/multiagent-coaching`` [C])
and §8 (LLM-MCA, Nagpal et al., AAMAS 2025, arXiv 2502.16863; no official code, third-party
reimplementation ``paul6598/AAMAS`` [S]).  The critic is any policy of the team config
(``critic: <policy name>``), usually a frozen one, possibly a remote OpenAI-compatible endpoint;
it is asked through the engine's ``CritiqueRequest`` (greedy by default, result ``[text]``; an
engine-level failure gives ``""``, which is counted as a parse failure).

mode ``mappa`` (default): one critique per action (flattened turn).  The coach sees the problem,
the agent's name, its full prompt, its output, its tool observations (truncated to 2,000
characters, or "N/A (no tools used)") and, for the *final* agent only, the ground-truth answer
(everyone else sees "N/A") [C].  The final agent is the agent of the episode's last turn
unless ``final_agent`` names one [A: MAPPA hard-codes its Verifier / Analyst].
    score s^{i,t} = clamp(float(m.group(1)), 0, 10),  m = re.search(r"PROCESS_SCORE:\\s*([\\d.]+)", reply, re.I)
    (regex only, never eval [C]).  A reply without a parsable score gets ONE retry critique
    with a format reminder (key suffix "/retry"), then the fallback score 5.0 [C].
    reward  r^{i,t} = s^{i,t} / 10 + outcome_weight · R^i                     (outcome_weight 0 [C])
    MAPPA's config has ``reward_outcome_weight`` but the released code never reads it: training
    is process-only [C]; ``outcome_weight`` > 0 is offered as an option.
    advantage: REINFORCE++ as MAPPA trains it [C]: with γ = 1 and the reward on the last token
    every token of an action has return r^{i,t}; the returns are whitened with ONE global,
    token-weighted mean/std over each agent's whole batch (all tasks pooled, no per-prompt
    grouping; each agent has its own trainer in MAPPA):
        μ_k = Σ L_n r_n / Σ L_n,   σ_k² = Σ L_n (r_n − μ_k)² / Σ L_n   (population, n ∈ turns of k)
        A_n = (r_n − μ_k) / (σ_k + eps)
    with L_n = ``batch.completion_lengths`` (normaliser ``agent_tokens``, the mappa default).
    Deviations [A]: OpenRLHF divides by max(σ, 1e-4) (``var.clamp(min=1e-8).rsqrt()``), here
    σ + eps as every other normaliser; the per-token KL penalty of REINFORCE++'s reward
    (init_kl_coef 0.01) is not part of the credit: it is the learner's KL term
    (``trainer.kl_coef``); a segment whose weighted turns all share one value (a singleton
    agent included, as in OpenRLHF where its variance is 0) gives exactly 0; a turn without
    completion tokens (a remote policy's) gets 0 and weighs nothing: it has nothing to train.
    A retry needs the first reply, so it is a second round of critiques: ``plan_retries``
    (below, registered as the method's ``followup``) plans it from the first round's results
    and the trainer runs it before assigning credit.

mode ``llm_mca``: one critique per episode with the task, the transcript (agent names,
messages, tool outputs) and the outcome R; the critic answers a JSON object
``{agent_name: [credit per message of that agent]}`` [A: LLM-MCA asks for one numpy array
per robot, §8.3].  Parsing uses ``json.loads`` only (``raw_decode`` at each "{" in turn, the
first object that decodes wins); the object must name exactly the agents that spoke, each
with exactly its number of messages, all numbers finite (bools, NaN and Infinity rejected).
Otherwise the episode falls back to R/T on each of its T turns [S].  With ``renormalise``
(default) a parsed decomposition is repaired so that Σ_k Σ_t c = R [A, §8.3 "optional
efficiency repair"]:
    rescale  c ← c·R/Σc                 when |Σc| >= cancel_tol · Σ|c|
    shift    c ← c + (R − Σc)/T         otherwise (credits that nearly cancel, or all zero)
The rescale alone explodes when the credits nearly cancel: [1, −0.999999] with R = 1 would
become [1e6, −999999], finite, so no check would catch it.  The guard bounds every rescaled
credit by |R|/cancel_tol (10·|R| for the default 0.1), and the shift keeps the critic's
differences between turns exactly while restoring efficiency; an all-zero decomposition
becomes R/T per turn, the same as a reply that did not parse.  The credits are
the raw per-turn scores; Dr. MAS agent-wise normalisation (per task group and agent, ddof 1;
``normaliser: agent``) turns them into advantages by default [A, §8.3].

Normalisers: ``normaliser`` is one of none / group / global / agent (``normalise.py``) or
``agent_tokens`` (above; the token-weighted whitening is ``normalise.weighted_whiten``,
shared with REINFORCE++, which uses OpenRLHF's max(σ², 1e-8) denominator).  The default depends on the mode and is
filled in when the config loads, so the resolved config shows it.

Prompts: ``prompt`` overrides the mode's default template (``critic_prompts.py`` lists the
placeholders of each mode); unknown placeholders are a config error listing the valid ones.

Keys: f"critic/{e}/{t}" (mappa, t = position of the turn in its episode), f"critic/{e}"
(llm_mca), plus the suffix "/retry"; e = running episode index over the batch, as in
``CreditBatch.episode_ids``.

Breakdown: ``critic_score`` [N] the parsed score (mappa: 0..10 after clamping / fallback;
llm_mca: the credit before renormalisation, R/T on fallback), ``turn_reward`` [N] the raw
score handed to the normaliser, ``fallback`` [N] bool, ``norm_mean``/``norm_std``/``norm_count``
[N], ``episode_score`` [E], and scalar tensors ``critic_calls`` (replies read, retries
included), ``parse_failures`` (replies that did not parse, retries included), ``retries`` and
``fallbacks`` (turns for mappa, episodes for llm_mca), and for llm_mca ``renormalise_shifts``
(episodes whose credits nearly cancelled and were repaired additively).  The critics' text rationales are not
kept: Credit has no place for text.

Shapes: N flattened turns, E episodes, K agents.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
from typing import Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from mas.types import Credit, CreditBatch, CritiqueRequest, Episode, EpisodeGroup, Results, Turn

from .base import CreditConfigBase
from .critic_prompts import LLM_MCA_PLACEHOLDERS, LLM_MCA_PROMPT, MAPPA_PLACEHOLDERS, MAPPA_PROMPT, MAPPA_RETRY_PROMPT
from .normalise import Normalised, RawScores, eps_field, normalise_credit, scale_by_std_field, weighted_whiten
from .registry import CREDIT_DTYPE, MethodCard, register_credit

CriticMode = Literal["mappa", "llm_mca"]
CriticNormaliser = Literal["agent_tokens", "none", "group", "group_batch_std", "global", "agent"]
DEFAULT_NORMALISER: dict[str, str] = {"mappa": "agent_tokens", "llm_mca": "agent"}
DEFAULT_PROMPT: dict[str, str] = {"mappa": MAPPA_PROMPT, "llm_mca": LLM_MCA_PROMPT}
PLACEHOLDERS: dict[str, tuple[str, ...]] = {"mappa": MAPPA_PLACEHOLDERS, "llm_mca": LLM_MCA_PLACEHOLDERS}
NO_TOOLS = "N/A (no tools used)"
NO_GROUND_TRUTH = "N/A"
# MAPPA's regex [C], with ASCII digits [A]: Python's \d also matches other scripts' digits, and
# float() reads them, so "PROCESS_SCORE: 7\u0663" would score 73 -> 10.  One quantifier, so linear time.
PROCESS_SCORE = re.compile(r"PROCESS_SCORE:\s*([0-9.]+)", re.IGNORECASE)
_SECTION = re.compile(r"^\[(system|user)\][ \t]*$", re.MULTILINE)
_MAX_JSON_STARTS = 64  # "{" positions tried by the JSON parser (bounds the work on garbage)


class CriticConfig(CreditConfigBase):
    """LLM-as-critic credit: MAPPA coach scores (arXiv 2601.23228) or LLM-MCA decomposition (arXiv 2502.16863)."""

    method: Literal["critic"] = Field("critic", description="Credit method tag.")
    critic: str = Field(
        min_length=1,
        description="Name of the policy (an entry of 'policies', frozen or not, local or a remote endpoint) that answers the critiques.",
    )
    mode: CriticMode = Field(
        "mappa",
        description="mappa: one 0-10 score per action (MAPPA); llm_mca: one JSON decomposition of the outcome per episode (LLM-MCA).",
    )
    normaliser: CriticNormaliser = Field(
        description="Statistics that turn the raw per-turn scores into advantages: 'agent_tokens' (one global token-weighted "
        "mean/std per agent over the whole batch, population std: MAPPA's REINFORCE++ whitening [C]), 'none', 'group', "
        "'global' or 'agent' (Dr. MAS, per task group and agent) as for every method. Default by mode, filled in when the "
        "config loads: agent_tokens for mappa, agent for llm_mca [A].",
    )
    scale_by_std: bool = scale_by_std_field("OpenRLHF's --no_advantage_std_norm is scale_by_std: false.")
    eps: float = eps_field("Also for agent_tokens, where OpenRLHF uses max(std, 1e-4) instead [A].")
    prompt: str | None = Field(
        None,
        description="Critic prompt template (str.format placeholders, literal braces doubled, optional '[system]' / '[user]' "
        "header lines). None: the mode's default (credit/critic_prompts.py). Unknown placeholders are an error.",
    )
    max_new_tokens: int = Field(512, ge=1, description="Reply length limit of each critique.")
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="Critic sampling temperature; 0 is greedy (MAPPA: 0.0 [C]).")
    final_agent: str | None = Field(
        None,
        description="mappa: the agent whose actions are shown the ground-truth answer (MAPPA: the Verifier/Analyst [C]). "
        "None: the agent of each episode's last turn [A].",
    )
    fallback_score: float = Field(5.0, ge=0.0, le=10.0, description="mappa: score of an action whose critiques did not parse (MAPPA: 5.0 [C]).")
    retry: bool = Field(True, description="mappa: after a reply without a score, ask once more with a format reminder (MAPPA [C]); a second round (plan_retries).")
    outcome_weight: float = Field(
        0.0,
        allow_inf_nan=False,
        description="mappa: reward = score/10 + outcome_weight * R. MAPPA's config has reward_outcome_weight 0.0 and its code "
        "never reads it: process-only [C].",
    )
    tool_observation_chars: int = Field(2000, ge=0, description="mappa: tool observations shown to the coach are cut to this many characters (MAPPA: 2,000 [C]).")
    renormalise: bool = Field(
        True,
        description="llm_mca: repair each parsed decomposition so the episode's credits sum to R [A]: rescale c <- c*R/sum(c), "
        "or, when the credits nearly cancel (see cancel_tol), shift c <- c + (R - sum(c))/T.",
    )
    cancel_tol: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="llm_mca: rescale only when |sum(c)| >= cancel_tol * sum(|c|), which bounds a rescaled credit by |R|/cancel_tol; "
        "otherwise the additive shift is used [A].",
    )

    @model_validator(mode="before")
    @classmethod
    def _mode_default_normaliser(cls, data: Any) -> Any:
        if isinstance(data, dict) and "normaliser" not in data:
            default = cls.model_fields["mode"].default
            mode = data["mode"] if "mode" in data else default
            mode = mode if isinstance(mode, str) and mode in DEFAULT_NORMALISER else default  # a bad mode is reported by its own field
            return {**data, "normaliser": DEFAULT_NORMALISER[mode]}
        return data

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, prompt: str | None, info: ValidationInfo) -> str | None:
        mode = info.data.get("mode")  # absent only when 'mode' itself failed (reported there)
        if prompt is not None and mode in PLACEHOLDERS:
            check_template(prompt, PLACEHOLDERS[mode], mode)
        return prompt

    @property
    def template(self) -> str:
        """The prompt template in use: ``prompt`` or the mode's default."""
        return self.prompt if self.prompt is not None else DEFAULT_PROMPT[self.mode]


# --- templates -----------------------------------------------------------------------------------


def check_template(template: str, valid: tuple[str, ...], mode: str = "") -> None:
    """Raise ValueError unless ``template`` is a well-formed template using only ``valid`` placeholders."""
    where = f" for mode {mode!r}" if mode else ""
    names_doc = ", ".join("{" + v + "}" for v in valid)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"prompt is not a valid template ({e}); write a literal brace as {{{{ or }}}}") from None
    unknown = sorted({f for f in fields if f not in valid})
    if unknown:
        shown = ", ".join("{" + u + "}" for u in unknown)
        raise ValueError(f"prompt uses unknown placeholder(s) {shown}; valid{where}: {names_doc}")
    sections = template_sections(template)
    if not any(role == "user" for role, _ in sections):
        raise ValueError("prompt has no user message: put text after a '[user]' line (or use no header lines at all)")
    try:
        fill_template(template, {v: "x" for v in valid})
    except (ValueError, KeyError, IndexError, AttributeError) as e:
        raise ValueError(f"prompt cannot be filled ({type(e).__name__}: {e}); valid placeholders{where}: {names_doc}") from None


@functools.lru_cache(maxsize=32)
def template_sections(template: str) -> tuple[tuple[str, str], ...]:
    """Split a template at '[system]' / '[user]' header lines into (role, text) chunks.

    Text before the first header is a user message; empty chunks are dropped.
    """
    out: list[tuple[str, str]] = []
    role, pos = "user", 0
    for m in _SECTION.finditer(template):
        out.append((role, template[pos : m.start()]))
        role, pos = m.group(1), m.end() + 1
    out.append((role, template[pos:]))
    return tuple((r, t.strip("\n")) for r, t in out if t.strip())


def fill_template(template: str, values: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The chat messages ((role, content), ...) of ``template`` filled with ``values``."""
    return tuple((role, text.format(**values)) for role, text in template_sections(template))


# --- what the critic is shown ----------------------------------------------------------------------


def render_messages(messages: list[dict[str, str]]) -> str:
    """A turn's prompt messages as text: one 'ROLE: content' block per message."""
    return "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages)


def tool_observation(turn: Turn, max_chars: int) -> str:
    """The turn's observations joined by newlines and cut to ``max_chars``, or 'N/A (no tools used)'."""
    if not turn.observations:
        return NO_TOOLS
    return "\n".join(turn.observations)[:max_chars]


def final_agent_of(episode: Episode, final_agent: str | None) -> str | None:
    """The agent whose actions see the ground truth: ``final_agent`` or the last turn's agent."""
    if final_agent is not None:
        return final_agent
    return episode.turns[-1].agent if episode.turns else None


def mappa_messages(episode: Episode, t: int, cfg: CriticConfig) -> tuple[tuple[str, str], ...]:
    """The coach prompt for action ``t`` (position in ``episode.turns``)."""
    turn = episode.turns[t]
    final = final_agent_of(episode, cfg.final_agent)
    values = {
        "problem": episode.task.prompt,
        "agent_role": turn.agent,
        "agent_input": render_messages(turn.messages),
        "agent_output": turn.text,
        "tool_observation": tool_observation(turn, cfg.tool_observation_chars),
        "ground_truth_answer": episode.task.answer if turn.agent == final else NO_GROUND_TRUTH,
    }
    return fill_template(cfg.template, values)


def agent_message_counts(agents: list[str]) -> dict[str, int]:
    """Messages per agent, in order of first appearance."""
    counts: dict[str, int] = {}
    for a in agents:
        counts[a] = counts.get(a, 0) + 1
    return counts


def render_transcript(episode: Episode, max_tool_chars: int) -> str:
    seen: dict[str, int] = {}
    blocks = []
    for t, turn in enumerate(episode.turns):
        seen[turn.agent] = seen.get(turn.agent, 0) + 1
        block = f"[{t}] {turn.agent} (message {seen[turn.agent]} of {turn.agent}):\n{turn.text}"
        if turn.observations:
            block += f"\ntool output: {tool_observation(turn, max_tool_chars)}"
        blocks.append(block)
    return "\n\n".join(blocks)


def llm_mca_messages(episode: Episode, cfg: CriticConfig) -> tuple[tuple[str, str], ...]:
    """The critic prompt for one episode."""
    counts = agent_message_counts([t.agent for t in episode.turns])
    values = {
        "problem": episode.task.prompt,
        "transcript": render_transcript(episode, cfg.tool_observation_chars),
        "outcome": f"{float(episode.reward):g}",
        "agents": "\n".join(f"- {a}: {n} message{'s' if n != 1 else ''}" for a, n in counts.items()),
        "json_example": json.dumps({a: [0.0] * n for a, n in counts.items()}),
        "num_turns": str(len(episode.turns)),
        "ground_truth_answer": episode.task.answer,
    }
    return fill_template(cfg.template, values)


# --- parsing: regex and json.loads only, never eval -----------------------------------------------


def parse_process_score(reply: Any) -> float | None:
    """MAPPA's PROCESS_SCORE in [0, 10] (clamped), or None when the reply has none."""
    if not isinstance(reply, str):
        return None
    m = PROCESS_SCORE.search(reply)
    if m is None:
        return None
    try:
        score = float(m.group(1))  # "1.2.3" or "." raise: a parse failure
    except ValueError:
        return None
    return min(max(score, 0.0), 10.0)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def first_json_object(reply: str) -> dict | None:
    """The first JSON object in ``reply``: ``raw_decode`` from each '{' in turn (json only)."""
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    start = reply.find("{")
    tries = 0
    while start != -1 and tries < _MAX_JSON_STARTS:
        tries += 1
        try:
            obj, _ = decoder.raw_decode(reply, start)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            return obj
        start = reply.find("{", start + 1)
    return None


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_credit_json(reply: Any, expected: dict[str, int]) -> dict[str, list[float]] | None:
    """``{agent: [credit per message]}`` with exactly the agents and message counts of ``expected``, or None."""
    if not isinstance(reply, str):
        return None
    obj = first_json_object(reply)
    if obj is None or set(obj) != set(expected):
        return None
    out: dict[str, list[float]] = {}
    for agent, n in expected.items():
        values = obj[agent]
        if not isinstance(values, list) or len(values) != n or not all(_is_number(v) for v in values):
            return None
        out[agent] = [float(v) for v in values]
    return out


# --- plan -------------------------------------------------------------------------------------------


def _episodes(groups: list[EpisodeGroup]) -> list[Episode]:
    return [ep for g in groups for ep in g.episodes]  # index = CreditBatch episode index e


def critique_request(key: str, messages: tuple[tuple[str, str], ...], cfg: CriticConfig) -> CritiqueRequest:
    return CritiqueRequest(key=key, policy=cfg.critic, messages=messages, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)


def plan_critic(groups: list[EpisodeGroup], cfg: CriticConfig) -> list[CritiqueRequest]:
    """One critique per turn (mappa) or per episode with turns (llm_mca)."""
    requests = []
    for e, ep in enumerate(_episodes(groups)):
        if cfg.mode == "mappa":
            requests += [critique_request(f"critic/{e}/{t}", mappa_messages(ep, t, cfg), cfg) for t in range(len(ep.turns))]
        elif ep.turns:
            requests.append(critique_request(f"critic/{e}", llm_mca_messages(ep, cfg), cfg))
    return requests


def plan_retries(groups: list[EpisodeGroup], cfg: CriticConfig, results: Results) -> list[CritiqueRequest]:
    """The second round (mappa with ``retry``): one format-reminder critique per first reply without a score.

    The retry continues the conversation: the original prompt, the critic's reply (if any) and
    the reminder.  Run it with the engine and merge its results into ``results`` before the
    credit function reads them.
    """
    if cfg.mode != "mappa" or not cfg.retry:
        return []
    requests = []
    for e, ep in enumerate(_episodes(groups)):
        for t in range(len(ep.turns)):
            key = f"critic/{e}/{t}"
            reply = reply_text(results, key)
            if parse_process_score(reply) is None:
                previous = (("assistant", reply),) if reply.strip() else ()
                messages = mappa_messages(ep, t, cfg) + previous + (("user", MAPPA_RETRY_PROMPT),)
                requests.append(critique_request(f"{key}/retry", messages, cfg))
    return requests


def reply_text(results: Results, key: str) -> str:
    """The critic's text for ``key``; a non-text result reads as '' (a parse failure)."""
    if key not in results:
        raise ValueError(f"critic credit: no result for planned critique {key!r}; run plan -> execute before the credit")
    value = results[key]
    return value[0] if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) else ""


# --- normaliser: token-weighted per-agent whitening (MAPPA / REINFORCE++) ---------------------------


def token_weighted_whiten(
    values: torch.Tensor,
    agent_ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_agents: int | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Normalised:
    """(x − μ_k) / (σ_k + eps) with a weighted mean and population std per agent k over all its values.

    ``weights`` (completion tokens) weigh each value.  A value of weight 0 (a turn without
    tokens: nothing to train) gets 0 and takes no part in the statistics; a segment whose
    weighted values are all equal gets exactly 0 (mean = that value, std 0), singletons
    included.  Statistics in float64 (``normalise.weighted_whiten``, shared with REINFORCE++).
    """
    if not (values.shape == agent_ids.shape == weights.shape) or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)}, agent_ids {tuple(agent_ids.shape)}, weights {tuple(weights.shape)} must be equal 1-d shapes")
    K = num_agents if num_agents is not None else (int(agent_ids.max()) + 1 if agent_ids.numel() else 0)
    w = weights.to(torch.float64).clamp(min=0.0)  # [N]
    white = weighted_whiten(values, w, agent_ids, scale_by_std=scale_by_std, eps=eps, num_segments=K, variance_floor=False)
    count = torch.bincount(agent_ids.to(torch.long), minlength=K)  # [K]
    dtype = CREDIT_DTYPE
    return Normalised(values=white.values.to(dtype), mean=white.mean.to(dtype), std=white.std.to(dtype),
                      count=count[agent_ids.to(torch.long)])


# --- the credit function -------------------------------------------------------------------------


def _mappa_scores(batch: CreditBatch, cfg: CriticConfig, results: Results) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """Per-turn coach score [N] (0..10, float64), fallback mask [N], the call counts and the replies [N]."""
    scores, fallback, replies = [], [], []
    calls = failures = retries = 0
    for e, t in zip(batch.episode_ids.tolist(), batch.turn_ids.tolist()):
        key = f"critic/{e}/{t}"
        calls += 1
        reply = reply_text(results, key)
        s = parse_process_score(reply)
        if s is None:
            failures += 1
            if cfg.retry and f"{key}/retry" in results:
                calls += 1
                retries += 1
                reply = reply_text(results, f"{key}/retry")
                s = parse_process_score(reply)
                failures += int(s is None)
        fallback.append(s is None)
        scores.append(cfg.fallback_score if s is None else s)
        replies.append(reply)
    counts = {"critic_calls": calls, "parse_failures": failures, "retries": retries, "fallbacks": sum(fallback)}
    return torch.tensor(scores, dtype=torch.float64), torch.tensor(fallback, dtype=torch.bool), counts, replies


def _llm_mca_credits(
    batch: CreditBatch, cfg: CriticConfig, results: Results
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, int], list[str]]:
    """Per-turn raw critic credit [N], renormalised credit [N] (float64), fallback mask [N], counts, replies [E]."""
    N, E = batch.num_turns, batch.num_episodes
    ep = batch.episode_ids  # [N]
    R = batch.episode_rewards.to(torch.float64)  # [E]
    n_turns = torch.bincount(ep, minlength=E)  # [E]
    starts = torch.cumsum(n_turns, 0) - n_turns  # [E] turns of an episode are contiguous (flatten order)
    names = [batch.agent_names[k] for k in batch.agent_ids.tolist()]  # [N]
    raw = [0.0] * N
    replies = [""] * E
    parsed_ok = torch.zeros(E, dtype=torch.bool)  # [E]
    calls = failures = 0
    for e in range(E):
        lo, T = int(starts[e]), int(n_turns[e])
        if T == 0:
            continue  # nothing to assign, no critique planned
        agents = names[lo : lo + T]
        calls += 1
        replies[e] = reply_text(results, f"critic/{e}")
        credits = parse_credit_json(replies[e], agent_message_counts(agents))
        if credits is None:
            failures += 1
            continue
        parsed_ok[e] = True
        nth: dict[str, int] = {}
        for i, a in enumerate(agents):
            raw[lo + i] = credits[a][nth.get(a, 0)]
            nth[a] = nth.get(a, 0) + 1
    raw_t = torch.tensor(raw, dtype=torch.float64)  # [N]
    sums = torch.zeros(E, dtype=torch.float64).index_add_(0, ep, raw_t)  # [E] Σ_k Σ_t c
    mass = torch.zeros(E, dtype=torch.float64).index_add_(0, ep, raw_t.abs())  # [E] Σ_k Σ_t |c|
    repair = parsed_ok & torch.tensor(cfg.renormalise)  # [E]
    rescale = repair & (sums.abs() >= cfg.cancel_tol * mass) & (mass > 0)  # [E] c·R/Σc is bounded by |R|/cancel_tol
    shift = repair & ~rescale  # [E] nearly cancelling (or all-zero) credits: additive repair
    scale = torch.where(rescale, R / torch.where(rescale, sums, torch.ones_like(sums)), torch.ones_like(sums))  # [E]
    offset = torch.where(shift, (R - sums) / n_turns.clamp(min=1).to(torch.float64), torch.zeros_like(sums))  # [E]
    credit = raw_t * scale[ep] + offset[ep]  # [N]
    bad = torch.zeros(E, dtype=torch.float64).index_add_(0, ep, (~torch.isfinite(credit)).to(torch.float64)) > 0  # [E] overflow
    failures += int((bad & parsed_ok).sum())
    fallback_e = ~parsed_ok | bad  # [E]
    equal_split = (R / n_turns.clamp(min=1).to(torch.float64))[ep]  # [N] R/T [S]
    fb = fallback_e[ep]  # [N]
    raw_t = torch.where(fb, equal_split, raw_t)  # [N]
    credit = torch.where(fb, equal_split, credit)  # [N]
    counts = {"critic_calls": calls, "parse_failures": failures, "retries": 0, "fallbacks": int((fallback_e & (n_turns > 0)).sum()),
              "renormalise_shifts": int((shift & ~fallback_e & (n_turns > 0)).sum())}
    return raw_t, credit, fb, counts, replies


def _episode_means(batch: CreditBatch, turn: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """Mean of each episode's turn values [E]; ``empty`` [E] for episodes without turns."""
    E = batch.num_episodes
    n = torch.bincount(batch.episode_ids, minlength=E)  # [E]
    total = torch.zeros(E, dtype=torch.float64).index_add_(0, batch.episode_ids, turn)  # [E]
    return torch.where(n > 0, total / n.clamp(min=1), empty)  # [E]


@register_credit(
    "critic", CriticConfig, plan=plan_critic, followup=plan_retries,
    card=MethodCard('LLM critic: per-action process scores (MAPPA) or per-message credit (LLM-MCA)', 'turn', 'per-agent whitening of the critic-derived rewards'),
)
def critic(batch: CreditBatch, cfg: CriticConfig, results: Results | None = None) -> Credit:
    """Per-turn advantages from an LLM critic's replies (see the module docstring for both modes).

    ``results`` must hold the replies of ``plan_critic`` (and, for mappa retries, of
    ``plan_retries``); a missing planned key is a ValueError.
    """
    if batch.num_turns == 0:  # nothing was planned, nothing to credit
        return Credit(advantages=torch.zeros(0))
    if results is None:
        raise ValueError("critic credit needs the critic's replies: results is None (the trainer runs plan -> execute -> credit)")
    dtype = CREDIT_DTYPE  # float64 throughout; run_credit casts once at the end
    R = batch.episode_rewards.to(torch.float64)  # [E]
    if cfg.mode == "mappa":
        score, fallback, counts, replies = _mappa_scores(batch, cfg, results)  # [N] 0..10
        reward = score / 10.0 + cfg.outcome_weight * R[batch.episode_ids]  # [N]
        episode = _episode_means(batch, reward, cfg.outcome_weight * R)  # [E]
    else:
        score, reward, fallback, counts, replies = _llm_mca_credits(batch, cfg, results)  # [N], replies [E]
        episode = _episode_means(batch, reward, R)  # [E]

    if cfg.normaliser == "agent_tokens":
        if batch.completion_lengths is None:
            raise ValueError("normaliser agent_tokens weighs turns by their completion tokens: batch.completion_lengths is None")
        norm = token_weighted_whiten(
            reward, batch.agent_ids, batch.completion_lengths, num_agents=max(len(batch.agent_names), 1), scale_by_std=cfg.scale_by_std, eps=cfg.eps
        )
        values, mean, std, count, episode_values = norm.values, norm.mean, norm.std, norm.count, None
    else:
        out = normalise_credit(batch, RawScores(turn=reward, episode=episode), cfg.normaliser, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
        values, mean, std, count, episode_values = out

    breakdown = {
        "critic_score": score.to(dtype),  # [N]
        "turn_reward": reward.to(dtype),  # [N] raw score handed to the normaliser
        "fallback": fallback,  # [N] bool
        "episode_score": episode.to(dtype),  # [E]
        "norm_mean": mean.to(dtype),  # [N]
        "norm_std": std.to(dtype),  # [N]
        "norm_count": count,  # [N]
        **{k: torch.tensor(v) for k, v in counts.items()},  # scalars
    }
    if episode_values is not None:
        breakdown["episode_advantage"] = episode_values.to(dtype)  # [E]
    return Credit(advantages=values.to(dtype), breakdown=breakdown, notes={"critic_reply": replies})  # [N]
