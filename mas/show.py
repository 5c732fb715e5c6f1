"""``mas show CONFIG``: the team and its topology as a text graph, and as an SVG picture.

The graph is read from the validated config (who may speak after whom, and on which parsed
label), not from a run, so it shows what the topology allows.

The picture is laid out left to right in columns (a node's column is its distance from
START).  Edges between neighbouring columns are curves through the gap between them; an
edge that skips columns runs in a lane above the nodes of the columns it spans, and an edge
back to an earlier column (a reply, a loop) in a lane below them, so no edge crosses a box
and every label sits on its edge outside the boxes.  Parallel edges between the same two
nodes bend apart so each stays visible with its label.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from html import escape

from mas.config.schema import RunConfig
from mas.report.charts import PALETTE
from mas.topologies import Edge, build_topology, kind_of
from mas.topologies.registry import END, START

def topology_graph(cfg: RunConfig) -> tuple[list[str], list[Edge], dict[str, str]]:
    """(nodes in a readable order, edges, node -> agent) of the config's topology, as its kind draws it."""
    d = kind_of(cfg.topology).drawing(cfg)
    return list(dict.fromkeys(d.nodes)), d.edges, d.agent_of


def short_model(model: str) -> str:
    """A base model's short name: the part after the last '/' of a hub id or a local path."""
    return model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or model


def dtype_text(policy) -> str:
    """A policy's dtype as configured, and for ``auto`` what it loads as on this machine."""
    if policy.dtype != "auto" or policy.backend == "openai":
        return policy.dtype
    from mas.errors import ModelLoadError
    from mas.models.devices import resolve_dtype

    try:
        return f"auto -> {resolve_dtype('auto', policy.device, full=policy.kind == 'full').dtype}"
    except ModelLoadError:  # a device this torch cannot name: validate says so
        return "auto"


def team_text(cfg: RunConfig) -> str:
    """The team, its policies, topology (as an adjacency list), env and credit method."""
    lines = [f"team {cfg.team.name}" + (f": {cfg.team.description}" if cfg.team.description else ""), "", "agents"]
    width = max(len(a.name) for a in cfg.agents)
    for a in cfg.agents:
        p = cfg.policies[a.policy]
        tools = f"  tools {', '.join(a.tools)} (max_tool_calls {a.max_tool_calls})" if a.tools else ""
        lines.append(f"  {a.name:<{width}}  policy {a.policy} ({p.kind}, {p.model})  parser {a.parser}  "
                     f"T={a.sampling.temperature:g} max_new_tokens={a.sampling.max_new_tokens}{tools}")
    lines += ["", "policies"]
    pw = max(len(n) for n in cfg.policies)
    for name, p in cfg.policies.items():
        lr = f"  lr {'default' if p.optim.lr is None else format(p.optim.lr, 'g')}  micro-batch {p.optim.micro_batch_size}" if p.optim else ""
        lines.append(f"  {name:<{pw}}  {p.kind:<6} {p.model}  {dtype_text(p)} on {p.device}{lr}")
    drawing = kind_of(cfg.topology).drawing(cfg)
    nodes, edges, agent_of = list(dict.fromkeys(drawing.nodes)), drawing.edges, drawing.agent_of
    lines += ["", f"topology: {cfg.topology.kind}" + (f" ({drawing.bound})" if drawing.bound else "")]
    shown = {n: n if agent_of.get(n, n) == n else f"{n} [{agent_of[n]}]" for n in nodes}
    nw = max(len(s) for s in shown.values())
    for n in nodes:
        for i, e in enumerate(e for e in edges if e.source == n):
            arrow = f"──{e.label}──▶" if e.label else "──▶"
            lines.append(f"  {(shown[n] if i == 0 else ''):<{nw}}  {arrow} {e.target}")
    if drawing.note:  # what a picture of a team defined in code cannot show
        lines += [f"  ({drawing.note})"]
    method = cfg.credit.method
    lines += ["", f"env: {getattr(cfg.env, 'name', '?')}", f"credit: {method}"]
    return "\n".join(lines)


def topology_mermaid(cfg: RunConfig) -> str | None:
    """LangGraph's own Mermaid drawing of the compiled topology (None for an AutoGen team,
    which is not a LangGraph graph)."""
    compiled = getattr(build_topology(cfg.topology), "graph", None)
    return None if compiled is None else compiled.get_graph().draw_mermaid()


# --- SVG -------------------------------------------------------------------------------------

