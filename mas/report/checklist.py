"""The credit-assignment reporting checklist, and the per-agent table of who earned the reward.

Checklist rows: base models and sizes, data source and size, credit granularity,
methodology family, baseline, compute (wall time, device-hours), credit-specific overhead,
and the distribution of trajectory lengths in turns and in tokens.  Each answer is built as
lines of (text, style) segments and drawn by ``templates/tables.html.j2``.
"""

from __future__ import annotations

import statistics
from typing import Any

from mas.report.methods import method_of, share_note
from mas.report.render import finite, macro
from mas.report.run import RunData

Lines = list[list[tuple[str, str]]]  # lines of (text, style) segments: "" plain, "b" bold, else a class
TEMPLATE = "tables.html.j2"
ROLE_CHARS = 1500  # characters of an agent's role prompt shown


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


def _models(run: RunData) -> Lines:
    policies = run.info.get("policies")
    if not policies:
        cfgs = run.config.get("policies", {})
        return [[(f"{n}: {p.get('model')} ({p.get('kind')})", "")] for n, p in cfgs.items()]
    lines = []
    for name, p in policies.items():
        kind = str(p.get("kind", "?"))
        if p.get("trainable_parameters"):
            kind += f" ({_count(p['trainable_parameters'])} trainable)"
        elif kind != "frozen":
            kind += " (frozen)"
        lines.append([(str(name), "b"), (f": {p['model']} — {_count(p.get('parameters', 0))} parameters, {kind}, "
                                         f"{p.get('dtype', '?')} on {p.get('device', '?')}; "
                                         f"agents: {', '.join(p.get('agents', [])) or 'none'}", "")])
    return lines


def _data(run: RunData) -> Lines:
    env = run.info.get("env") or {"name": run.config.get("env", {}).get("name", "?")}
    t = run.config.get("trainer", {})
    steps, b, g = len(run.steps), t.get("batch_size", 0), t.get("group_size", 0)
    lines = [[(str(env.get("name")), "b")]]
    for key, label in (("source", "source"), ("train_size", "training set"), ("eval_size", "held-out set"), ("corpus", "corpus")):
        if env.get(key):
            lines.append([(f"{label}: {env[key]}", "")])
    lines.append([(f"used in training: {steps} steps × {b} tasks × {g} episodes per task = {steps * b * g} episodes", "")])
    return lines


def _method(run: RunData) -> tuple[Lines, Lines, Lines]:
    credit = run.info.get("credit") or {}
    cfg = run.config.get("credit", {})
    method = credit.get("method", cfg.get("method", "?"))
    keys = ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "method" and not isinstance(v, (dict, list)))
    family = [[(str(method), "b"), (f": {credit.get('family', 'see docs/credit.md')}", "")]]
    if keys:
        family.append([(keys, "muted")])
    return family, [[(str(credit.get("granularity", "?")), "")]], [[(str(credit.get("baseline", "?")), "")]]


def _compute(run: RunData) -> Lines:
    wall = wall_seconds(run)
    devices = run.info.get("devices") or ["?"]
    cuda = run.info.get("cuda_devices") or []
    n_dev = len(devices)
    where = ", ".join(devices) + (f" ({', '.join(cuda)})" if cuda else "")
    credit = sum(m.get("time", {}).get("credit", 0.0) for m in run.steps)
    share = f"{100 * credit / wall:.0f}%" if wall else "—"
    return [[(f"training wall time {duration(wall)} over {len(run.steps)} steps (evaluations not included); "
              f"{wall * n_dev / 3600:.3f} device-hours on {n_dev} device{'s' if n_dev != 1 else ''}: {where}; "
              f"credit assignment took {duration(credit)} ({share} of the time)", "")]]


def _overhead(run: RunData) -> Lines:
    totals: dict[str, float] = {}
    for m in run.steps:
        for k, v in m.get("credit_cost", {}).items():
            totals[k] = totals.get(k, 0) + v
    times = {k: sum(m.get("time", {}).get(f"credit_{k}", 0.0) for m in run.steps)
             for k in ("replays", "interventions", "critic")}
    sampled = sum(m.get("tokens", 0) for m in run.steps)
    return [
        [(f"extra generations: {int(totals.get('extra_generations', 0))} "
          f"(team rollouts generated {sum(sum(m.get('lengths', {}).get('turns', [])) for m in run.steps)} turns, {sampled} tokens)", "")],
        [(f"replays: {int(totals.get('replays', 0))} ({duration(times['replays'])})", "")],
        [(f"coalition / counterfactual re-runs: {int(totals.get('interventions', 0))} ({duration(times['interventions'])})", "")],
        [(f"critic calls: {int(totals.get('critiques', 0))} ({duration(times['critic'])})", "")],
    ]


