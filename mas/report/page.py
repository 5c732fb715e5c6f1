"""Assemble the self-contained HTML report of one run, or the comparison of several.

The page has no scripts, fonts or images from anywhere else: styles are inline, charts are
inline SVG, and the episode browser uses ``<details>`` elements, so it opens offline.
"""

from __future__ import annotations

import statistics
from html import escape

from mas.metrics import eval_summary
from mas.report.charts import DASHES, PALETTE, Series, colour, fmt, line_chart, stacked_chart
from mas.report.checklist import duration, agent_table, checklist_table, wall_seconds
from mas.report.episodes import episode_browser
from mas.report.run import RunData

CSS = """
:root { --fg:#1d1d1f; --muted:#6b6b70; --line:#d9d9de; --bg:#fafafa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0; background: var(--bg); }
header { background: #fff; border-bottom: 1px solid var(--line); padding: 16px 28px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
nav a { margin-right: 14px; color: #0a58ca; text-decoration: none; }
main { padding: 8px 28px 40px; max-width: 1500px; }
section { margin-top: 26px; }
h2 { font-size: 18px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.muted, .note { color: var(--muted); }
.note { font-size: 12.5px; margin: 4px 0; }
.facts { display: flex; flex-wrap: wrap; gap: 8px 22px; margin-top: 6px; }
.facts span b { font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap: 14px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; margin: 0; padding: 10px 12px; }
.card figcaption { font-weight: 600; margin-bottom: 4px; }
.chart { width: 100%; height: auto; }
.chart .grid, .chart line.grid { stroke: #ececf0; stroke-width: 1; }
.chart .axis { stroke: #9a9aa0; stroke-width: 1; }
.chart .tick { font-size: 10.5px; fill: var(--muted); }
.chart .label { font-size: 11px; fill: var(--muted); }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; }
.legend-item { display: inline-flex; align-items: center; gap: 4px; }
table { border-collapse: collapse; background: #fff; }
table.checklist, table.agents, table.runs { width: 100%; border: 1px solid var(--line); }
table.checklist th, table.checklist td, table.agents th, table.agents td, table.runs th, table.runs td {
  text-align: left; vertical-align: top; padding: 7px 10px; border-bottom: 1px solid var(--line); }
table.checklist th { width: 240px; background: #f4f4f6; }
table.agents td, table.runs td { font-variant-numeric: tabular-nums; }
.tag { display: inline-block; font-size: 11.5px; padding: 1px 7px; border-radius: 10px; background: #ececf0; margin-left: 6px; }
.tag.bad { background: #fde2e1; color: #8a1c1c; }
.tag.key { background: #dbe9fb; color: #12407a; }
.credit-legend { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; margin: 6px 0; }
.swatch { display: inline-block; min-width: 52px; text-align: center; font-size: 11.5px; padding: 2px 4px; border: 1px solid var(--line); }
details.episode { background: #fff; border: 1px solid var(--line); border-radius: 8px; margin: 8px 0; padding: 6px 12px; }
details.episode > summary { cursor: pointer; display: flex; justify-content: space-between; align-items: center; gap: 12px; padding: 4px 0; }
.ep-title { font-weight: 600; }
.strips { display: inline-flex; gap: 2px; }
.strip { display: inline-block; width: 14px; height: 14px; border: 1px solid #c9c9cf; }
.question { background: #f4f4f6; padding: 8px 10px; border-radius: 6px; }
table.heatmap { margin: 8px 0 10px; font-size: 12px; }
table.heatmap th, table.heatmap td { border: 1px solid var(--line); padding: 3px 6px; min-width: 44px; text-align: center; }
table.heatmap th.agent { text-align: right; background: #f4f4f6; }
table.heatmap td.cell a { color: #111; text-decoration: none; font-variant-numeric: tabular-nums; }
.turn { border-left: 6px solid #ccc; border-radius: 4px; margin: 8px 0; padding: 6px 10px; }
.turn-head { display: flex; flex-wrap: wrap; align-items: baseline; gap: 4px 10px; }
.turn-head .credit { font-weight: 600; font-variant-numeric: tabular-nums; }
.turn pre.text { white-space: pre-wrap; word-break: break-word; margin: 6px 0; font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace;
  background: rgba(255,255,255,0.75); padding: 6px 8px; border-radius: 4px; }
.answer { font-size: 12.5px; font-weight: 600; }
.tools ol { margin: 4px 0; padding-left: 22px; }
.tools code { font-size: 12px; }
pre.observation { white-space: pre-wrap; margin: 2px 0 6px; font-size: 12px; background: rgba(255,255,255,0.75); padding: 4px 6px; }
details.method { margin: 4px 0; font-size: 12.5px; }
details.method summary { cursor: pointer; color: #0a58ca; }
table.kv th, table.kv td { text-align: left; padding: 2px 10px 2px 0; border-bottom: 1px solid #eee; vertical-align: top; }
table.kv pre { white-space: pre-wrap; margin: 0; max-width: 900px; }
.cut { color: var(--muted); }
"""


