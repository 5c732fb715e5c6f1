"""study.html: one self-contained page with the study's curves, table, frontier and checklist.

Rendered from ``analysis.analyse``'s dict with a Jinja2 template (``templates/study.html.j2``,
autoescaped: config paths, method names and notes are text, never markup).  The curves are the
report's inline SVG line charts (``mas.report.charts``) with a ±1 std band per method; the
frontier is an inline SVG scatter drawn here.  No scripts, fonts or files from anywhere else.

The scaling view (``templates/scaling.html.j2``, on every study page): steps to the
baseline's final accuracy, extra generated tokens and credit time per step against the team
size N, one line per method (inline SVG drawn here, sizes evenly spaced), with the per-agent
signal at step 0 and the cost per size in tables.  A study over team sizes gets its own page
(``templates/sizes.html.j2``): the scaling view over every size, and a link to each size's
study page.
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


def y_grid(yt: list[float], py, x_left: float, x_right: float) -> list[str]:
    """A chart's horizontal grid lines at ticks ``yt``, each labelled at the left (``py``: value -> y)."""
    step = yt[1] - yt[0] if len(yt) > 1 else 0.0
    out = []
    for t in yt:
        out.append(f'<line class="grid" x1="{x_left}" x2="{x_right}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>')
        out.append(f'<text class="tick" x="{x_left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{tick_label(t, step)}</text>')
    return out


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
    body += y_grid(yt, py, left, width - right)
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