PAD = 20  # margin around the picture
AGENT_MIN_W = 150  # agent boxes are at least this wide (all agent boxes share one width)
TERMINAL_H = 44  # START, END, majority vote
ROW_GAP = 30  # between boxes of a column
LOOP_ROOM = 52  # above a box with a self-loop: the loop and its label
LOOP_STEP = 20  # more for each further self-loop
GAP_MIN = 90  # between columns
LANE = 22  # between the lanes above/below the nodes
LANE_CLEAR = 26  # from the boxes to the nearest lane
CHANNEL = 12  # between vertical runs in a column gap
LABEL_H = 15
INK = "#555"


def _text_w(s: str, size: float, bold: bool = False) -> float:
    """A generous estimate of a string's width in px (system-ui); boxes, gaps and label patches
    are sized by it."""
    em = sum(0.74 if c.isupper() or c in "mwMW%@" else 0.36 if c in " .,:;!|il'()[]" else 0.6 for c in s)
    return em * size * (1.08 if bold else 1.0)


@dataclass
class _Box:
    name: str
    agent: str | None
    lines: list[tuple[str, str]]  # (text, style) top to bottom
    w: float
    h: float
    col: int = 0
    row: int = 0
    x: float = 0.0
    y: float = 0.0

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    @property
    def right(self) -> float:
        return self.x + self.w

    @property
    def bottom(self) -> float:
        return self.y + self.h


_STYLE = {  # style -> (font size, extra attributes)
    "title": (13, ' font-weight="600"'),
    "policy": (11, ' fill="#555"'),
    "model": (11, ' fill="#222" class="model"'),
    "tools": (10, ' fill="#7a5200" class="tools"'),
    "terminal": (13, ""),
}


def _boxes(cfg: RunConfig, nodes: list[str], agent_of: dict[str, str]) -> dict[str, _Box]:
    """The boxes' text (node, policy, base model, tools) and size."""
    agents = {a.name: a for a in cfg.agents}
    content: dict[str, list[tuple[str, str]]] = {}
    for n in nodes:
        agent = agent_of.get(n)
        if agent is None:  # START, END, majority vote
            content[n] = [(n, "terminal")]
            continue
        a = agents.get(agent)
        pol = cfg.policies.get(a.policy) if a else None
        lines = [(n if agent == n else f"{n}: {agent}", "title")]
        if a is not None and pol is not None:
            lines.append((f"policy {a.policy}" + (" · frozen" if pol.kind == "frozen" else ""), "policy"))
            lines.append((short_model(pol.model), "model"))
            if a.tools:
                lines.append(("tools: " + ", ".join(a.tools), "tools"))
        content[n] = lines
    widest = max((_text_w(t, _STYLE[s][0], s == "title") for n, ls in content.items() if agent_of.get(n) for t, s in ls),
                 default=0)
    agent_w = max(AGENT_MIN_W, widest + 24)
    boxes = {}
    for n, lines in content.items():
        if agent_of.get(n) is None:
            boxes[n] = _Box(n, None, lines, max(90, _text_w(n, 13) + 36), TERMINAL_H)
        else:
            boxes[n] = _Box(n, agent_of[n], lines, agent_w, 19 + 15 * (len(lines) - 1) + 11)
    return boxes


def _layers(nodes: list[str], edges: list[Edge]) -> dict[str, int]:
    """Column of each node: its shortest distance from START; END goes last."""
    depth = {START: 0}
    frontier = [START]
    while frontier:
        nxt = []
        for n in frontier:
            for e in edges:
                if e.source == n and e.target not in depth:
                    depth[e.target] = depth[n] + 1
                    nxt.append(e.target)
        frontier = nxt
    last = max(depth.values(), default=0)
    for n in nodes:
        depth.setdefault(n, last)
    if END in depth:
        depth[END] = max(v for k, v in depth.items() if k != END) + 1
    return depth


Point = tuple[float, float]
Cmd = tuple  # ("M"|"L", p) | ("Q", c, p) | ("C", c1, c2, p)


def _rounded(points: list[Point], r: float = 8) -> list[Cmd]:
    """An orthogonal polyline with rounded corners."""
    pts = [p for i, p in enumerate(points) if i == 0 or p != points[i - 1]]
    cmds: list[Cmd] = [("M", pts[0])]
    for a, b, c in zip(pts, pts[1:], pts[2:]):
        la, lc = abs(b[0] - a[0]) + abs(b[1] - a[1]), abs(c[0] - b[0]) + abs(c[1] - b[1])
        k = min(r, la / 2, lc / 2)
        p1 = (b[0] - k * _sign(b[0] - a[0]), b[1] - k * _sign(b[1] - a[1]))
        p2 = (b[0] + k * _sign(c[0] - b[0]), b[1] + k * _sign(c[1] - b[1]))
        cmds += [("L", p1), ("Q", b, p2)]
    cmds.append(("L", pts[-1]))
    return cmds