def _distribution(values: list[float]) -> Lines:
    if not values:
        return [[("—", "")]]
    return [[(f"min {min(values):g} · median {statistics.median(values):g} · max {max(values):g} (n = {len(values)} episodes)", "")]]


def _lengths(run: RunData) -> tuple[Lines, Lines]:
    turns = [v for m in run.steps for v in m.get("lengths", {}).get("turns", [])]
    tokens = [v for m in run.steps for v in m.get("lengths", {}).get("tokens", [])]
    return _distribution(turns), _distribution(tokens)


def checklist_rows(run: RunData) -> list[tuple[str, str]]:
    """(question, answer as HTML) rows of the reporting checklist."""
    family, granularity, baseline = _method(run)
    turns, tokens = _lengths(run)
    lines = macro(TEMPLATE, "lines")
    return [(q, lines(a)) for q, a in [
        ("Base models and sizes", _models(run)),
        ("Data source and size", _data(run)),
        ("Credit granularity", granularity),
        ("Methodology family", family),
        ("Baseline", baseline),
        ("Compute: wall time and device-hours", _compute(run)),
        ("Credit-specific overhead", _overhead(run)),
        ("Trajectory length (turns)", turns),
        ("Trajectory length (completion tokens)", tokens),
    ]]


def checklist_table(run: RunData) -> str:
    return macro(TEMPLATE, "checklist")(checklist_rows(run))


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if finite(v)]
    return statistics.fmean(vals) if vals else None


def _weighted(ms: list[dict[str, Any]], key: str, weight: str) -> float | None:
    """The mean of ``key`` over the steps ``ms`` that have it, each weighted by its ``weight``
    (the turns or episodes it averages; 1 in a record without it)."""
    pairs = [(float(a[key]), float(a[weight]) if finite(a.get(weight)) else 1.0) for a in ms if finite(a.get(key))]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else None


# How right an agent's own turns were, where the run knows: the turn verifier's mean score
# (``verified_accuracy``, envs/verifiers.py), else a designed task's ground truth of whether it
# did its part (``designed_accuracy``, envs/base.py).  The per-agent table shows it, and the
# free-rider flag reads it: an agent whose turns were mostly right does its part, whatever its
# credit.
CORRECTNESS = (("verified_accuracy", "verified_turns", "verified accuracy",
                "mean turn-verifier score of the agent's turns (envs/verifiers.py)"),
               ("designed_accuracy", "designed_episodes", "did its part",
                "share of its episodes where it did its designed part right (envs/base.py)"))
RIGHT_ENOUGH = 0.5  # correctness at or above this: the agent does its part, so it is not called a free rider
LOW_SHARE = 0.5  # a credit share below this fraction of the share of turns is low
HIGH_SHARE = 1.5  # above this fraction, high
FOLLOWS_POINTS = 5.0  # shares within this many percentage points of the shares of turns "follow" them


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _adv(x: float) -> str:
    return f"{0.0 if abs(x) < 5e-4 else x:+.3f}"


def _flags(share: float | None, turn_share: float, right: float | None, label: str, unparsed: float | None) -> list[tuple[str, str]]:
    """The tags of an agent's row, from the numbers the row shows (``right``: its correctness, where known)."""
    flags = []
    if share is None:
        flags.append(("no turn got positive credit in these steps", ""))
    elif turn_share > 0 and share < LOW_SHARE * turn_share:
        if right is None:  # nothing says whether its turns were right: the credit is the only evidence
            flags.append(("low credit for its share of turns: free-rider?", "bad"))
        elif right < RIGHT_ENOUGH:
            flags.append((f"low credit for its share of turns, and its turns were mostly wrong ({label} "
                          f"{_pct(right)}): free-rider?", "bad"))
        else:  # it does its part: the credit method is what undervalues it
            flags.append((f"low credit for its share of turns, though it does its part ({label} {_pct(right)})", ""))
    elif share > HIGH_SHARE * turn_share:
        flags.append(("earns more credit than its share of turns", "key"))
    if unparsed is not None and unparsed >= 0.005:
        flags.append((f"{100 * unparsed:.1f}% of the team's positive credit went to its unparsed turns", "bad"))
    return flags


