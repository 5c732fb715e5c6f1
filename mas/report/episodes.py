"""The episode browser: stored sample episodes with every turn coloured by its credit.

Each episode shows a heatmap (agents × turns, one cell per turn, coloured by the turn's
credit), then the transcript with each turn tinted the same way, its tool calls and
observations, and the method's details for that turn (Shapley value, counterfactual delta,
C3 node value, critic score and reply...).  Colours share one scale across all episodes so
they compare: blue is positive credit, red negative, white none.  The decisive turn or agent
is badged as ``mas.report.methods`` defines it for the method's granularity, and turns whose
output did not parse are flagged with their share of the episode's positive credit.  The
markup is ``templates/episodes.html.j2``; this module builds what it shows.
"""

from __future__ import annotations

import math
from typing import Any

from mas.envs.verifiers import VERIFIED
from mas.report.methods import DECISIVE_RULES, Decisive, decisive, positive_share, unparsed
from mas.report.render import finite, macro, slug

MAX_TEXT = 3000  # characters of a turn's text shown (the rest is cut, and said so)
FOLD_TEXT = 400  # characters of a turn's text shown open; the rest unfolds on a click
MAX_SIDE = 1500  # characters of a tool observation or a method-detail text (e.g. a critic's reply)
LIMITS = {"text": MAX_TEXT, "fold": FOLD_TEXT, "side": MAX_SIDE}

SCALE_QUANTILE = 0.95
TEMPLATE = "episodes.html.j2"


def credit_scale(episodes: list[dict]) -> float:
    """The |credit| that maps to full colour: the 95th percentile over all stored turns."""
    values = sorted(abs(t["credit"]) for ep in episodes for t in _turns(ep) if finite(t.get("credit")))
    if not values:
        return 1.0
    q = values[min(len(values) - 1, int(SCALE_QUANTILE * (len(values) - 1) + 0.5))]
    return q if q > 0 else (values[-1] or 1.0)


def credit_colour(value: float | None, scale: float, strength: float = 1.0) -> str:
    """Diverging colour: white at 0, blue (#2166ac) at +scale, red (#b2182b) at -scale.

    Intensity grows with sqrt(|value| / scale), so credit a quarter of the scale is already
    half-saturated: small but real differences between turns stay visible."""
    if not finite(value) or scale <= 0:
        return "#f2f2f2"
    r = max(-1.0, min(1.0, value / scale))
    t = math.copysign(math.sqrt(abs(r)), r) * strength
    end = (33, 102, 172) if t > 0 else (178, 24, 43)
    a = abs(t)
    r, g, b = (round(255 + (e - 255) * a) for e in end)
    return f"#{r:02x}{g:02x}{b:02x}"


# what the breakdown keys of the built-in methods mean (docs/credit.md has the formulas)
KEY_HELP = {
    "turn_reward": "reward handed to the normaliser for this turn",
    "episode_score": "the episode's score before normalisation",
    "episode_advantage": "the episode's advantage (episode-level normalisers)",
    "norm_mean": "mean of the set this turn was normalised in",
    "norm_std": "std of that set",
    "norm_count": "size of that set",
    "norm_tokens": "tokens weighing that set",
    "baseline_mean": "baseline: mean of the agent's set",
    "baseline_std": "std of the agent's set",
    "baseline_count": "turns in the agent's set",
    "marginal": "Shapley value of this turn's agent in the episode",
    "broadcast": "the team's outcome, given to every agent",
    "tool": "tool-process reward (valid tool calls)",
    "players": "agents that played in the episode",
    "node_value": "C3: mean outcome of the replays from this turn's frozen context",
    "sibling_baseline": "C3: mean of the sibling replays (leave-one-out)",
    "sibling_count": "C3: sibling replays",
    "tree_depth": "C3: depth of this turn in the replay tree",
    "raw_credit": "C3: node value minus sibling baseline",
    "r_joint": "CCPO: the team's reward",
    "r_solo": "CCPO: reward with the upstream agent removed",
    "has_solo": "CCPO: a solo re-run was usable",
    "r_upstream": "CCPO: reward credited to upstream turns",
    "r_downstream": "CCPO: reward credited to downstream turns",
    "upstream": "CCPO: this turn is the upstream agent's",
    "bonus": "CCPO: counterfactual bonus",
    "solo_baseline": "CCPO: mean solo reward of the group",
    "delta": "CCPO v1: joint minus solo reward",
    "critic_score": "critic's score for this turn",
    "verifier_score": "verified: the turn verifier's score (0 where it gave none)",
    "verified": "verified: the turn verifier scored this turn",
    "outcome_reward": "verified: the outcome part of the turn's reward",
    "process_score": "verified: a verifier or critic score went into the turn's reward",
    "critic_reply": "the critic's reply (its rationale)",
    "fallback": "the critic's reply did not parse; the fallback was used",
    "is_main": "M-GRPO: a main-agent turn",
    "item_advantage": "M-GRPO: advantage before alignment",
    "copies": "M-GRPO: times this sub-agent turn is used after alignment (0 = dropped)",
    "sub_position": "M-GRPO: position among the episode's sub-agent calls",
    "d_max": "M-GRPO: aligned number of sub-agent calls",
    "main_reward": "M-GRPO: main agent's reward",
    "main_format": "M-GRPO: main agent's format score",
    "main_advantage": "M-GRPO: main agent's advantage",
    "sub_invocations": "M-GRPO: sub-agent calls in the episode",
    "return": "REINFORCE++: the return before whitening",
    "baseline": "REINFORCE++: the subtracted baseline",
    "token_weight": "REINFORCE++: tokens of this turn",
    "node_return": "MAGRPO: the joint node's return",
    "node_baseline": "MAGRPO: the node baseline",
    "node_advantage": "MAGRPO: advantage before normalisation",
    "node_size": "MAGRPO: joint samples of the node",
    "trained": "the method kept this turn in the update",
}