def _sign(v: float) -> float:
    return (v > 0) - (v < 0)


@dataclass
class _Drawn:
    edge: Edge
    cmds: list[Cmd]
    label_at: Point | None = None  # centre of the label


def _layout(cfg: RunConfig):
    """Boxes placed in columns and every edge routed: (boxes, drawn edges)."""
    nodes, edges, agent_of = topology_graph(cfg)
    layer = _layers(nodes, edges)
    order = sorted(set(layer.values()))
    boxes = _boxes(cfg, nodes, agent_of)
    columns: list[list[_Box]] = [[] for _ in order]
    for n in nodes:
        b = boxes[n]
        b.col = order.index(layer[n])
        b.row = len(columns[b.col])
        columns[b.col].append(b)
    ncol = len(columns)

    def is_top(b: _Box) -> bool:
        return b.row == 0

    def is_bottom(b: _Box) -> bool:
        return b.row == len(columns[b.col]) - 1

    # classify: self-loop, fwd (to the next column), over (skips columns: a lane above),
    # under (back to an earlier column: a lane below), side (within a column: the gap to its right)
    kind = []
    for e in edges:
        s, t = boxes[e.source], boxes[e.target]
        kind.append("self" if s is t else "fwd" if t.col == s.col + 1 else "over" if t.col > s.col
                    else "side" if t.col == s.col else "under")
    # vertical runs in each gap (gap g lies right of column g): near its left or its right column
    near_left: dict[int, list[int]] = defaultdict(list)
    near_right: dict[int, list[int]] = defaultdict(list)
    gap_label_w: dict[int, float] = defaultdict(float)  # room for the labels of edges to the next column
    side_label_w: dict[int, float] = defaultdict(float)  # room for labels right of the runs
    for i, (e, k) in enumerate(zip(edges, kind)):
        s, t = boxes[e.source], boxes[e.target]
        lw = _text_w(e.label, 11) + 8 if e.label else 0
        if k == "fwd":
            gap_label_w[s.col] = max(gap_label_w[s.col], lw + 56)
        elif k == "side":
            near_left[s.col].append(i)
            side_label_w[s.col] = max(side_label_w[s.col], lw)
        elif k == "over":
            if not is_top(s):
                near_left[s.col].append(i)
            if not is_top(t):
                near_right[t.col - 1].append(i)
        elif k == "under":
            if not is_bottom(s):
                near_left[s.col].append(i)
            if not is_bottom(t):
                near_left[t.col].append(i)
    gap_w = [max(GAP_MIN, gap_label_w[g], 40 + CHANNEL * (len(near_left[g]) + len(near_right[g])),
                 40 + CHANNEL * len(near_left[g]) + side_label_w[g]) for g in range(ncol)]
    col_w = [max(b.w for b in col) for col in columns]
    loops: dict[str, list[int]] = defaultdict(list)  # node -> its self-loops, drawn one above the other
    for i, (e, k) in enumerate(zip(edges, kind)):
        if k == "self":
            loops[e.source].append(i)

    def loop_room(n: str) -> float:
        return LOOP_ROOM + LOOP_STEP * (len(loops[n]) - 1) if loops.get(n) else 0

    row_gap = ROW_GAP + max((loop_room(n) for n in loops), default=0)
    col_h = [sum(b.h for b in col) + row_gap * (len(col) - 1) for col in columns]
    body = max(col_h)
    col_x = [0.0] * ncol
    for g in range(1, ncol):
        col_x[g] = col_x[g - 1] + col_w[g - 1] + gap_w[g - 1]
    for g, col in enumerate(columns):
        y = (body - col_h[g]) / 2
        for b in col:
            b.x, b.y = col_x[g] + (col_w[g] - b.w) / 2, y
            y += b.h + row_gap
    col_top = [min(b.y - loop_room(b.name) for b in col) for col in columns]
    col_bottom = [max(b.bottom for b in col) for col in columns]

    # lanes above (over) and below (under): the nearest free one clear of the spanned columns
    lane: dict[int, float] = {}
    for k, sign in (("over", -1), ("under", 1)):
        todo = [i for i, kk in enumerate(kind) if kk == k]
        span = {i: sorted((boxes[edges[i].source].col, boxes[edges[i].target].col)) for i in todo}
        # nearest lanes first to short spans, and (so that routes nest without crossing) to sources
        # nearest the lane's side of their column
        todo.sort(key=lambda i: (span[i][1] - span[i][0], -sign * boxes[edges[i].source].row, -sign * boxes[edges[i].target].row))
        taken: list[tuple[float, float, float]] = []
        for i in todo:
            lo, hi = span[i]
            x0, x1 = col_x[lo], col_x[hi] + col_w[hi]
            if sign < 0:
                y = min(col_top[lo:hi + 1]) - LANE_CLEAR
            else:
                y = max(col_bottom[lo:hi + 1]) + LANE_CLEAR
            while clash := [ty for a, b, ty in taken if a < x1 and x0 < b and abs(ty - y) < LANE]:
                y = (min(clash) - LANE) if sign < 0 else (max(clash) + LANE)
            taken.append((x0, x1, y))
            lane[i] = y

    # where the lane routes leave and enter boxes: spread along the top/bottom edge, or via a gap run
    ports: dict[tuple[str, str], list[tuple[tuple, int, str]]] = defaultdict(list)
    for i, k in enumerate(kind):
        s, t = boxes[edges[i].source], boxes[edges[i].target]
        if k == "over":
            if is_top(s):
                ports[(s.name, "top")].append(((1, lane[i]), i, "out"))  # outs right of ins, far lanes leftmost
            if is_top(t):
                ports[(t.name, "top")].append(((0, -lane[i]), i, "in"))
        elif k == "under":
            if is_bottom(s):
                ports[(s.name, "bottom")].append(((0, lane[i]), i, "out"))  # outs left of ins, near lanes leftmost
            if is_bottom(t):
                ports[(t.name, "bottom")].append(((1, -lane[i]), i, "in"))
    port_x: dict[tuple[int, str], float] = {}
    for (n, _), users in ports.items():
        users.sort()
        b = boxes[n]
        step = min(14, (b.w - 24) / max(1, len(users) - 1))
        for j, (_, i, role) in enumerate(users):
            port_x[(i, role)] = b.cx + (j - (len(users) - 1) / 2) * step
    run_x: dict[tuple[int, str], float] = {}
    for g in range(ncol):
        left = col_x[g] + col_w[g]
        right = left + gap_w[g]
        users = sorted(near_left[g], key=lambda i: abs(lane.get(i, 0) - body / 2))  # nearest lane: nearest run
        for j, i in enumerate(users):
            role = "out" if boxes[edges[i].source].col == g else "in"
            run_x[(i, role)] = left + 14 + CHANNEL * j
        for j, i in enumerate(sorted(near_right[g], key=lambda i: abs(lane[i] - body / 2))):
            run_x[(i, "in")] = right - 14 - CHANNEL * j
    side_ports: dict[tuple[str, str], list[int]] = defaultdict(list)  # (node, "R-top" etc.) -> edges

    def side_y(b: _Box, where: str, i: int) -> float:
        users = side_ports[(b.name, where)]
        if i not in users:
            users.append(i)
        if where.endswith("upper"):  # upper quarter, further ones lower (the middle holds edges to the next column)
            return min(b.cy - 4, b.y + 0.22 * b.h + 6 * users.index(i))
        return max(b.cy + 4, b.y + 0.8 * b.h - 6 * users.index(i))

    # edges to the next column leave a box's right side and enter the left side spread out in
    # the order of the box at the other end; parallel edges between the same pair also bend apart
    siblings: dict[tuple[str, str], list[int]] = defaultdict(list)
    fwd_out: dict[str, list[int]] = defaultdict(list)
    fwd_in: dict[str, list[int]] = defaultdict(list)
    for i, (e, k) in enumerate(zip(edges, kind)):
        siblings[(e.source, e.target)].append(i)
        if k == "fwd":
            fwd_out[e.source].append(i)
            fwd_in[e.target].append(i)

    def spread(b: _Box, users: list[int], i: int) -> float:
        step = min(11, (b.h - 12) / max(1, len(users) - 1))
        return b.cy + (users.index(i) - (len(users) - 1) / 2) * step

    for n, users in fwd_out.items():
        users.sort(key=lambda i: (boxes[edges[i].target].cy, i))
    for n, users in fwd_in.items():
        users.sort(key=lambda i: (boxes[edges[i].source].cy, i))

    drawn: list[_Drawn] = []
    for i, (e, k) in enumerate(zip(edges, kind)):
        s, t = boxes[e.source], boxes[e.target]
        if k == "self":  # a loop above the box, its label above the loop; more loops, taller
            cx, top, h = s.cx, s.y, 36 + LOOP_STEP * loops[e.source].index(i) * 4 / 3
            cmds = [("M", (cx - 30, top)), ("C", (cx - 40, top - h), (cx + 40, top - h), (cx + 30, top))]
            drawn.append(_Drawn(e, cmds, (cx, top - 0.75 * h - 11)))
        elif k == "fwd":
            group = siblings[(e.source, e.target)]
            off = group.index(i) - (len(group) - 1) / 2
            sy, ty = spread(s, fwd_out[e.source], i), spread(t, fwd_in[e.target], i)
            x0, x1 = col_x[s.col] + col_w[s.col], col_x[t.col]
            mx, bow = (x0 + x1) / 2, 36 * off
            cmds = [("M", (s.right, sy))] + ([("L", (x0, sy))] if x0 > s.right else [])  # a narrow box: reach the gap
            cmds += [("C", (mx, sy + bow), (mx, ty + bow), (x1, ty))] + ([("L", (t.x, ty))] if t.x > x1 else [])
            drawn.append(_Drawn(e, cmds, (mx, (sy + ty) / 2 + 0.75 * bow)))
        elif k == "side":
            x = run_x[(i, "out")]
            down = t.row > s.row  # leave the source and enter the target on the sides that face each other
            y0, y1 = side_y(s, "R-lower" if down else "R-upper", i), side_y(t, "R-upper" if down else "R-lower", i)
            cmds = _rounded([(s.right, y0), (x, y0), (x, y1), (t.right, y1)])
            w = _text_w(e.label, 11) + 8
            drawn.append(_Drawn(e, cmds, (x + 6 + w / 2, (y0 + y1) / 2)))
        else:
            y = lane[i]
            end = "top" if k == "over" else "bottom"
            if (i, "out") in port_x:
                x_out = port_x[(i, "out")]
                pts = [(x_out, getattr(s, "y" if k == "over" else "bottom")), (x_out, y)]
            else:
                x_out = run_x[(i, "out")]
                py = side_y(s, "R-upper" if k == "over" else "R-lower", i)
                pts = [(s.right, py), (x_out, py), (x_out, y)]
            if (i, "in") in port_x:
                x_in = port_x[(i, "in")]
                pts += [(x_in, y), (x_in, t.y if end == "top" else t.bottom)]
            else:
                x_in = run_x[(i, "in")]
                if k == "over":  # into the left side, from the gap before the target's column
                    py = side_y(t, "L-upper", i)
                    pts += [(x_in, y), (x_in, py), (t.x, py)]
                else:  # into the right side, from the gap after the target's column
                    py = side_y(t, "R-lower", i)
                    pts += [(x_in, y), (x_in, py), (t.right, py)]
            drawn.append(_Drawn(e, _rounded(pts), ((x_out + x_in) / 2, y)))
    return boxes, drawn