def table_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Sentences about the per-agent table, each computed from the numbers the table shows (the
    rounded text of its cells) and said only where it is true of them: whether the credit
    shares follow the shares of turns, and whether the mean advantages are 0."""
    spoke = [r for r in rows if not r["silent"]]
    notes = []
    shared = [r for r in spoke if r["share"] != "—"]
    if len(shared) >= 2:
        gaps = [(abs(float(r["share"][:-1]) - float(r["turn_share"][:-1])), r) for r in shared]
        widest, r = max(gaps, key=lambda g: g[0])
        if widest <= FOLLOWS_POINTS:
            notes.append(f"The credit shares follow the shares of turns: every agent's is within {FOLLOWS_POINTS:g} "
                         f"points of its share of turns.")
        else:
            notes.append(f"The credit shares do not follow the shares of turns: {r['name']} has {r['share']} of the "
                         f"credit for {r['turn_share']} of the turns.")
    if spoke:
        off = [r for r in spoke if float(r["advantage"]) != 0.0]
        if not off:
            notes.append("Every agent's mean advantage is 0 (to 3 decimals)." if len(spoke) > 1
                         else "The agent's mean advantage is 0 (to 3 decimals).")
        else:
            notes.append("Mean advantages are not 0 for " + ", ".join(f"{r['name']} ({r['advantage']})" for r in off) + ".")
    return notes


def agent_table(run: RunData, tail: float = 0.2) -> str:
    """Who earned the reward: per agent over the last ``tail`` of the steps, with a line on what
    the method's credit share measures and notes on what this table's numbers show."""
    if not run.steps:
        return ""
    method, _ = method_of(run.info, run.config)
    last = run.steps[int(len(run.steps) * (1 - tail)):] or run.steps[-1:]
    total_turns = sum(a.get("turns", 0) for m in last for a in m.get("agents", {}).values()) or 1
    roles = {str(a.get("name")): a.get("role") for a in run.config.get("agents", []) if isinstance(a, dict)}
    per_agent = {name: [m["agents"][name] for m in last if name in m.get("agents", {})] for name in run.agents}
    # the correctness column: the first kind of it that some agent has in these steps
    source = next((c for c in CORRECTNESS if any(finite(a.get(c[0])) for ms in per_agent.values() for a in ms)), None)
    rows = []
    for name in run.agents:
        role = roles.get(name)
        role = str(role)[:ROLE_CHARS] + ("…" if len(str(role)) > ROLE_CHARS else "") if role else ""
        ms = per_agent[name]
        if not ms:
            rows.append({"name": name, "role": role, "silent": True})
            continue
        share = _mean([a.get("credit_share") for a in ms])  # None in a step: no positive credit that step
        unparsed = _mean([a.get("unparsed_credit_share") for a in ms])
        turn_share = sum(a.get("turns", 0) for a in ms) / total_turns
        adv = statistics.fmean(a.get("advantage", {}).get("mean", 0.0) for a in ms)
        parse = sum(a.get("parse_failures", 0) for a in ms)
        tool = [a["tool_valid"] for a in ms if "tool_valid" in a]
        right = _weighted(ms, source[0], source[1]) if source else None
        rows.append({
            "name": name, "role": role, "silent": False,
            "reward": f"{statistics.fmean(a.get('reward', 0.0) for a in ms):.3f}",
            "share": "—" if share is None else _pct(share), "turn_share": _pct(turn_share),
            "advantage": _adv(adv), "parse": parse,
            "unparsed_share": "—" if unparsed is None else _pct(unparsed),
            "tool": f"{100 * statistics.fmean(tool):.0f}%" if tool else "—",
            "right": "—" if right is None else _pct(right),
            "flags": _flags(share, turn_share, right, source[2] if source else "", unparsed),
        })
    view = {"method": method, "note": share_note(method), "rows": rows, "last": len(last), "steps": len(run.steps),
            "notes": table_notes(rows), "right": {"label": source[2], "help": source[3], "threshold": _pct(RIGHT_ENOUGH)} if source else None}
    return macro(TEMPLATE, "agents")(view)