def _turns(ep: dict) -> list[dict]:
    turns = ep.get("turns")
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def _details(details: Any) -> list[tuple[str, Any, str]]:
    if not isinstance(details, dict):
        return []
    return [(str(k), v, KEY_HELP.get(k, "")) for k, v in details.items()]


def _percent(share: float | None) -> str:
    return f"{100 * share:.1f}%" if share else ""


def _episode_key(ep: dict) -> str:
    return slug(f"s{ep.get('step', 0)}-g{ep.get('group_id', 0)}-e{ep.get('sample_id', 0)}")


def _turn_id(ep: dict, i: int) -> str:
    return f"ep-{_episode_key(ep)}-t{i}"


def _call_text(call: Any) -> str:
    if isinstance(call, dict):
        if call.get("name") is None:  # the block did not parse; the raw text is in the turn above
            return "(malformed call)"
        name = call.get("name", "?")
        args = call.get("args", call.get("arguments", {}))
        if isinstance(args, dict):
            return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
        return f"{name}({args!r})"
    return str(call)


def _tools(t: dict) -> list[dict]:
    calls = t.get("tool_calls") if isinstance(t.get("tool_calls"), list) else []
    obs = t.get("observations") if isinstance(t.get("observations"), list) else []
    out = []
    for i in range(max(len(calls), len(obs))):
        call = calls[i] if i < len(calls) else None
        bad = isinstance(call, dict) and call.get("valid") is False
        out.append({"text": _call_text(call) if call is not None else "", "bad": bad,
                    "error": str(call["error"]) if bad and call.get("error") else "",
                    "observation": obs[i] if i < len(obs) else ""})
    return out


def _heatmap(ep: dict, agents: list[str], scale: float, key: Decisive) -> dict:
    """Agents × turns grid; a cell is filled where that agent spoke at that turn."""
    turns = _turns(ep)
    names = [str(t.get("agent")) for t in turns]
    rows = [a for a in dict.fromkeys(agents) if a in names]
    rows += [a for a in dict.fromkeys(names) if a not in rows]
    return {"n": len(turns), "rows": [
        {"agent": a, "key": a in key.agents,
         "cells": [{"i": i, "credit": t.get("credit"), "colour": credit_colour(t.get("credit"), scale), "id": _turn_id(ep, i)}
                   if names[i] == a else None for i, t in enumerate(turns)]}
        for a in rows]}