def _page(title: str, header: str, sections: list[tuple[str, str, str]]) -> str:
    nav = "".join(f'<a href="#{sid}">{escape(name)}</a>' for sid, name, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{escape(name)}</h2>{html}</section>' for sid, name, html in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        f"<body><header>{header}<nav>{nav}</nav></header><main>{body}</main></body></html>\n"
    )


def _smooth(n: int) -> float | None:
    """EMA weight for curves of ``n`` steps: none for short runs, smoother for long ones."""
    return None if n < 30 else max(0.05, min(0.3, 10 / n))


# --- one run ---------------------------------------------------------------------------------


def _reward_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = [Series("team", xs, run.series("reward", "team"), color="#000000", width=2.6)]
    series += [Series(a, xs, run.series("agents", a, "reward"), color=colour(i), dash="4 3", attrs={"agent": a})
               for i, a in enumerate(run.agents)]
    return line_chart(series, "Reward: team and per agent", "reward", smooth=_smooth(len(xs)),
                      note="An agent's reward is the mean outcome of the episodes it spoke in.")


def _share_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = [Series(a, xs, run.series("agents", a, "credit_share"), color=colour(i), attrs={"agent": a})
              for i, a in enumerate(run.agents)]
    return line_chart(series, "Credit share per agent", "share of positive credit", y_range=(0.0, 1.0),
                      smooth=_smooth(len(xs)), note="Each agent's summed positive credit over the team's, per step.")


def _advantage_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = []
    for i, a in enumerate(run.agents):
        mean = run.series("agents", a, "advantage", "mean")
        std = run.series("agents", a, "advantage", "std")
        lo = [m - s if m is not None and s is not None else None for m, s in zip(mean, std)]
        hi = [m + s if m is not None and s is not None else None for m, s in zip(mean, std)]
        series.append(Series(a, xs, mean, color=colour(i), band=(lo, hi), attrs={"agent": a}))
    return line_chart(series, "Advantage per agent (mean ± std)", "advantage",
                      note="Shaded: ± one standard deviation of the agent's turn advantages in the step.")


def _range_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = []
    for i, a in enumerate(run.agents):
        series.append(Series(f"{a} max", xs, run.series("agents", a, "advantage", "max"), color=colour(i), attrs={"agent": a}))
        series.append(Series(f"{a} min", xs, run.series("agents", a, "advantage", "min"), color=colour(i), dash="2 3",
                             attrs={"agent": a}))
    return line_chart(series, "Advantage range per agent (min, max)", "advantage", smooth=_smooth(len(xs)))


TIMERS = (("rollout", "rollout"), ("credit_replays", "credit: replays"), ("credit_interventions", "credit: coalitions / counterfactuals"),
          ("credit_critic", "credit: critic calls"), ("credit_assign", "credit: assignment"), ("update", "update"), ("sync", "weight sync"))


def _timing_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = []
    for i, (key, label) in enumerate(TIMERS):
        ys = run.series("time", key)
        if key == "credit_assign" and all(y is None for y in ys):  # runs from before the split: the whole credit phase
            ys, label = run.series("time", "credit"), "credit"
        series.append(Series(label, xs, [y or 0.0 for y in ys], color=PALETTE[i], attrs={"timer": key}))
    return stacked_chart(series, "Step time breakdown", "seconds")


POLICY_METRICS = (("loss", "loss"), ("kl", "KL to reference"), ("clip_frac", "clip fraction"), ("entropy", "entropy"),
                  ("grad_norm", "gradient norm (pre-clip)"), ("lr", "learning rate"))


def _policy_charts(run: RunData) -> list[str]:
    xs = run.step_numbers
    out = []
    for key, label in POLICY_METRICS:
        series = [Series(p, xs, run.series("policies", p, key), color=colour(i), attrs={"policy": p})
                  for i, p in enumerate(run.policies)]
        out.append(line_chart(series, f"Per policy: {label}", label))
    return out


def _agent_charts(run: RunData) -> list[str]:
    xs = run.step_numbers
    charts = []
    for key, title, y_label in (("completion_tokens_mean", "Completion length per turn", "tokens"),
                                ("invalid", "Parse-failure rate", "fraction of turns"),
                                ("tool_valid", "Valid tool calls", "fraction")):
        series = [Series(a, xs, run.series("agents", a, key), color=colour(i), attrs={"agent": a})
                  for i, a in enumerate(run.agents)]
        if any(y is not None for s in series for y in s.ys):
            charts.append(line_chart(series, title, y_label))
    return charts


