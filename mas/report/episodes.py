"""The episode browser: stored sample episodes with every turn coloured by its credit.

Each episode shows a heatmap (agents × turns, one cell per turn, coloured by the turn's
credit), then the transcript with each turn tinted the same way, its tool calls and
observations, and the method's details for that turn (Shapley value, counterfactual delta,
C3 node value, critic score and reply...).  Colours share one scale across all episodes so
they compare: blue is positive credit, red negative, white none.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from mas.report.charts import fmt

MAX_TEXT = 3000  # characters of a turn's text shown (the rest is cut, and said so)
MAX_SIDE = 1500  # characters of a tool observation or a method-detail text (e.g. a critic's reply)


SCALE_QUANTILE = 0.95


def credit_scale(episodes: list[dict]) -> float:
    """The |credit| that maps to full colour: the 95th percentile over all stored turns."""
    values = sorted(abs(t["credit"]) for ep in episodes for t in ep["turns"] if _finite(t.get("credit")))
    if not values:
        return 1.0
    q = values[min(len(values) - 1, int(SCALE_QUANTILE * (len(values) - 1) + 0.5))]
    return q if q > 0 else (values[-1] or 1.0)


def credit_colour(value: float | None, scale: float, strength: float = 1.0) -> str:
    """Diverging colour: white at 0, blue (#2166ac) at +scale, red (#b2182b) at -scale.

    Intensity grows with sqrt(|value| / scale), so credit a quarter of the scale is already
    half-saturated: small but real differences between turns stay visible."""
    if not _finite(value) or scale <= 0:
        return "#f2f2f2"
    r = max(-1.0, min(1.0, value / scale))
    t = math.copysign(math.sqrt(abs(r)), r) * strength
    end = (33, 102, 172) if t > 0 else (178, 24, 43)
    a = abs(t)
    r, g, b = (round(255 + (e - 255) * a) for e in end)
    return f"#{r:02x}{g:02x}{b:02x}"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    text = text or ""
    if len(text) <= limit:
        return escape(text)
    return escape(text[:limit]) + f'<span class="cut"> … ({len(text) - limit} more characters)</span>'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if _finite(v):
        return fmt(float(v))
    if v is None:
        return "—"
    if isinstance(v, list):
        return ", ".join(_value(x) for x in v)
    return f"<pre>{_cut(str(v), MAX_SIDE)}</pre>"


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


def _details_table(details: dict[str, Any]) -> str:
    if not details:
        return '<p class="note">The method recorded no details for this item.</p>'
    rows = "".join(
        f'<tr><th>{escape(k)}</th><td>{_value(v)}</td><td class="muted">{escape(KEY_HELP.get(k, ""))}</td></tr>'
        for k, v in details.items()
    )
    return f'<table class="kv">{rows}</table>'


def legend(scale: float) -> str:
    stops = [-1.0, -0.25, 0.0, 0.25, 1.0]
    cells = "".join(
        f'<span class="swatch" style="background:{credit_colour(s * scale, scale)}">{fmt(s * scale)}</span>' for s in stops
    )
    return (f'<div class="credit-legend"><span>credit of a turn:</span>{cells}'
            '<span class="note">blue = earned credit, red = blamed, white = none; '
            f'full colour at |credit| ≥ {fmt(scale)} (95th percentile of stored turns)</span></div>')


def heatmap(ep: dict, agents: list[str], scale: float) -> str:
    """Agents × turns grid; a cell is coloured where that agent spoke at that turn."""
    turns = ep["turns"]
    rows = [a for a in agents if any(t["agent"] == a for t in turns)]
    rows += [a for a in dict.fromkeys(t["agent"] for t in turns) if a not in rows]
    head = "".join(f"<th>{i}</th>" for i in range(len(turns)))
    body = []
    for a in rows:
        cells = []
        for i, t in enumerate(turns):
            if t["agent"] != a:
                cells.append("<td></td>")
                continue
            c = t.get("credit")
            cells.append(f'<td class="cell" style="background:{credit_colour(c, scale)}" '
                         f'title="turn {i} · {escape(a)} · credit {_value(c)}"><a href="#{_turn_id(ep, i)}">{_value(c)}</a></td>')
        body.append(f'<tr><th class="agent">{escape(a)}</th>{"".join(cells)}</tr>')
    return (f'<table class="heatmap"><thead><tr><th>agent \\ turn</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _episode_key(ep: dict) -> str:
    return f"s{ep.get('step', 0)}-g{ep.get('group_id', 0)}-e{ep.get('sample_id', 0)}"


def _turn_id(ep: dict, i: int) -> str:
    return f"ep-{_episode_key(ep)}-t{i}"


def _tools(t: dict) -> str:
    calls, obs = t.get("tool_calls") or [], t.get("observations") or []
    if not calls and not obs:
        return ""
    items = []
    for i in range(max(len(calls), len(obs))):
        call = calls[i] if i < len(calls) else None
        seen = obs[i] if i < len(obs) else ""
        call_txt = escape(_call_text(call)) if call is not None else ""
        bad = isinstance(call, dict) and call.get("valid") is False
        flag = (f'<span class="tag bad">invalid call{": " + escape(str(call["error"])) if call.get("error") else ""}</span>'
                if bad else "")
        items.append(f'<li><code>{call_txt}</code>{flag}<pre class="observation">{_cut(seen, MAX_SIDE)}</pre></li>')
    return f'<div class="tools"><span class="tag">tool calls</span><ol>{"".join(items)}</ol></div>'


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


def turn_block(ep: dict, i: int, t: dict, scale: float, decisive: int | None) -> str:
    c = t.get("credit")
    flags = []
    if not t.get("valid", True):
        bad = "invalid tool call" if t.get("tool_calls") else "parse failure"
        flags.append(f'<span class="tag bad">{bad}</span>')
    if t.get("finish_reason") not in (None, "stop"):
        flags.append(f'<span class="tag">{escape(str(t["finish_reason"]))}</span>')
    if not t.get("trainable", True):
        flags.append('<span class="tag">not trained (frozen)</span>')
    if (t.get("details") or {}).get("trained") is False:
        flags.append('<span class="tag">left out by the method</span>')
    if i == decisive:
        flags.append('<span class="tag key">largest |credit| in this episode</span>')
    answer = (t.get("parsed") or {}).get("answer")
    answer_html = f'<span class="answer">answer: {escape(str(answer))}</span>' if answer else ""
    parent = t.get("parent")
    parent_html = f' · called by turn {parent}' if parent is not None else ""
    return (
        f'<div class="turn" id="{_turn_id(ep, i)}" data-credit="{c if _finite(c) else ""}" data-agent="{escape(t["agent"])}" '
        f'style="background:{credit_colour(c, scale, 0.45)};border-left-color:{credit_colour(c, scale)}">'
        f'<div class="turn-head"><b>#{i} {escape(t["agent"])}</b> <span class="muted">policy {escape(t.get("policy", ""))}'
        f'{parent_html} · {t.get("completion_tokens", 0)} tokens</span>'
        f'<span class="credit">credit {_value(c)}</span>{"".join(flags)}</div>'
        f'<pre class="text">{_cut(t.get("text", ""))}</pre>{answer_html}{_tools(t)}'
        f'<details class="method"><summary>method details for this turn</summary>{_details_table(t.get("details") or {})}</details>'
        "</div>"
    )


def episode_block(ep: dict, agents: list[str], scale: float, open_: bool) -> str:
    turns = ep["turns"]
    credits = [abs(t["credit"]) if _finite(t.get("credit")) else -1.0 for t in turns]
    decisive = max(range(len(turns)), key=lambda i: credits[i]) if turns and max(credits) > 0 else None
    task = ep.get("task", {})
    reward = ep.get("reward", 0.0)
    status = ep.get("status", "ok")
    status_html = f' · <span class="tag bad">{escape(status)}</span>' if status != "ok" else ""
    strip = "".join(f'<span class="strip" style="background:{credit_colour(t.get("credit"), scale)}" '
                    f'title="#{i} {escape(t["agent"])}: {_value(t.get("credit"))}"></span>' for i, t in enumerate(turns))
    scores = "".join(f" · {escape(k.upper())} {_value(v)}" for k, v in (ep.get("scores") or {}).items())
    summary = (f'<summary><span class="ep-title">step {ep.get("step", "?")} · task {escape(str(task.get("task_id", "?")))}'
               f' · reward {_value(reward)}{scores} · {len(turns)} turn{"" if len(turns) == 1 else "s"}{status_html}</span><span class="strips">{strip}</span></summary>')
    question = f'<p class="question"><b>Task:</b> {_cut(task.get("prompt", ""))}<br><b>Reference answer:</b> {escape(str(task.get("answer", "")))}' \
               f' · <b>team answer:</b> {escape(str(ep.get("answer")))}</p>'
    body = "".join(turn_block(ep, i, t, scale, decisive) for i, t in enumerate(turns))
    ep_details = (f'<details class="method"><summary>method details for the whole episode</summary>'
                  f'{_details_table(ep.get("details") or {})}</details>')
    error = f'<p class="tag bad">error: {escape(str(ep.get("error")))}</p>' if ep.get("error") else ""
    if turns and all(_finite(t.get("credit")) and t["credit"] == 0 for t in turns):
        error += ('<p class="note">Every turn got credit 0: usually the episodes this one was compared with '
                  "(its group, or the agent's turns in the batch) all had the same reward, so there was no signal to share out.</p>")
    return (f'<details class="episode"{" open" if open_ else ""} data-step="{ep.get("step", "")}">{summary}{question}{error}'
            f'{heatmap(ep, agents, scale)}<div class="transcript">{body}</div>{ep_details}</details>')


EPISODES_BUDGET = 3_000_000  # characters of episode HTML; past it, older episodes keep their heatmap only


def compact_block(ep: dict, agents: list[str], scale: float) -> str:
    """An episode without its transcript (the report's size budget is spent): heatmap and a pointer."""
    return (f'<details class="episode" data-step="{ep.get("step", "")}"><summary><span class="ep-title">step {ep.get("step", "?")}'
            f' · reward {_value(ep.get("reward", 0.0))} · {len(ep["turns"])} turns (heatmap only)</span></summary>'
            f'{heatmap(ep, agents, scale)}<p class="note">The transcript is left out to keep the report small; '
            "it is in the run's episodes.jsonl.</p></details>")


def episode_browser(episodes: list[dict], agents: list[str], budget: int = EPISODES_BUDGET) -> str:
    if not episodes:
        return ('<p class="note">No episodes were stored. They are written every logging.episodes_every steps '
                '(trainer.sample_episodes per step).</p>')
    scale = credit_scale(episodes)
    ordered = sorted(episodes, key=lambda e: (-e.get("step", 0),))  # newest first
    parts, used = [], 0
    for i, ep in enumerate(ordered):
        block = episode_block(ep, agents, scale, open_=(i == 0))
        if used + len(block) > budget and i > 0:
            block = compact_block(ep, agents, scale)
        used += len(block)
        parts.append(block)
    blocks = "".join(parts)
    return (f'{legend(scale)}<p class="note">{len(episodes)} stored episodes, newest first; at each stored step the best and the '
            f'worst outcome alternate. Click an episode to open it; click a heatmap cell to jump to that turn.</p>{blocks}')
