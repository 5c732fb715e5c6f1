"""Inline SVG charts for the HTML report: line charts with optional bands, and stacked areas.

No external files: every chart is an ``<svg>`` with its own axes, ticks and legend, drawn by
``templates/chart.html.j2`` from the geometry computed here.  Hovering a line shows its name
(SVG ``<title>``); with few points each point shows its value too.  A line chart's legend
entries are buttons: with ``toggle.js`` on the page (``templates/toggle.html.j2``), clicking
one hides or shows that curve.  The charts are ``str`` (``render.Html``: templates embed them
as they are), with names and titles escaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mas.report.render import Html, macro
from mas.report.render import number as fmt

__all__ = ["DASHES", "HEIGHT", "MARGIN", "MAX_POINTS", "PALETTE", "POINTS_WITH_TOOLTIPS", "WIDTH", "Series", "colour",
           "ema", "fmt", "line_chart", "nice_ticks", "stacked_chart", "tick_label"]

# colour-blind-safe categorical palette (Okabe & Ito, 2008), then darker variants
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
           "#004B75", "#9A6B00", "#006B4F", "#8A4F71")
DASHES = ("", "6 3", "2 3", "8 3 2 3", "1 2")

WIDTH, HEIGHT = 460, 240
MARGIN = {"left": 56, "right": 12, "top": 12, "bottom": 34}
POINTS_WITH_TOOLTIPS = 60  # up to this many points per series, each point gets a value tooltip
MAX_POINTS = 400  # longer series are drawn through this many evenly spaced points (after smoothing)


@dataclass
class Series:
    name: str
    xs: list[float]
    ys: list[float | None]  # None: no value at that step (gap)
    color: str = PALETTE[0]
    dash: str = ""
    width: float = 2.0
    band: tuple[list[float | None], list[float | None]] | None = None  # (low, high) shaded around the line
    attrs: dict[str, str] = field(default_factory=dict)  # data-* attributes, e.g. {"run": "a", "agent": "solver"}


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def ema(ys: list[float | None], alpha: float) -> list[float | None]:
    """Exponential moving average that skips gaps (a gap stays a gap)."""
    out: list[float | None] = []
    acc: float | None = None
    for y in ys:
        if y is None:
            out.append(None)
            continue
        acc = y if acc is None else alpha * y + (1 - alpha) * acc
        out.append(acc)
    return out


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (whole numbers only with ``integer``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = max(next(m * mag for m in steps if m * mag >= raw), 1.0 if integer else 0.0)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks or [lo]


def tick_label(v: float, step: float) -> str:
    """A tick value with as many decimals as the tick spacing needs (5.675, 5.680 — not 5.68 twice)."""
    if step <= 0 or abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3 and step < 1e-3):
        return fmt(v)
    e = math.floor(math.log10(step) + 1e-9)
    mantissa = round(step / 10**e, 6)  # 1, 2, 2.5 or 5 (nice_ticks); 2.5 needs one more decimal
    decimals = min(8, max(0, -e + (0 if mantissa in (1, 2, 5) else 1)))
    return f"{v:.{decimals}f}" if abs(v) > step * 1e-6 else "0"


def _px(v: float) -> str:
    return f"{v:.1f}"


class _Frame:
    """Maps data to pixels; ``view`` is what the template needs to draw axes, grid and ticks."""

    def __init__(self, xs: list[float], ys: list[float], y_range: tuple[float, float] | None, width: int, height: int):
        self.w, self.h = width, height
        self.integer_x = all(float(x).is_integer() for x in xs)  # steps: no ticks at 2.5
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 0.5, self.x1 + 0.5
        if y_range is not None:
            self.y0, self.y1 = y_range
        else:
            finite = [y for y in ys if y is not None and math.isfinite(y)]
            self.y0, self.y1 = (min(finite), max(finite)) if finite else (0.0, 1.0)
            pad = (self.y1 - self.y0) * 0.05 or (abs(self.y0) * 0.1 if self.y0 else 0.5)  # a constant line sits mid-chart
            self.y0, self.y1 = self.y0 - pad, self.y1 + pad
        self.yticks = nice_ticks(self.y0, self.y1)
        self.y0, self.y1 = min(self.y0, self.yticks[0]), max(self.y1, self.yticks[-1])
        self.pl, self.pr = MARGIN["left"], width - MARGIN["right"]
        self.pt, self.pb = MARGIN["top"], height - MARGIN["bottom"]

    def px(self, x: float) -> float:
        return self.pl + (x - self.x0) / (self.x1 - self.x0) * (self.pr - self.pl)

    def py(self, y: float) -> float:
        y = min(max(y, self.y0), self.y1)
        return self.pb - (y - self.y0) / (self.y1 - self.y0) * (self.pb - self.pt)

    def view(self, x_label: str, y_label: str) -> dict[str, Any]:
        step = self.yticks[1] - self.yticks[0] if len(self.yticks) > 1 else 0.0
        return {
            "w": self.w, "h": self.h, "pl": self.pl, "pr": self.pr, "pt": self.pt, "pb": self.pb,
            "grid": [(_px(self.py(t)), _px(self.py(t) + 4), tick_label(t, step)) for t in self.yticks],
            "xticks": [(_px(self.px(t)), fmt(t)) for t in nice_ticks(self.x0, self.x1, 6, integer=self.integer_x)],
            "x_mid": f"{(self.pl + self.pr) / 2:.0f}", "y_mid": f"{(self.pt + self.pb) / 2:.0f}",
            "x_label": x_label, "y_label": y_label,
        }


def _decimate(xs: list[float], ys: list, max_points: int = MAX_POINTS) -> tuple[list[float], list]:
    """At most ``max_points`` evenly spaced points (first and last kept): a 400-pixel-wide chart
    shows no more, and the report of a long run stays small."""
    n = len(xs)
    if n <= max_points:
        return xs, ys
    idx = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _segments(xs: list[float], ys: list[float | None]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive points with values (a None breaks the line)."""
    xs, ys = _decimate(xs, ys)
    segs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys):
        if y is None or not math.isfinite(y):
            if segs[-1]:
                segs.append([])
        else:
            segs[-1].append((x, y))
    return [s for s in segs if s]


