"""Inline SVG charts for the HTML report: line charts with optional bands, and stacked areas.

No JavaScript and no external files: every chart is an ``<svg>`` string with its own axes,
ticks and legend.  Hovering a line shows its name (SVG ``<title>``); with few points each
point shows its value too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

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


def fmt(v: float) -> str:
    """Compact number for ticks and tooltips (no "-0")."""
    if v == 0 or abs(v) < 5e-13:
        return "0"
    a = abs(v)
    if a >= 1e4:
        return f"{v:.2e}"
    if a < 1e-3:
        return f"{v:.3g}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.3f}".rstrip("0").rstrip(".")


def tick_label(v: float, step: float) -> str:
    """A tick value with as many decimals as the tick spacing needs (5.675, 5.680 — not 5.68 twice)."""
    if step <= 0 or abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3 and step < 1e-3):
        return fmt(v)
    e = math.floor(math.log10(step) + 1e-9)
    mantissa = round(step / 10**e, 6)  # 1, 2, 2.5 or 5 (nice_ticks); 2.5 needs one more decimal
    decimals = min(8, max(0, -e + (0 if mantissa in (1, 2, 5) else 1)))
    return f"{v:.{decimals}f}" if abs(v) > step * 1e-6 else "0"


def _attrs(d: dict[str, str]) -> str:
    return "".join(f' data-{escape(k)}="{escape(str(v))}"' for k, v in d.items())


class _Frame:
    """Maps data to pixels and draws axes, grid and tick labels."""

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

    def axes(self, x_label: str, y_label: str) -> list[str]:
        out = []
        step = self.yticks[1] - self.yticks[0] if len(self.yticks) > 1 else 0.0
        for t in self.yticks:
            y = self.py(t)
            out.append(f'<line class="grid" x1="{self.pl}" x2="{self.pr}" y1="{y:.1f}" y2="{y:.1f}"/>')
            out.append(f'<text class="tick" x="{self.pl - 6}" y="{y + 4:.1f}" text-anchor="end">{tick_label(t, step)}</text>')
        for t in nice_ticks(self.x0, self.x1, 6, integer=self.integer_x):
            x = self.px(t)
            out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{self.pb}" y2="{self.pb + 4}"/>')
            out.append(f'<text class="tick" x="{x:.1f}" y="{self.pb + 16}" text-anchor="middle">{fmt(t)}</text>')
        out.append(f'<line class="axis" x1="{self.pl}" x2="{self.pr}" y1="{self.pb}" y2="{self.pb}"/>')
        out.append(f'<line class="axis" x1="{self.pl}" x2="{self.pl}" y1="{self.pt}" y2="{self.pb}"/>')
        out.append(f'<text class="label" x="{(self.pl + self.pr) / 2:.0f}" y="{self.h - 4}" text-anchor="middle">{escape(x_label)}</text>')
        out.append(f'<text class="label" transform="translate(12 {(self.pt + self.pb) / 2:.0f}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
        return out


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


def _legend(series: list[Series]) -> str:
    items = []
    for s in series:
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        swatch = (f'<svg width="22" height="10" aria-hidden="true"><line x1="1" x2="21" y1="5" y2="5" stroke="{s.color}" '
                  f'stroke-width="2.5"{dash}/></svg>')
        items.append(f'<span class="legend-item"{_attrs(s.attrs)}>{swatch}{escape(s.name)}</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def line_chart(series: list[Series], title: str, y_label: str, x_label: str = "step",
               y_range: tuple[float, float] | None = None, smooth: float | None = None,
               width: int = WIDTH, height: int = HEIGHT, note: str = "") -> str:
    """A titled SVG line chart with a legend.  ``smooth``: EMA weight of each new point; the raw
    line is drawn faintly behind the smoothed one."""
    series = [s for s in series if any(y is not None for y in s.ys)]
    if not series:
        return _empty(title, "no data recorded")
    xs = [x for s in series for x in s.xs]
    ys = [y for s in series for y in s.ys if y is not None]
    for s in series:
        if s.band:
            ys += [y for y in s.band[0] + s.band[1] if y is not None]
    f = _Frame(xs, ys, y_range, width, height)
    body = f.axes(x_label, y_label)
    for s in series:
        body += _band(f, s) if s.band else []
    for s in series:
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        drawn = ema(s.ys, smooth) if smooth else s.ys
        if smooth:
            for seg in _segments(s.xs, s.ys):
                body.append(_path(f, seg, s.color, 1.0, dash, 'class="raw"'))
        for seg in _segments(s.xs, drawn):
            body.append(_path(f, seg, s.color, s.width, dash, f'class="series"{_attrs(s.attrs)}', s.name))
        if len(s.xs) <= POINTS_WITH_TOOLTIPS:
            for x, y in zip(s.xs, s.ys):
                if y is not None and math.isfinite(y):
                    body.append(f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="2.5" fill="{s.color}">'
                                f'<title>{escape(s.name)} · step {fmt(x)}: {fmt(y)}</title></circle>')
    svg = (f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(title)}">{"".join(body)}</svg>')
    return _card(title, svg + _legend(series), note)


def stacked_chart(series: list[Series], title: str, y_label: str, x_label: str = "step",
                  width: int = WIDTH, height: int = HEIGHT, note: str = "") -> str:
    """Stacked areas (e.g. the parts of a step's wall time); ``series`` share their xs."""
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
    body = f.axes(x_label, y_label)
    for s, low, high in layers:
        upper = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in zip(xs, high))
        lower = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in reversed(list(zip(xs, low))))
        body.append(f'<polygon points="{upper} {lower}" fill="{s.color}" fill-opacity="0.75" stroke="{s.color}" '
                    f'stroke-width="0.5" class="series"{_attrs(s.attrs)}><title>{escape(s.name)}</title></polygon>')
    svg = (f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(title)}">{"".join(body)}</svg>')
    return _card(title, svg + _legend(series), note)


