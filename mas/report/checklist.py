"""The credit-assignment reporting checklist: one question per row, answered from the run.

Rows: base models and sizes, data source and size, credit granularity, methodology family,
baseline, compute (wall time, device-hours), credit-specific overhead, and the distribution
of trajectory lengths in turns and in tokens.
"""

from __future__ import annotations

import statistics
from html import escape

from mas.report.run import RunData


def _count(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return f"{n:.0f}"


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def wall_seconds(run: RunData) -> float:
    """Training wall time: the sum of the recorded step times (evaluations not included)."""
    total = 0.0
    for m in run.steps:
        t = m.get("time", {})
        # "step" is the whole step; runs written before it was recorded have only its phases
        total += t["step"] if "step" in t else sum(t.get(k, 0.0) for k in ("rollout", "credit", "update", "sync"))
    return total


def _models(run: RunData) -> str:
    policies = run.info.get("policies")
    if not policies:
        cfgs = run.config.get("policies", {})
        return "<br>".join(f"{escape(n)}: {escape(str(p.get('model')))} ({escape(str(p.get('kind')))})" for n, p in cfgs.items())
    lines = []
    for name, p in policies.items():
        trainable = (f"{_count(p['trainable_parameters'])} trainable" if p.get("trainable_parameters") else "frozen")
        lines.append(f"<b>{escape(name)}</b>: {escape(str(p['model']))} — {_count(p.get('parameters', 0))} parameters, "
                     f"{escape(p['kind'])} ({trainable}), {escape(p.get('dtype', '?'))} on {escape(p.get('device', '?'))}; "
                     f"agents: {escape(', '.join(p.get('agents', [])) or 'none')}")
    return "<br>".join(lines)


def _data(run: RunData) -> str:
    env = run.info.get("env") or {"name": run.config.get("env", {}).get("name", "?")}
    t = run.config.get("trainer", {})
    steps, b, g = len(run.steps), t.get("batch_size", 0), t.get("group_size", 0)
    parts = [f"<b>{escape(str(env.get('name')))}</b>"]
    for key, label in (("source", "source"), ("train_size", "training set"), ("eval_size", "held-out set"), ("corpus", "corpus")):
        if env.get(key):
            parts.append(f"{label}: {escape(str(env[key]))}")
    parts.append(f"used in training: {steps} steps × {b} tasks × {g} episodes per task = {steps * b * g} episodes")
    return "<br>".join(parts)


def _method(run: RunData) -> tuple[str, str, str]:
    credit = run.info.get("credit") or {}
    cfg = run.config.get("credit", {})
    method = credit.get("method", cfg.get("method", "?"))
    keys = ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "method" and not isinstance(v, (dict, list)))
    family = f"<b>{escape(method)}</b>: {escape(credit.get('family', 'see docs/credit.md'))}"
    if keys:
        family += f'<br><span class="muted">{escape(keys)}</span>'
    return family, escape(credit.get("granularity", "?")), escape(credit.get("baseline", "?"))


def _compute(run: RunData) -> str:
    wall = wall_seconds(run)
    devices = run.info.get("devices") or ["?"]
    cuda = run.info.get("cuda_devices") or []
    n_dev = len(devices)
    where = ", ".join(devices) + (f" ({', '.join(cuda)})" if cuda else "")
    credit = sum(m.get("time", {}).get("credit", 0.0) for m in run.steps)
    share = f"{100 * credit / wall:.0f}%" if wall else "—"
    return (f"training wall time {duration(wall)} over {len(run.steps)} steps (evaluations not included); "
            f"{wall * n_dev / 3600:.3f} device-hours on {n_dev} device{'s' if n_dev != 1 else ''}: {escape(where)}; "
            f"credit assignment took {duration(credit)} ({share} of the time)")


def _overhead(run: RunData) -> str:
    totals: dict[str, float] = {}
    for m in run.steps:
        for k, v in m.get("credit_cost", {}).items():
            totals[k] = totals.get(k, 0) + v
    times = {k: sum(m.get("time", {}).get(f"credit_{k}", 0.0) for m in run.steps)
             for k in ("replays", "interventions", "critic")}
    sampled = sum(m.get("tokens", 0) for m in run.steps)
    parts = [
        f"extra generations: {int(totals.get('extra_generations', 0))} "
        f"(team rollouts generated {sum(sum(m.get('lengths', {}).get('turns', [])) for m in run.steps)} turns, {sampled} tokens)",
        f"replays: {int(totals.get('replays', 0))} ({duration(times['replays'])})",
        f"coalition / counterfactual re-runs: {int(totals.get('interventions', 0))} ({duration(times['interventions'])})",
        f"critic calls: {int(totals.get('critiques', 0))} ({duration(times['critic'])})",
    ]
    return "<br>".join(parts)


