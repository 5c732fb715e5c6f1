"""study.html: one self-contained page with the study's curves, table, frontier and checklist.

Rendered from ``analysis.analyse``'s dict with a Jinja2 template (``templates/study.html.j2``,
autoescaped: config paths, method names and notes are text, never markup).  The curves are the
report's inline SVG line charts (``mas.report.charts``) with a ±1 std band per method; the
frontier is an inline SVG scatter drawn here.  No scripts, fonts or files from anywhere else.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader
from markupsafe import Markup

from mas.report.charts import Series, colour, fmt, line_chart, nice_ticks, tick_label

AXIS_LABELS = {"steps": "training steps", "tokens": "generated tokens (thousands; credit generations included)",
               "seconds": "training wall time (s)"}
AXIS_TITLES = {"steps": "against steps", "tokens": "against generated tokens", "seconds": "against wall time"}
AXIS_SCALE = {"steps": 1.0, "tokens": 1e-3, "seconds": 1.0}

_ENV = Environment(loader=PackageLoader("mas.study", "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True)


def curve_chart(study: dict, axis: str) -> str:
    """Held-out metric per method against ``axis``: mean line and ±1 std band over seeds."""
    series = []
    for i, (method, c) in enumerate(study["curves"][axis].items()):
        xs = [x * AXIS_SCALE[axis] for x in c["x"]]
        lo = [m - s for m, s in zip(c["mean"], c["std"])]
        hi = [m + s for m, s in zip(c["mean"], c["std"])]
        series.append(Series(name=method, xs=xs, ys=list(c["mean"]), color=colour(i), band=(lo, hi), attrs={"method": method}))
    note = "mean over seeds, band ±1 std"
    if axis != "steps":
        note += "; each seed interpolated onto shared points, up to the shortest seed"
    return line_chart(series, f"held-out {study['metric']} {AXIS_TITLES[axis]}", study["metric"], AXIS_LABELS[axis], note=note)


def frontier_chart(study: dict, width: int = 560, height: int = 320) -> str:
    """Credit efficiency frontier: gain over the baseline (points) against extra compute (%)."""
    pts = [(p["method"], 100 * p["extra_compute"], 100 * p["gain"]) for p in study["frontier"] if p["gain"] is not None]
    title = f"credit efficiency frontier (baseline: {study['baseline']})"
    if not pts:
        return f'<figure class="card empty"><figcaption>{escape(title)}</figcaption><p class="note">no finished runs yet</p></figure>'
    left, right, top, bottom = 60, 90, 14, 40  # room on the right for the method labels
    xs, ys = [0.0] + [p[1] for p in pts], [0.0] + [p[2] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    x1 = x1 if x1 > x0 else x0 + 1.0
    pad = (y1 - y0) * 0.1 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    xt, yt = nice_ticks(x0, x1 + (x1 - x0) * 0.05), nice_ticks(y0, y1)
    x0, x1, y0, y1 = min(x0, xt[0]), max(x1, xt[-1]), min(y0, yt[0]), max(y1, yt[-1])
    px = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    py = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    body = []
    ystep = yt[1] - yt[0] if len(yt) > 1 else 0.0
    for t in yt:
        body.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>')
        body.append(f'<text class="tick" x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{tick_label(t, ystep)}</text>')
    for t in xt:
        body.append(f'<text class="tick" x="{px(t):.1f}" y="{height - bottom + 16}" text-anchor="middle">{fmt(t)}</text>')
    body.append(f'<line class="axis zero" x1="{left}" x2="{width - right}" y1="{py(0):.1f}" y2="{py(0):.1f}"/>')
    body.append(f'<line class="axis" x1="{px(0):.1f}" x2="{px(0):.1f}" y1="{top}" y2="{height - bottom}"/>')
    body.append(f'<text class="label" x="{(left + width - right) / 2:.0f}" y="{height - 6}" text-anchor="middle">'
                f'extra generated tokens over the rollouts (%)</text>')
    body.append(f'<text class="label" transform="translate(14 {(top + height - bottom) / 2:.0f}) rotate(-90)" '
                f'text-anchor="middle">gain over {escape(study["baseline"])} ({escape(study["metric"])}, points)</text>')
    methods = list(study["curves"]["steps"])
    for name, x, y in pts:
        c = colour(methods.index(name) if name in methods else 0)
        body.append(f'<circle class="point" data-method="{escape(name)}" cx="{px(x):.1f}" cy="{py(y):.1f}" r="6" fill="{c}">'
                    f'<title>{escape(name)}: {fmt(y)} points at +{fmt(x)}% tokens</title></circle>')
        body.append(f'<text class="pt-label" x="{px(x) + 9:.1f}" y="{py(y) + 4:.1f}">{escape(name)}</text>')
    svg = (f'<svg class="chart" id="frontier-svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(title)}">{"".join(body)}</svg>')
    note = ("up and left is better: more accuracy for less extra compute; the baseline sits at (0, 0). "
            "Extra compute counts the credit method's own generations (replays, coalition re-runs, removal runs, critic replies).")
    return f'<figure class="card"><figcaption>{escape(title)}</figcaption>{svg}<p class="note">{escape(note)}</p></figure>'


def _num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def table_rows(study: dict) -> list[dict[str, str]]:
    """The final table as display strings (the template only lays them out)."""
    rows = []
    for r in study["table"]:
        share = r.get("steps_share_of_baseline")
        rows.append({
            "method": r["method"],
            "baseline": r["method"] == study["baseline"],
            "final": f"{_num(r['final_mean'])} ± {_num(r['final_std'])}",
            "ci": f"[{_num(r['ci95'][0])}, {_num(r['ci95'][1])}]",
            "seeds": str(r["seeds"]),
            "steps_to": ("—" if r["steps_to_baseline"] is None else f"{r['steps_to_baseline']:.1f}")
            + f" ({r['reached_baseline']}/{r['seeds']})" + ("" if share is None else f", {100 * share:.0f}% of baseline"),
            "tokens_to": "—" if r["tokens_to_baseline"] is None else f"{r['tokens_to_baseline']:,.0f}",
            "steps": f"{r['steps']:.1f}",
            "tokens": f"{r['tokens']:,.0f}",
            "extra": f"+{100 * r['extra_compute']:.0f}%",
            "time_share": f"{100 * r['credit_time_share']:.0f}%",
        })
    return rows


def render_study(study: dict) -> str:
    """The HTML of study.html."""
    spec = study["spec"]
    charts = [Markup(curve_chart(study, axis)) for axis in ("steps", "tokens", "seconds")]
    return _ENV.get_template("study.html.j2").render(
        spec=spec,
        study=study,
        methods=list(study["curves"]["steps"]),
        charts=charts,
        frontier=Markup(frontier_chart(study)),
        rows=table_rows(study),
        baseline_final=_num(study["baseline_final"]),
    )


def write_study_html(study: dict, path: Path) -> Path:
    path.write_text(render_study(study), encoding="utf-8")
    return path