def _band(f: _Frame, s: Series) -> list[str]:
    xs, (lo, hi) = s.xs, s.band
    if len(xs) > MAX_POINTS:
        _, lo = _decimate(xs, lo)
        xs, hi = _decimate(xs, hi)
    pts = [(x, a, b) for x, a, b in zip(xs, lo, hi) if a is not None and b is not None]
    if len(pts) < 2:
        return []
    upper = " ".join(f"{f.px(x):.1f},{f.py(b):.1f}" for x, _, b in pts)
    lower = " ".join(f"{f.px(x):.1f},{f.py(a):.1f}" for x, a, _ in reversed(pts))
    return [f'<polygon class="band" points="{upper} {lower}" fill="{s.color}" fill-opacity="0.15" stroke="none"/>']


def _path(f: _Frame, seg: list[tuple[float, float]], color: str, width: float, dash: str, extra: str, name: str = "") -> str:
    d = "M" + " L".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in seg)
    if len(seg) == 1:  # a single point: draw a dot-length line so it shows
        x, y = f.px(seg[0][0]), f.py(seg[0][1])
        d = f"M{x - 1.5:.1f},{y:.1f} L{x + 1.5:.1f},{y:.1f}"
    title = f"<title>{escape(name)}</title>" if name else ""
    opacity = ' stroke-opacity="0.25"' if 'class="raw"' in extra else ""
    return f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{width}"{dash}{opacity} {extra}>{title}</path>'


def _card(title: str, content: str, note: str) -> str:
    note_html = f'<p class="note">{escape(note)}</p>' if note else ""
    return f'<figure class="card"><figcaption>{escape(title)}</figcaption>{content}{note_html}</figure>'


def _empty(title: str, why: str) -> str:
    return f'<figure class="card empty"><figcaption>{escape(title)}</figcaption><p class="note">{escape(why)}</p></figure>'