def _path_d(f: _Frame, seg: list[tuple[float, float]]) -> str:
    if len(seg) == 1:  # a single point: draw a dot-length line so it shows
        x, y = f.px(seg[0][0]), f.py(seg[0][1])
        return f"M{x - 1.5:.1f},{y:.1f} L{x + 1.5:.1f},{y:.1f}"
    return "M" + " L".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in seg)


def _band(f: _Frame, s: Series) -> str | None:
    xs, (lo, hi) = s.xs, s.band
    if len(xs) > MAX_POINTS:
        _, lo = _decimate(xs, lo)
        xs, hi = _decimate(xs, hi)
    pts = [(x, a, b) for x, a, b in zip(xs, lo, hi) if a is not None and b is not None]
    if len(pts) < 2:
        return None
    upper = " ".join(f"{f.px(x):.1f},{f.py(b):.1f}" for x, _, b in pts)
    lower = " ".join(f"{f.px(x):.1f},{f.py(a):.1f}" for x, a, _ in reversed(pts))
    return f"{upper} {lower}"


def line_chart(series: list[Series], title: str, y_label: str, x_label: str = "step",
               y_range: tuple[float, float] | None = None, smooth: float | None = None,
               width: int = WIDTH, height: int = HEIGHT, note: str = "", toggle: bool = True) -> str:
    """A titled SVG line chart with a legend.  ``smooth``: EMA weight of each new point; the raw
    line is drawn faintly behind the smoothed one.  ``toggle``: legend entries are buttons that
    hide and show their curve (on a page that includes ``toggle.html.j2``)."""
    series = [s for s in series if any(y is not None for y in s.ys)]
    if not series:
        return _empty(title, "no data recorded")
    xs = [x for s in series for x in s.xs]
    ys = [y for s in series for y in s.ys if y is not None]
    for s in series:
        if s.band:
            ys += [y for y in s.band[0] + s.band[1] if y is not None]
    f = _Frame(xs, ys, y_range, width, height)
    views = []
    for k, s in enumerate(series):
        drawn = ema(s.ys, smooth) if smooth else s.ys
        points = []
        if len(s.xs) <= POINTS_WITH_TOOLTIPS:
            points = [(_px(f.px(x)), _px(f.py(y)), f"{s.name} · step {fmt(x)}: {fmt(y)}")
                      for x, y in zip(s.xs, s.ys) if y is not None and math.isfinite(y)]
        views.append({
            "k": k, "name": s.name, "color": s.color, "dash": s.dash, "width": s.width, "attrs": s.attrs,
            "band": _band(f, s) if s.band else None,
            "raw": [_path_d(f, seg) for seg in _segments(s.xs, s.ys)] if smooth else [],
            "paths": [_path_d(f, seg) for seg in _segments(s.xs, drawn)],
            "points": points,
        })
    return macro("chart.html.j2", "line")(f.view(x_label, y_label), views, title, note, toggle)


def stacked_chart(series: list[Series], title: str, y_label: str, x_label: str = "step",
                  width: int = WIDTH, height: int = HEIGHT, note: str = "") -> str:
    """Stacked areas (e.g. the parts of a step's wall time); ``series`` share their xs.  The
    legend does not toggle: hiding a layer would shift every layer above it."""
    series = [s for s in series if any((y or 0) > 0 for y in s.ys)]
    if not series:
        return _empty(title, "no data recorded")
    xs = _decimate(series[0].xs, series[0].ys)[0]
    tops = [0.0] * len(xs)
    layers = []
    for s in series:
        low = list(tops)
        tops = [t + (y or 0.0) for t, y in zip(tops, _decimate(s.xs, s.ys)[1])]
        layers.append((s, low, list(tops)))
    f = _Frame(xs, [0.0, max(tops)], (0.0, max(tops) * 1.05 or 1.0), width, height)
    views = []
    for k, (s, low, high) in enumerate(layers):
        upper = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in zip(xs, high))
        lower = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in reversed(list(zip(xs, low))))
        views.append({"k": k, "name": s.name, "color": s.color, "dash": "", "attrs": s.attrs, "points": f"{upper} {lower}"})
    return macro("chart.html.j2", "stacked")(f.view(x_label, y_label), views, title, note)


def _empty(title: str, why: str) -> Html:
    return macro("chart.html.j2", "empty")(title, why)
