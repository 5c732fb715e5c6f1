"""Custom graph: nodes and edges from YAML, validated with networkx before anything runs.

Each node is one turn of its agent, which sees the task and every earlier message.  Every
YAML node is one LangGraph node, and its edges the node's destinations labelled with their
``when`` labels (it picks one with a ``Command``, ``topologies.base.routed``), so LangGraph's
drawing and tracing show the user's graph.  After a
node, the first edge whose ``when`` equals the turn's parsed label (answer, call, accept,
reject) is taken, else the node's default edge (no ``when``); with neither, the episode
ends.  ``END`` is the terminal.  Checks (each a config error naming the YAML path):
unknown node names, more than one default edge out of a node, nodes unreachable from the
entry, no edge into END, nodes that cannot reach END, and cycles without ``max_turns``.
"""

from __future__ import annotations

from typing import Any, Literal

import networkx as nx
from langgraph.graph import END, START, StateGraph
from pydantic import ConfigDict, Field

from mas.agents.parsers import PARSER_LABELS, parsers_giving
from mas.topologies.base import CompiledTopology, TeamState, ctx_of, latest_answer, routed, transcript
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.topologies.teaching import NoTeacher
from mas.types import Section

TERMINAL = "END"
RESERVED_CHARS = ("|", ":")  # LangGraph's namespace separators


class GraphNode(Section):
    name: str = Field(description="Node name (unique).")
    agent: str = Field(description="Agent that speaks at this node.")


class GraphEdge(Section):
    source: str = Field(alias="from", description="Node the edge leaves.")
    target: str = Field(alias="to", description="Node the edge enters, or END.")
    when: Literal["accept", "reject", "call", "answer"] | None = Field(
        None, description="Take this edge only if the source turn's parsed label matches; None = default edge."
    )
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class GraphTopology(Section):
    kind: Literal["graph"]
    entry: str = Field(description="First node.")
    nodes: tuple[GraphNode, ...] = Field(min_length=1, description="Nodes; each is one agent turn.")
    edges: tuple[GraphEdge, ...] = Field(description="Directed edges; END marks the terminal.")
    max_turns: int | None = Field(None, ge=1, description="Turn bound; required if the graph has a cycle.")


def graph_errors(cfg: Any) -> list[tuple[tuple, Any, str]]:
    """Structural problems of a GraphTopology as (yaml path, value, message) triples."""
    errs: list[tuple[tuple, Any, str]] = []
    names = [n.name for n in cfg.nodes]
    valid = sorted(set(names))
    for i, n in enumerate(names):
        if n == TERMINAL or names.count(n) > 1:
            errs.append((("topology", "nodes", i, "name"), n, "node names must be unique and not END"))
        elif n in (START, END) or any(c in n for c in RESERVED_CHARS):
            errs.append((("topology", "nodes", i, "name"), n,
                         f"LangGraph reserves this name or a character in it ({START}, {END}, {' '.join(RESERVED_CHARS)})"))
    if cfg.entry not in names:
        errs.append((("topology", "entry"), cfg.entry, f"unknown node; valid: {valid}"))
    g = nx.DiGraph()
    g.add_nodes_from(names + [TERMINAL])
    defaults: dict[str, int] = {}
    for i, e in enumerate(cfg.edges):
        if e.source not in names:
            errs.append((("topology", "edges", i, "from"), e.source, f"unknown node; valid: {valid}"))
        if e.target not in names and e.target != TERMINAL:
            errs.append((("topology", "edges", i, "to"), e.target, f"unknown node; valid: {valid + [TERMINAL]}"))
        if e.when is None:
            defaults[e.source] = defaults.get(e.source, 0) + 1
            if defaults[e.source] == 2:
                errs.append((("topology", "edges", i, "when"), None,
                             f"node {e.source!r} already has a default edge (without 'when'); a node may have only one: "
                             "give this edge a 'when' (accept, reject, call, answer)"))
        g.add_edge(e.source, e.target)
    if errs:
        return errs
    reachable = nx.descendants(g, cfg.entry) | {cfg.entry}
    for i, n in enumerate(names):
        if n not in reachable:
            errs.append((("topology", "nodes", i, "name"), n, f"unreachable: no path of edges leads here from entry {cfg.entry!r}"))
    if not any(e.target == TERMINAL for e in cfg.edges):
        errs.append((("topology", "edges"), [f"{e.source}->{e.target}" for e in cfg.edges], "no terminal: add an edge to END"))
    else:
        for i, n in enumerate(names):
            if n in reachable and not nx.has_path(g, n, TERMINAL):
                errs.append((("topology", "nodes", i, "name"), n, "cannot reach END: no edge path from this node leads to END"))
    if cfg.max_turns is None and not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        errs.append((("topology", "max_turns"), None, f"the graph has a cycle {' -> '.join(cycle + cycle[:1])} but no turn bound; set max_turns"))
    return errs


def route_key(edge: Any) -> str:
    """The key of an edge in its source node's conditional-edge map (shown by LangGraph's drawing)."""
    return edge.when or "otherwise"


NO_MATCH = "no match"  # no conditional edge matched and the node has no default edge: the episode ends
BOUND = "max_turns"  # the turn bound cut the episode