def _turn_view(ep: dict, i: int, t: dict, scale: float, key: Decisive, turns: list[dict]) -> dict:
    c = t.get("credit")
    flags: list[tuple[str, str]] = []
    if unparsed(t):
        share = positive_share(turns, [i])
        flags.append((f"unparsed output, yet {_percent(share)} of this episode's positive credit" if share
                      else "unparsed output", "bad"))
    elif t.get("valid", True) is False:
        flags.append(("invalid tool call", "bad"))
    if t.get("finish_reason") not in (None, "stop"):
        flags.append((str(t["finish_reason"]), ""))
    if t.get("trainable", True) is False:
        flags.append(("not trained (frozen)", ""))
    if isinstance(t.get("details"), dict) and t["details"].get("trained") is False:
        flags.append(("left out by the method", ""))
    if i in key.turns:
        flags.append(("decisive agent" if key.agents else "largest |credit| in this episode", "key"))
    parsed = t.get("parsed") if isinstance(t.get("parsed"), dict) else {}
    parent = t.get("parent")
    extra = t.get("extra_rewards") if isinstance(t.get("extra_rewards"), dict) else {}
    verified = extra.get(VERIFIED)
    return {
        "verified": verified if finite(verified) else None,  # the turn verifier's score (envs/verifiers.py)
        "i": i, "id": _turn_id(ep, i), "agent": str(t.get("agent")), "policy": str(t.get("policy", "")),
        "parent": parent if isinstance(parent, int) and not isinstance(parent, bool) else None,
        "tokens": t.get("completion_tokens", 0), "credit": c, "credit_attr": repr(float(c)) if finite(c) else "",
        "bg": credit_colour(c, scale, 0.45), "border": credit_colour(c, scale), "flags": flags, "unparsed": unparsed(t),
        "text": t.get("text", ""), "answer": parsed.get("answer"), "tools": _tools(t), "details": _details(t.get("details")),
    }


def episode_view(ep: dict, agents: list[str], scale: float, open_: bool, level: str | None = None) -> dict:
    """What the template shows of one stored episode (``level``: the credit granularity level)."""
    turns = _turns(ep)
    key = decisive(turns, level)
    task = ep.get("task") if isinstance(ep.get("task"), dict) else {}
    scores = ep.get("scores") if isinstance(ep.get("scores"), dict) else {}
    bad = [i for i, t in enumerate(turns) if unparsed(t)]
    return {
        "open": open_, "step": ep.get("step", "?"), "task_id": task.get("task_id", "?"), "reward": ep.get("reward", 0.0),
        "scores": [(str(k), v) for k, v in scores.items()], "status": str(ep.get("status", "ok")),
        "prompt": task.get("prompt", ""), "reference": task.get("answer", ""), "answer": ep.get("answer"),
        "error": ep.get("error"), "failure": ep.get("failure"), "details": _details(ep.get("details")),
        "all_zero": bool(turns) and all(finite(t.get("credit")) and t["credit"] == 0 for t in turns),
        "unparsed_share": _percent(positive_share(turns, bad)) if bad else "",
        "decisive_agents": sorted(key.agents),
        "strip": [{"i": i, "agent": str(t.get("agent")), "credit": t.get("credit"), "colour": credit_colour(t.get("credit"), scale)}
                  for i, t in enumerate(turns)],
        "heatmap": _heatmap(ep, agents, scale, key),
        "turns": [_turn_view(ep, i, t, scale, key, turns) for i, t in enumerate(turns)],
    }


def legend(scale: float) -> str:
    stops = [(s * scale, credit_colour(s * scale, scale)) for s in (-1.0, -0.25, 0.0, 0.25, 1.0)]
    return macro(TEMPLATE, "legend")(stops, scale)


def episode_block(ep: dict, agents: list[str], scale: float, open_: bool, level: str | None = None) -> str:
    """One episode: summary line, task, heatmap, transcript and the method's details."""
    return macro(TEMPLATE, "episode")(episode_view(ep, agents, scale, open_, level), LIMITS)


def compact_block(ep: dict, agents: list[str], scale: float, level: str | None = None) -> str:
    """An episode without its transcript (the report's size budget is spent): heatmap and a pointer."""
    return macro(TEMPLATE, "compact")(episode_view(ep, agents, scale, False, level))


EPISODES_BUDGET = 3_000_000  # characters of episode HTML; past it, older episodes keep their heatmap only


def episode_browser(episodes: list[dict], agents: list[str], budget: int = EPISODES_BUDGET,
                    level: str | None = None, granularity: str | None = None) -> str:
    """Every stored episode, newest first, the newest open; ``level`` and ``granularity``: the
    method's credit level (``methods.credit_level``) and its card's text, for the decisive badge."""
    if not episodes:
        return macro(TEMPLATE, "browser")(0, "", "", [])
    scale = credit_scale(episodes)
    ordered = sorted(episodes, key=lambda e: (-(e.get("step") if finite(e.get("step")) else 0),))  # newest first
    parts, used = [], 0
    for i, ep in enumerate(ordered):
        block = episode_block(ep, agents, scale, open_=(i == 0), level=level)
        if used + len(block) > budget and i > 0:
            block = compact_block(ep, agents, scale, level)
        used += len(block)
        parts.append(block)
    rule = DECISIVE_RULES[level].format(g=granularity or "?")
    return macro(TEMPLATE, "browser")(len(episodes), legend(scale), rule, parts)
