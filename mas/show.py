"""``mas show CONFIG``: the team and its topology as a text graph, and as an SVG picture.

The graph is read from the validated config (who may speak after whom, and on which parsed
label), not from a run, so it shows what the topology allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from mas.config import ChainTopology, DebateTopology, GraphTopology, OrchestratorTopology, RunConfig
from mas.report.charts import PALETTE

START, END = "START", "END"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    label: str = ""


def topology_graph(cfg: RunConfig) -> tuple[list[str], list[Edge], dict[str, str]]:
    """(nodes in a readable order, edges, node -> agent) of the config's topology."""
    t = cfg.topology
    if isinstance(t, OrchestratorTopology):
        o = t.orchestrator
        edges = [Edge(START, o)]
        for s in t.specialists:
            edges += [Edge(o, s, "CALL"), Edge(s, o, "reply")]
        edges.append(Edge(o, END, "ANSWER"))
        nodes = [START, o, *t.specialists, END]
        agent_of = {n: n for n in nodes[1:-1]}
    elif isinstance(t, DebateTopology):
        edges = [Edge(START, d) for d in t.debaters]
        if t.rounds > 1:
            later = "round 2" if t.rounds == 2 else f"rounds 2..{t.rounds}"
            edges += [Edge(d, d, f"{later}: reads the others") for d in t.debaters]
        final = t.aggregator or "majority vote"
        edges += [Edge(d, final, f"round {t.rounds} answers") for d in t.debaters]
        edges.append(Edge(final, END, "ANSWER"))
        nodes = [START, *t.debaters, final, END]
        agent_of = {d: d for d in t.debaters}
        if t.aggregator:
            agent_of[t.aggregator] = t.aggregator
    elif isinstance(t, ChainTopology):
        seq = list(t.sequence)
        edges = [Edge(START, seq[0])] + [Edge(a, b) for a, b in zip(seq, seq[1:])]
        if t.loop_to and t.max_loops:
            judge = t.verdict_from or seq[-1]
            edges.append(Edge(seq[-1], t.loop_to, f"{judge} said REJECT (≤{t.max_loops}×)"))
            edges.append(Edge(seq[-1], END, "ACCEPT / no loops left"))
        else:
            edges.append(Edge(seq[-1], END))
        nodes = [START, *dict.fromkeys(seq), END]
        agent_of = {a: a for a in seq}
    elif isinstance(t, GraphTopology):
        edges = [Edge(START, t.entry)] + [Edge(e.source, e.target, e.when or "") for e in t.edges]
        nodes = [START, *(n.name for n in t.nodes), END]
        agent_of = {n.name: n.agent for n in t.nodes}
    else:  # pragma: no cover - the config schema admits only the four kinds
        raise TypeError(f"unknown topology {type(t).__name__}")
    return nodes, edges, agent_of


def team_text(cfg: RunConfig) -> str:
    """The team, its policies, topology (as an adjacency list), env and credit method."""
    lines = [f"team {cfg.team.name}" + (f": {cfg.team.description}" if cfg.team.description else ""), "", "agents"]
    width = max(len(a.name) for a in cfg.agents)
    for a in cfg.agents:
        p = cfg.policies[a.policy]
        lines.append(f"  {a.name:<{width}}  policy {a.policy} ({p.kind}, {p.model})  parser {a.parser}  "
                     f"T={a.sampling.temperature:g} max_new_tokens={a.sampling.max_new_tokens}")
    lines += ["", "policies"]
    pw = max(len(n) for n in cfg.policies)
    for name, p in cfg.policies.items():
        lr = f"  lr {p.optim.lr:g}  micro-batch {p.optim.micro_batch_size}" if p.optim else ""
        lines.append(f"  {name:<{pw}}  {p.kind:<6} {p.model}  {p.dtype} on {p.device}{lr}")
    nodes, edges, agent_of = topology_graph(cfg)
    bound = getattr(cfg.topology, "max_turns", None)
    lines += ["", f"topology: {cfg.topology.kind}" + (f" (at most {bound} turns)" if bound else "")]
    nw = max(len(n) for n in nodes)
    for n in nodes:
        out = [e for e in edges if e.source == n]
        name = n if agent_of.get(n, n) == n else f"{n} [{agent_of[n]}]"
        for i, e in enumerate(out):
            arrow = f"──{e.label}──▶" if e.label else "──▶"
            lines.append(f"  {(name if i == 0 else ''):<{nw + 2}} {arrow} {e.target}")
    method = cfg.credit.method
    lines += ["", f"env: {getattr(cfg.env, 'name', '?')}", f"credit: {method}"]
    return "\n".join(lines)


# --- SVG -------------------------------------------------------------------------------------

NODE_W, NODE_H, COL_GAP, ROW_GAP = 150, 44, 90, 30


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