def scaling_chart(scaling: dict, title: str, y_label: str, value, note: str, ci=None, hollow=None,
                  chart_id: str = "", width: int = 460, height: int = 280) -> str:
    """One value per (method, team size) against N: a line per method through its sizes, a marker
    per point (hollow where ``hollow(point)``), a whisker where ``ci(point)`` gives (low, high)."""
    sizes, methods = scaling["sizes"], list(scaling["points"])
    marks = [(i, m, p, value(p)) for i, m in enumerate(methods) for p in scaling["points"][m] if value(p) is not None]
    if not marks:
        return f'<figure class="card empty"><figcaption>{escape(title)}</figcaption><p class="note">no finished runs yet</p></figure>'
    left, right, top, bottom = 60, 16, 14, 40
    ys = [v for *_, v in marks] + [y for _, _, p, _ in marks if ci and ci(p) for y in ci(p) if y is not None] + [0.0]
    y0, y1 = min(ys), max(ys)
    y1 = y1 if y1 > y0 else y0 + 1.0
    yt = nice_ticks(y0, y1 + (y1 - y0) * 0.05)
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])
    slot = (width - left - right) / max(len(sizes), 1)
    px = lambda n, i: left + slot * (sizes.index(n) + 0.5) + (i - (len(methods) - 1) / 2) * 7  # noqa: E731  (methods side by side)
    py = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    body = []
    body += y_grid(yt, py, left, width - right)
    for n in sizes:
        body.append(f'<text class="tick" x="{left + slot * (sizes.index(n) + 0.5):.1f}" y="{height - bottom + 16}" '
                    f'text-anchor="middle">N = {n}</text>')
    body.append(f'<line class="axis" x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}"/>')
    body.append(f'<text class="label" x="{(left + width - right) / 2:.0f}" y="{height - 4}" text-anchor="middle">team size N</text>')
    body.append(f'<text class="label" transform="translate(14 {(top + height - bottom) / 2:.0f}) rotate(-90)" '
                f'text-anchor="middle">{escape(y_label)}</text>')
    for i, m in enumerate(methods):
        c = colour(i)
        pts = [(p, v) for j, mm, p, v in marks if mm == m]
        if len(pts) > 1:
            line = " ".join(f"{px(p['n'], i):.1f},{py(v):.1f}" for p, v in pts)
            body.append(f'<polyline class="series" data-method="{escape(m)}" points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
        for p, v in pts:
            x = px(p["n"], i)
            bounds = ci(p) if ci else None
            if bounds and None not in bounds:
                body.append(f'<line class="whisker" data-method="{escape(m)}" x1="{x:.1f}" x2="{x:.1f}" y1="{py(bounds[0]):.1f}" '
                            f'y2="{py(bounds[1]):.1f}" stroke="{c}" stroke-width="1.5"/>')
            open_ = bool(hollow and hollow(p))
            tip = f"{m} · N = {p['n']}: {fmt(v)}" + (f" [{fmt(bounds[0])}, {fmt(bounds[1])}]" if bounds and None not in bounds else "")
            body.append(f'<circle class="point" data-method="{escape(m)}" data-n="{p["n"]}" cx="{x:.1f}" cy="{py(v):.1f}" r="5" '
                        f'fill="{"#fff" if open_ else c}" stroke="{c}" stroke-width="2"><title>{escape(tip)}</title></circle>')
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    svg = (f'<svg class="chart scaling"{ident} viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(title)}">{"".join(body)}</svg>')
    legend = "".join(f'<span class="legend-item"><svg width="14" height="10"><rect width="14" height="10" fill="{colour(i)}"/></svg>'
                     f'{escape(m)}</span>' for i, m in enumerate(methods))
    return (f'<figure class="card"><figcaption>{escape(title)}</figcaption>{svg}<div class="legend">{legend}</div>'
            f'<p class="note">{escape(note)}</p></figure>')


def scaling_charts(scaling: dict, metric: str) -> list[str]:
    """The scaling view's charts: steps to the baseline's final, the gain, extra tokens, credit time."""
    base = scaling["baseline"]
    steps = scaling_chart(
        scaling, f"steps to {base}'s final held-out {metric}, against team size", "training steps",
        lambda p: p["steps_to_target"]["mean"],
        f"the first evaluation at which a seed reaches {base}'s mean final {metric} at that size; mean over seeds, whiskers "
        "a bootstrap 95% CI; hollow: some seeds never reached it and count at the steps they ran (a lower bound)",
        ci=lambda p: p["steps_to_target"]["ci95"], hollow=lambda p: p["steps_to_target"]["reached"] < p["steps_to_target"]["seeds"],
        chart_id="scaling-steps")
    gain = scaling_chart(
        scaling, f"held-out {metric} gained in training, against team size", "points (final − start of RL, after the warm-up where there is one)",
        lambda p: None if p["gain"]["mean"] is None else 100 * p["gain"]["mean"],
        "each seed's last evaluation minus its evaluation at the start of RL (after the format warm-up where there is one); mean over seeds, whiskers a bootstrap 95% CI. "
        "Where the baseline does not improve, every method reaches its final at step 0 and this tells them apart",
        ci=lambda p: [None if v is None else 100 * v for v in p["gain"]["ci95"]], chart_id="scaling-gain")
    tokens = scaling_chart(
        scaling, "credit's extra generated tokens, against team size", "% of the rollouts' tokens",
        lambda p: 100 * p["extra_compute"],
        "what the credit method generates beyond its rollouts: C3's context-matched replays, SHARP's re-sampled synthesiser, "
        "CCPO's removal runs. SHARP with every agent a player generates nothing: its coalitions cost time (next chart)",
        chart_id="scaling-tokens")
    seconds = scaling_chart(
        scaling, "credit time per training step, against team size", "seconds per step",
        lambda p: p["credit_seconds_per_step"],
        "the credit phase's wall time per step (its re-runs through the engine and the credit itself), measured on this machine",
        chart_id="scaling-seconds")
    return [steps, gain, tokens, seconds]


def scaling_rows(scaling: dict) -> dict[str, Any]:
    """The scaling view's tables as display strings: per method, one cell per team size."""
    sizes = scaling["sizes"]
    signal, cost = [], []
    for m, pts in scaling["points"].items():
        by_n = {p["n"]: p for p in pts}
        cells, costs = [], []
        for n in sizes:
            p = by_n.get(n)
            if p is None:
                why = scaling["not_applicable"].get(str(n), {}).get(m)
                cells.append("does not apply" if why else "—")
                costs.append("does not apply" if why else "—")
                continue
            sig = p["signal"]
            text = "—" if sig["mean"] is None else f"{sig['mean']:.2f}"
            if sig["mean"] is not None and sig["min"] != sig["max"]:
                text += f" ({sig['min']:.2f} to {sig['max']:.2f})"
            if sig["undefined"]:
                text += f"; {sig['undefined']} undefined"
            cells.append(text)
            line = (f"+{100 * p['extra_compute']:.0f}% tokens ({p['credit_tokens_per_step']:,.0f} per step), "
                    f"{p['credit_seconds_per_step']:.2f} s per step, {p['reruns_per_episode']:.1f} re-runs per episode")
            costs.append(line + (f"; {p['planned']}" if p["planned"] else ""))
        signal.append({"method": m, "cells": cells})
        cost.append({"method": m, "cells": costs})
    skipped = [{"n": n, "method": m, "why": why} for n, d in sorted(scaling["not_applicable"].items(), key=lambda kv: int(kv[0]))
               for m, why in d.items()]
    return {"sizes": sizes, "signal": signal, "cost": cost, "skipped": skipped, "baseline": scaling["baseline"]}


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
            "verified": _verified_text(r.get("verified") or {}),
            "lead": "—" if r.get("ceiling_lead_share") is None else f"{100 * r['ceiling_lead_share']:.0f}%",
        })
    return rows


