"""Custom graph: nodes and edges from YAML, validated with networkx before anything runs.

Each node is one turn of its agent, which sees the task and every earlier message.  After a
node, the first edge whose ``when`` equals the turn's parsed label (answer, call, accept,
reject) is taken, else the node's default edge (no ``when``); with neither, the episode
ends.  ``END`` is the terminal.  Checks (each a config error naming the YAML path):
unknown node names, more than one default edge out of a node, nodes unreachable from the
entry, no edge into END, nodes that cannot reach END, and cycles without ``max_turns``.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
from langgraph.graph import END, START, StateGraph

from mas.topologies.base import CompiledTopology, TeamState, ctx_of, latest_answer, transcript

TERMINAL = "END"


def graph_errors(cfg: Any) -> list[tuple[tuple, Any, str]]:
    """Structural problems of a GraphTopology as (yaml path, value, message) triples."""
    errs: list[tuple[tuple, Any, str]] = []
    names = [n.name for n in cfg.nodes]
    valid = sorted(set(names))
    for i, n in enumerate(names):
        if n == TERMINAL or names.count(n) > 1:
            errs.append((("topology", "nodes", i, "name"), n, "node names must be unique and not END"))
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


def build_graph(cfg: Any) -> CompiledTopology:
    agent_of = {n.name: n.agent for n in cfg.nodes}
    out_edges: dict[str, list] = {n: [] for n in agent_of}
    for e in cfg.edges:
        out_edges[e.source].append(e)

    async def step(state: TeamState, config) -> dict:
        ctx = ctx_of(config)
        name = state["node"]
        agent = agent_of[name]
        before = transcript(ctx.episode.turns)
        user = f"Task: {ctx.task.prompt}" + (f"\n{before}" if before else "")
        turn = await ctx.call(agent, ctx.agents[agent].messages(user), parent=state.get("last"))
        label = turn.parsed.get("label")
        edges = out_edges[name]
        chosen = next((e for e in edges if e.when is not None and e.when == label), None)
        chosen = chosen or next((e for e in edges if e.when is None), None)
        nxt = TERMINAL if chosen is None else chosen.target
        visits = state["visits"] + 1
        truncated = nxt != TERMINAL and cfg.max_turns is not None and visits >= cfg.max_turns
        return {"node": TERMINAL if truncated else nxt, "visits": visits, "last": turn.index,
                "truncated": truncated, "answer": latest_answer(ctx.episode.turns)}

    g = StateGraph(TeamState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    async def route(state: TeamState) -> str:
        return END if state["node"] == TERMINAL else "step"

    g.add_conditional_edges("step", route, ["step", END])
    bound = cfg.max_turns or (len(cfg.nodes) + 1)
    return CompiledTopology(g.compile(), recursion_limit=2 * bound + 10, initial={"node": cfg.entry})