def _header(run: RunData) -> str:
    method = run.config.get("credit", {}).get("method", "?")
    facts = [f"<span><b>credit</b> {escape(method)}</span>",
             f"<span><b>topology</b> {escape(str(run.config.get('topology', {}).get('kind', '?')))}</span>",
             f"<span><b>agents</b> {escape(', '.join(run.agents))}</span>",
             f"<span><b>steps</b> {len(run.steps)}</span>",
             f"<span><b>training time</b> {duration(wall_seconds(run))}</span>"]
    for when in ("before", "after"):
        if when in run.evals:
            facts.append(f"<span><b>held-out {when} training</b> {escape(eval_summary(run.evals[when]))}</span>")
    if run.skipped_lines:
        facts.append(f'<span class="tag bad">{run.skipped_lines} unreadable log lines skipped</span>')
    return (f"<h1>mas report: {escape(run.name)}</h1><div class=\"muted\">{escape(str(run.config.get('team', {}).get('description', '')))}</div>"
            f'<div class="facts">{"".join(facts)}</div>')


def render_report(run: RunData) -> str:
    curves = (
        '<div class="grid">' + _reward_chart(run) + _share_chart(run) + _advantage_chart(run) + _range_chart(run)
        + _timing_chart(run) + "".join(_agent_charts(run)) + "</div>"
        + "<h3>Per policy</h3>" + '<div class="grid">' + "".join(_policy_charts(run)) + "</div>"
    )
    if not run.steps:
        curves = '<p class="note">No training steps were recorded yet.</p>'
    sections = [
        ("agents", "Who earned the reward", agent_table(run)),
        ("curves", "Curves", curves),
        ("episodes", "Episode browser", episode_browser(run.episodes, run.agents)),
        ("checklist", "Reporting checklist", checklist_table(run)),
    ]
    return _page(f"mas report: {run.name}", _header(run), sections)


# --- several runs ----------------------------------------------------------------------------


def _tail_mean(ys: list[float | None], tail: float = 0.1) -> float | None:
    vals = [y for y in ys if y is not None]
    if not vals:
        return None
    return statistics.fmean(vals[int(len(vals) * (1 - tail)):] or vals[-1:])


def render_compare(runs: list[RunData]) -> str:
    """Curves of several runs on the same axes: one colour per run, one dash pattern per agent."""
    longest = max((len(r.steps) for r in runs), default=0)
    smooth = _smooth(longest)
    team = [Series(r.name, r.step_numbers, r.series("reward", "team"), color=colour(i), width=2.4, attrs={"run": r.name})
            for i, r in enumerate(runs)]
    agents = list(dict.fromkeys(a for r in runs for a in r.agents))
    per_agent, shares = [], []
    for i, r in enumerate(runs):
        for j, a in enumerate(agents):
            if a not in r.agents:
                continue
            attrs = {"run": r.name, "agent": a}
            dash = DASHES[j % len(DASHES)]
            per_agent.append(Series(f"{r.name} · {a}", r.step_numbers, r.series("agents", a, "reward"), color=colour(i), dash=dash, attrs=attrs))
            shares.append(Series(f"{r.name} · {a}", r.step_numbers, r.series("agents", a, "credit_share"), color=colour(i), dash=dash, attrs=attrs))
    times = [Series(r.name, r.step_numbers, r.series("time", "step"), color=colour(i), attrs={"run": r.name}) for i, r in enumerate(runs)]
    charts = ('<div class="grid">'
              + line_chart(team, "Team reward", "reward", smooth=smooth)
              + line_chart(per_agent, "Reward per agent", "reward", smooth=smooth, note="Colour: run; dash pattern: agent.")
              + line_chart(shares, "Credit share per agent", "share of positive credit", y_range=(0.0, 1.0), smooth=smooth,
                           note="Colour: run; dash pattern: agent.")
              + line_chart(times, "Step wall time", "seconds")
              + "</div>")
    rows = []
    for i, r in enumerate(runs):
        before = eval_summary(r.evals["before"]) if "before" in r.evals else "—"
        after = eval_summary(r.evals["after"]) if "after" in r.evals else "—"
        final = _tail_mean(r.series("reward", "team"))
        rows.append(
            f'<tr><th><span style="color:{colour(i)}">■</span> {escape(r.name)}</th><td>{escape(str(r.path))}</td>'
            f"<td>{escape(str(r.config.get('credit', {}).get('method', '?')))}</td><td>{len(r.steps)}</td>"
            f"<td>{fmt(final) if final is not None else '—'}</td>"
            f"<td>{escape(before)} → {escape(after)}</td>"
            f"<td>{duration(wall_seconds(r))}</td></tr>"
        )
    table = ('<table class="runs"><tr><th>run</th><th>directory</th><th>credit</th><th>steps</th>'
             "<th>team reward (last 10% of steps)</th><th>held-out: before → after training</th><th>training time</th></tr>"
             + "".join(rows) + "</table>")
    header = f"<h1>mas report: {len(runs)} runs compared</h1>"
    return _page("mas report: comparison", header, [("runs", "Runs", table), ("curves", "Curves", charts)])