def decoding_rows(study: dict) -> list[dict[str, str]]:
    """Per method, every decoding at the start and at the end (mean over seeds), the training-vs-held-out
    gap, and the paired difference from the baseline with whether it is inside the noise."""
    def pair(a, b):
        return "—" if a is None and b is None else f"{_num(a)} → {_num(b)}"

    rows = []
    for r in study["table"]:
        d = r.get("decodings") or {}
        start, final = d.get("start") or {}, d.get("final") or {}
        p = r.get("paired")
        if p is None:
            paired = "(baseline)" if r["method"] == study["baseline"] else "—"
        else:
            paired = (f"{100 * p['mean']:+.1f} points [{100 * p['ci95'][0]:+.1f}, {100 * p['ci95'][1]:+.1f}], "
                      f"{p['seeds']} seeds" + ("; inside the noise" if p["inside_noise"] else "; outside the noise"))
        greedy = pair(start.get("greedy"), final.get("greedy"))
        if (d.get("before_warmup") or {}).get("greedy") is not None and greedy != "—":  # before -> after warm-up -> after RL
            greedy = f"{_num(d['before_warmup']['greedy'])} → warm-up {greedy}"
        rows.append({"method": r["method"], "greedy": greedy,
                     "sampled": pair(start.get("sampled"), final.get("sampled")),
                     "pass": pair(start.get("pass"), final.get("pass")),
                     "train": pair(start.get("train"), final.get("train")),
                     "gap": "—" if final.get("gap") is None else
                     f"{100 * (start.get('gap') or 0.0):+.1f} → {100 * final['gap']:+.1f} points",
                     "paired": paired})
    return rows


def noise_text(study: dict) -> str:
    """The noise floor in words (``analysis.noise_floor``)."""
    floor = study.get("noise_floor") or {}
    if not floor:
        return "not measured (the baseline's runs evaluate their start twice: trainer.eval_noise)"
    names = {"greedy": "greedy", "sampled": "sampled avg@k", "pass": "pass@k"}
    return "; ".join(f"{names[k]} ±{100 * v['max']:.1f} points (largest of {v['seeds']} seeds, mean {100 * v['mean']:.1f})"
                     for k, v in floor.items())


def _verified_text(v: dict) -> str:
    """The team's verified accuracy, before -> final ('—' where no verifier scored)."""
    if "final" not in v:
        return "—"
    before = f"{v['before']['team']:.3f} → " if "before" in v else ""
    names = v["final"].get("team_agents")  # the agents scored at both times (older study.json: absent)
    only = f" ({', '.join(names)} only: the others were not verified before training)" \
        if names and len(names) < len(v["final"]["agents"]) else ""
    return before + f"{v['final']['team']:.3f}" + only


def verified_rows(study: dict) -> dict[str, Any]:
    """Per method and agent, the held-out verified accuracy before -> final (empty without a verifier)."""
    agents = sorted({a for r in study["table"] for when in ("before", "final")
                     for a in ((r.get("verified") or {}).get(when) or {}).get("agents", {})})
    rows = []
    for r in study["table"]:
        v = r.get("verified") or {}
        cells = []
        for a in agents:
            before = ((v.get("before") or {}).get("agents") or {}).get(a)
            final = ((v.get("final") or {}).get("agents") or {}).get(a)
            cells.append("—" if final is None else (f"{before:.3f} → " if before is not None else "") + f"{final:.3f}")
        rows.append({"method": r["method"], "cells": cells})
    return {"agents": agents, "rows": rows if agents else []}


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
        has_lead=any(r.get("ceiling_lead_share") is not None for r in study["table"]),
        baseline_final=_num(study["baseline_final"]),
        scaling_charts=[Markup(c) for c in scaling_charts(study["scaling"], study["metric"])],
        scaling=scaling_rows(study["scaling"]),
        metric=study["metric"],
        verified=verified_rows(study),
        decodings=decoding_rows(study),
        noise=noise_text(study),
    )


def render_sizes(result: dict) -> str:
    """The HTML of a study over team sizes: the scaling view and a row per size."""
    sizes = []
    for size in result["sizes"]:
        st = size["study"]
        sizes.append({"n": size["n"], "config": size["config"], "page": f"{size['dir']}/study.html",
                      "baseline": st["baseline"], "baseline_final": _num(st["baseline_final"]),
                      "finals": ", ".join(f"{r['method']} {_num(r['final_mean'])}" for r in st["table"]) or "no runs yet"})
    return _ENV.get_template("sizes.html.j2").render(
        spec=result["spec"], metric=result["metric"], sizes=sizes,
        scaling_charts=[Markup(c) for c in scaling_charts(result["scaling"], result["metric"])],
        scaling=scaling_rows(result["scaling"]),
    )


def write_study_html(study: dict, path: Path) -> Path:
    path.write_text(render_study(study), encoding="utf-8")
    return path


def write_sizes_html(result: dict, path: Path) -> Path:
    path.write_text(render_sizes(result), encoding="utf-8")
    return path