def _fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _d(cmds: list[Cmd], dx: float, dy: float) -> str:
    return " ".join(c[0] + " ".join(f"{_fmt(x + dx)},{_fmt(y + dy)}" for x, y in c[1:]) for c in cmds)


def topology_svg(cfg: RunConfig) -> str:
    """A left-to-right picture of the topology: agents coloured by policy, each box naming its
    node, policy, base model and tools; labelled edges routed around the boxes."""
    boxes, drawn = _layout(cfg)
    labels = []  # (drawn, x, y, w)
    for dr in drawn:
        if dr.edge.label and dr.label_at:
            labels.append((dr, dr.label_at[0], dr.label_at[1], _text_w(dr.edge.label, 11) + 8))
    xs = [b.x for b in boxes.values()] + [b.right for b in boxes.values()]
    ys = [b.y for b in boxes.values()] + [b.bottom for b in boxes.values()]
    for dr in drawn:
        for c in dr.cmds:
            xs += [p[0] for p in c[1:]]
            ys += [p[1] for p in c[1:]]
    for _, x, y, w in labels:
        xs += [x - w / 2, x + w / 2]
        ys += [y - LABEL_H / 2, y + LABEL_H / 2]
    dx, dy = PAD - min(xs), PAD - min(ys)
    agent_policy = {a.name: a.policy for a in cfg.agents}
    title = f"{cfg.team.name}: {cfg.topology.kind} topology, credit {cfg.credit.method}"
    legend = "box: node, policy, base model (tools) · colour = policy, dashed = frozen"
    models: dict[str, list[str]] = {}  # base model -> its agents, shown when the team mixes models
    for b in boxes.values():
        p = cfg.policies.get(agent_policy.get(b.agent or "", ""))
        if p is not None and b.agent not in models.setdefault(short_model(p.model), []):
            models[short_model(p.model)].append(b.agent)
    mixed = f"{len(models)} base models: " + "; ".join(f"{m} ({', '.join(a)})" for m, a in models.items()) if len(models) > 1 else ""
    footer = [(title, 12, "#555"), (legend, 11, "#777")] + ([(mixed, 11, "#333")] if mixed else [])
    width = max([max(xs) + dx + PAD] + [_text_w(t, size) + 2 * PAD for t, size, _ in footer])
    height = max(ys) + dy + PAD + 16 * len(footer) + 8

    policies = list(cfg.policies)
    parts = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{INK}"/></marker></defs>']
    for dr in drawn:  # edges first, so boxes and labels lie on top of them
        parts.append(f'<path class="edge" data-source="{escape(dr.edge.source)}" data-target="{escape(dr.edge.target)}" '
                     f'd="{_d(dr.cmds, dx, dy)}" fill="none" stroke="{INK}" stroke-width="1.3" marker-end="url(#arrow)"/>')
    for b in boxes.values():
        x, y = b.x + dx, b.y + dy
        if b.agent is None:  # START, END, majority vote
            parts.append(f'<g class="terminal" data-node="{escape(b.name)}"><rect x="{_fmt(x)}" y="{_fmt(y)}" width="{_fmt(b.w)}" '
                         f'height="{_fmt(b.h)}" rx="22" fill="#eee" stroke="#888"/><text x="{_fmt(x + b.w / 2)}" '
                         f'y="{_fmt(y + b.h / 2 + 5)}" text-anchor="middle" font-size="13">{escape(b.name)}</text></g>')
            continue
        pol = agent_policy.get(b.agent, "")
        color = PALETTE[policies.index(pol) % len(PALETTE)] if pol in policies else "#888"
        p = cfg.policies.get(pol)
        dash = ' stroke-dasharray="5 3"' if p is not None and p.kind == "frozen" else ""
        tip = f"{b.agent}: policy {pol} ({p.kind}, {p.model})" if p is not None else b.agent
        texts = "".join(
            f'<text x="{_fmt(x + b.w / 2)}" y="{_fmt(y + 19 + 15 * j)}" text-anchor="middle" font-size="{_STYLE[style][0]}"'
            f'{_STYLE[style][1]}>{escape(text)}</text>' for j, (text, style) in enumerate(b.lines))
        parts.append(f'<g class="node" data-agent="{escape(b.agent)}" data-node="{escape(b.name)}"><title>{escape(tip)}</title>'
                     f'<rect x="{_fmt(x)}" y="{_fmt(y)}" width="{_fmt(b.w)}" height="{_fmt(b.h)}" rx="6" fill="{color}" '
                     f'fill-opacity="0.15" stroke="{color}" stroke-width="2"{dash}/>{texts}</g>')
    for dr, x, y, w in labels:  # last: on top of everything, on a white patch
        e = dr.edge
        parts.append(f'<g class="edge-label" data-source="{escape(e.source)}" data-target="{escape(e.target)}">'
                     f'<rect x="{_fmt(x + dx - w / 2)}" y="{_fmt(y + dy - LABEL_H / 2)}" width="{_fmt(w)}" height="{LABEL_H}" '
                     f'rx="3" fill="#fff" fill-opacity="0.92"/><text x="{_fmt(x + dx)}" y="{_fmt(y + dy + 4)}" '
                     f'text-anchor="middle" font-size="11" fill="#333">{escape(e.label)}</text></g>')
    for j, (text, size, color) in enumerate(footer):
        parts.append(f'<text x="{PAD}" y="{_fmt(height - 10 - 16 * (len(footer) - 1 - j))}" font-size="{size}" '
                     f'fill="{color}">{escape(text)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
            f'height="{height:.0f}" font-family="system-ui, sans-serif"><rect width="100%" height="100%" fill="#fff"/>'
            f'{"".join(parts)}</svg>\n')