def build_graph(cfg: Any) -> CompiledTopology:
    """One LangGraph node per YAML node; each node's edges become a map keyed by the ``when``
    labels ("otherwise" for the default edge), plus "max_turns" (the turn bound) and "no match"
    (no edge applies) into END; the node goes where its key leads, and declares the map's
    targets as its destinations, so the compiled graph is the user's graph."""
    agent_of = {n.name: n.agent for n in cfg.nodes}
    out_edges: dict[str, list] = {n: [] for n in agent_of}
    for e in cfg.edges:
        out_edges[e.source].append(e)

    def make_node(name: str):
        agent = agent_of[name]
        edges = out_edges[name]

        async def node(state: TeamState, config) -> dict:
            ctx = ctx_of(config)
            before = transcript(ctx.episode.turns)
            user = f"Task: {ctx.task.prompt}" + (f"\n{before}" if before else "")
            turn = await ctx.call(agent, ctx.agents[agent].messages(user), parent=state.get("last"))
            label = turn.parsed.get("label")
            chosen = next((e for e in edges if e.when is not None and e.when == label), None)
            chosen = chosen or next((e for e in edges if e.when is None), None)
            nxt = TERMINAL if chosen is None else chosen.target
            visits = state["visits"] + 1
            truncated = nxt != TERMINAL and cfg.max_turns is not None and visits >= cfg.max_turns
            key = BOUND if truncated else NO_MATCH if chosen is None else route_key(chosen)
            return {"node": key, "visits": visits, "last": turn.index,
                    "truncated": truncated, "answer": latest_answer(ctx.episode.turns)}

        return node

    g = StateGraph(TeamState)
    g.add_edge(START, cfg.entry)
    for name, edges in out_edges.items():
        path: dict[str, str] = {}
        for e in edges:  # the first edge with a label wins, as in the node's choice
            path.setdefault(route_key(e), END if e.target == TERMINAL else e.target)
        if not any(e.when is None for e in edges):
            path[NO_MATCH] = END
        if cfg.max_turns is not None and any(e.target != TERMINAL for e in edges):
            path[BOUND] = END

        def route(state: TeamState, config, path: dict[str, str] = path) -> str:
            return path[state["node"]]  # the key the node chose; the map names its target

        # one label per target: the one LangGraph drew for a conditional-edge map (the first in sort order)
        labels = {target: min(k for k, t in path.items() if t == target) for target in path.values()}
        g.add_node(name, routed(make_node(name), route), destinations=labels)
    bound = cfg.max_turns or (len(cfg.nodes) + 1)
    return CompiledTopology(g.compile(), recursion_limit=2 * bound + 10)


@register_topology
class Graph:
    name = "graph"
    config = GraphTopology
    build = staticmethod(build_graph)

    def agents(self, topo: GraphTopology) -> dict[str, str]:
        return {n.agent: "nodes" for n in topo.nodes}

    def last_speakers(self, topo: GraphTopology) -> list[str]:
        agent_of = {n.name: n.agent for n in topo.nodes}
        has_default = {e.source for e in topo.edges if e.when is None}
        ends = {e.source for e in topo.edges if e.target == TERMINAL} | (set(agent_of) - has_default)
        return sorted({agent_of[n] for n in ends if n in agent_of})

    def last_speaker_note(self, topo: GraphTopology) -> str | None:
        return None

    def main_agent(self, topo: GraphTopology) -> str | None:
        return None

    def parts(self, topo: GraphTopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: GraphTopology) -> list[str] | None:
        return None

    def turn_limit(self, topo: GraphTopology) -> int:  # its turn bound, or one visit per node when it has no cycle
        return topo.max_turns or len(topo.nodes)

    def refs(self, topo: GraphTopology, names: list[str]) -> list[Issue]:
        return [(("topology", "nodes", i, "agent"), n.agent, f"unknown agent; valid: {names}")
                for i, n in enumerate(topo.nodes) if n.agent not in names]

    def errors(self, cfg: Any) -> list[Issue]:
        return graph_errors(cfg.topology)

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        """An edge labelled with something its source's parser never gives is never taken."""
        topo, errs = cfg.topology, []
        index = {a.name: i for i, a in enumerate(cfg.agents)}
        agent_of = {n.name: n.agent for n in topo.nodes}
        for i, e in enumerate(topo.edges):
            agent = agent_of.get(e.source)
            if e.when is None or agent not in index:
                continue
            parser = cfg.agents[index[agent]].parser
            labels = PARSER_LABELS.get(parser)
            if labels is not None and e.when not in labels:
                errs.append((("topology", "edges", i, "when"), e.when,
                             f"node {e.source!r} is agent {agent!r}, whose parser {parser!r} only gives "
                             f"{sorted(labels)}: this edge is never taken; use a parser that gives {e.when!r} "
                             f"({parsers_giving(e.when)}) or another label"))
        return errs

    def warnings(self, cfg: Any) -> list[Issue]:
        return []

    def drawing(self, cfg: Any) -> Drawing:
        t = cfg.topology
        # a node's default edge is taken when none of its conditional edges matches
        conditional = {e.source for e in t.edges if e.when}
        edges = [Edge(registry.START, t.entry)] + [
            Edge(e.source, e.target, e.when or ("otherwise" if e.source in conditional else "")) for e in t.edges
        ]
        nodes = [registry.START, *(n.name for n in t.nodes), registry.END]
        bound = f"at most {t.max_turns} node visits" if t.max_turns else ""  # a graph counts visits
        return Drawing(nodes, edges, {n.name: n.agent for n in t.nodes}, bound=bound)

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:

        raise NoTeacher(f"topology {self.name!r} on env {cfg.env.name!r}")