def topology_svg(cfg: RunConfig) -> str:
    """A left-to-right picture of the topology: agents coloured by policy, labelled edges."""
    nodes, edges, agent_of = topology_graph(cfg)
    layer = _layers(nodes, edges)
    columns: dict[int, list[str]] = {}
    for n in nodes:
        columns.setdefault(layer[n], []).append(n)
    longest = max((len(e.label) for e in edges if e.source != e.target), default=0)
    col_gap = max(COL_GAP, min(240, 6.5 * longest + 24))  # room for the edge labels between columns
    row_gap = ROW_GAP + (36 if any(e.source == e.target for e in edges) else 0)  # room for self-loops
    tallest = max(len(c) for c in columns.values())
    top_pad = 50 if any(e.source == e.target for e in edges) else 20
    body_h = tallest * (NODE_H + row_gap) - row_gap
    width = len(columns) * (NODE_W + col_gap) - col_gap + 40
    pos: dict[str, tuple[float, float]] = {}
    for col, members in columns.items():
        top = top_pad + (body_h - (len(members) * (NODE_H + row_gap) - row_gap)) / 2
        for i, n in enumerate(members):
            pos[n] = (20 + col * (NODE_W + col_gap), top + i * (NODE_H + row_gap))
    arcs = [_edge(e, pos) for e in edges]
    height = max([top_pad + body_h] + [bottom for _, bottom in arcs]) + 44
    policies = list(cfg.policies)
    agent_policy = {a.name: a.policy for a in cfg.agents}
    parts = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>']
    parts += [svg for svg, _ in arcs]
    for n in nodes:
        x, y = pos[n]
        agent = agent_of.get(n)
        if agent is None:  # START, END, majority vote
            parts.append(f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="22" fill="#eee" stroke="#888"/>'
                         f'<text x="{x + NODE_W / 2}" y="{y + NODE_H / 2 + 5}" text-anchor="middle" font-size="13">{escape(n)}</text>')
            continue
        pol = agent_policy.get(agent, "")
        color = PALETTE[policies.index(pol) % len(PALETTE)] if pol in policies else "#888"
        frozen = cfg.policies[pol].kind == "frozen" if pol in cfg.policies else False
        dash = ' stroke-dasharray="5 3"' if frozen else ""
        sub = f"{pol}" + (" · frozen" if frozen else "")
        label = n if agent == n else f"{n}: {agent}"
        parts.append(f'<g class="node" data-agent="{escape(agent)}"><rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6" '
                     f'fill="{color}" fill-opacity="0.15" stroke="{color}" stroke-width="2"{dash}/>'
                     f'<text x="{x + NODE_W / 2}" y="{y + 18}" text-anchor="middle" font-size="13" font-weight="600">{escape(label)}</text>'
                     f'<text x="{x + NODE_W / 2}" y="{y + 34}" text-anchor="middle" font-size="11" fill="#555">policy {escape(sub)}</text></g>')
    title = f"{cfg.team.name}: {cfg.topology.kind} topology, credit {cfg.credit.method}"
    parts.append(f'<text x="20" y="{height - 14:.0f}" font-size="12" fill="#555">{escape(title)} · box colour = policy, dashed = frozen</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
            f'font-family="system-ui, sans-serif"><rect width="100%" height="100%" fill="#fff"/>{"".join(parts)}</svg>\n')


def _edge(e: Edge, pos: dict[str, tuple[float, float]]) -> tuple[str, float]:
    """The edge's SVG and the lowest y it reaches (arcs below the nodes need room)."""
    (x1, y1), (x2, y2) = pos[e.source], pos[e.target]

    def label(lx: float, ly: float) -> str:
        if not e.label:
            return ""
        return (f'<text font-size="11" fill="#333" text-anchor="middle" x="{lx:.0f}" y="{ly:.0f}" '
                f'paint-order="stroke" stroke="#fff" stroke-width="3">{escape(e.label)}</text>')

    if e.source == e.target:  # a self-loop above the node
        cx, top = x1 + NODE_W / 2, y1
        d = f"M{cx - 30},{top} C{cx - 40},{top - 36} {cx + 40},{top - 36} {cx + 30},{top}"
        return f'<path d="{d}" fill="none" stroke="#555" marker-end="url(#arrow)"/>' + label(cx, top - 32), y1 + NODE_H
    if x2 > x1:  # forward: a curve from the right side to the left side
        sx, sy, tx, ty = x1 + NODE_W, y1 + NODE_H / 2, x2, y2 + NODE_H / 2
        mx = (sx + tx) / 2
        d = f"M{sx:.0f},{sy:.0f} C{mx:.0f},{sy:.0f} {mx:.0f},{ty:.0f} {tx:.0f},{ty:.0f}"
        return (f'<path d="{d}" fill="none" stroke="#555" stroke-width="1.3" marker-end="url(#arrow)"/>'
                + label(mx, (sy + ty) / 2 - 6), max(y1, y2) + NODE_H)
    # backwards or within a column: an arc below the nodes
    sx, sy, tx, ty = x1 + NODE_W / 2 + 12, y1 + NODE_H, x2 + NODE_W / 2 - 12, y2 + NODE_H
    drop = 40 + 0.15 * math.hypot(tx - sx, ty - sy)
    bottom = max(sy, ty) + drop
    d = f"M{sx:.0f},{sy:.0f} C{sx:.0f},{bottom:.0f} {tx:.0f},{bottom:.0f} {tx:.0f},{ty:.0f}"
    return (f'<path d="{d}" fill="none" stroke="#555" stroke-width="1.3" marker-end="url(#arrow)"/>'
            + label((sx + tx) / 2, bottom - 0.25 * drop + 4), bottom)