def _distribution(values: list[float]) -> str:
    if not values:
        return "—"
    return f"min {min(values):g} · median {statistics.median(values):g} · max {max(values):g} (n = {len(values)} episodes)"


def _lengths(run: RunData) -> tuple[str, str]:
    turns = [v for m in run.steps for v in m.get("lengths", {}).get("turns", [])]
    tokens = [v for m in run.steps for v in m.get("lengths", {}).get("tokens", [])]
    return _distribution(turns), _distribution(tokens)


def checklist_rows(run: RunData) -> list[tuple[str, str]]:
    """(question, answer as HTML) rows of the reporting checklist."""
    family, granularity, baseline = _method(run)
    turns, tokens = _lengths(run)
    return [
        ("Base models and sizes", _models(run)),
        ("Data source and size", _data(run)),
        ("Credit granularity", granularity),
        ("Methodology family", family),
        ("Baseline", baseline),
        ("Compute: wall time and device-hours", _compute(run)),
        ("Credit-specific overhead", _overhead(run)),
        ("Trajectory length (turns)", turns),
        ("Trajectory length (completion tokens)", tokens),
    ]


def checklist_table(run: RunData) -> str:
    rows = "".join(f"<tr><th>{escape(q)}</th><td>{a}</td></tr>" for q, a in checklist_rows(run))
    return f'<table class="checklist">{rows}</table>'


def agent_table(run: RunData, tail: float = 0.2) -> str:
    """Who earned the reward: per agent over the last ``tail`` of the steps."""
    if not run.steps:
        return ""
    last = run.steps[int(len(run.steps) * (1 - tail)):] or run.steps[-1:]
    total_turns = sum(a.get("turns", 0) for m in last for a in m.get("agents", {}).values()) or 1
    rows = []
    for name in run.agents:
        ms = [m["agents"][name] for m in last if name in m.get("agents", {})]
        if not ms:
            rows.append(f"<tr><th>{escape(name)}</th><td colspan=\"6\">—</td>"
                        '<td><span class="tag bad">did not speak in these steps</span></td></tr>')
            continue
        shares = [a["credit_share"] for a in ms if a.get("credit_share") is not None]  # None: no positive credit that step
        share = statistics.fmean(shares) if shares else None
        turn_share = sum(a.get("turns", 0) for a in ms) / total_turns
        adv = statistics.fmean(a.get("advantage", {}).get("mean", 0.0) for a in ms)
        parse = sum(a.get("parse_failures", 0) for a in ms)
        tool = [a["tool_valid"] for a in ms if "tool_valid" in a]
        flag = ""
        if share is None:
            flag = '<span class="tag">no turn got positive credit in these steps</span>'
        elif turn_share > 0 and share < 0.5 * turn_share:
            flag = '<span class="tag bad">low credit for its share of turns: free-rider?</span>'
        elif share > 1.5 * turn_share:
            flag = '<span class="tag key">earns more credit than its share of turns</span>'
        rows.append(
            f"<tr><th>{escape(name)}</th><td>{statistics.fmean(a.get('reward', 0.0) for a in ms):.3f}</td>"
            f"<td>{'—' if share is None else f'{100 * share:.1f}%'}</td><td>{100 * turn_share:.1f}%</td><td>{0.0 if abs(adv) < 5e-4 else adv:+.3f}</td><td>{parse}</td>"
            f"<td>{f'{100 * statistics.fmean(tool):.0f}%' if tool else '—'}</td><td>{flag}</td></tr>"
        )
    head = ("<tr><th>agent</th><th>mean reward</th><th>credit share</th><th>share of turns</th><th>mean advantage</th>"
            "<th>parse failures</th><th>valid tool calls</th><th></th></tr>")
    return (f'<table class="agents">{head}{"".join(rows)}</table><p class="note">Last {len(last)} of {len(run.steps)} steps. '
            "Credit share: the agent's summed positive credit over the team's.</p>")

