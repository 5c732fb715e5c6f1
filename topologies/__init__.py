"""Topologies: each compiles a team section of the config into a runnable team.

The built-in kinds (orchestrator, debate, chain, graph) compile to LangGraph graphs; ``autogen``
runs an AutoGen AgentChat team and ``langgraph`` the user's own LangGraph graph, with every
model call routed to ``EpisodeContext.call`` (``topologies/adapters.py``).  AutoGen and the
user's code are imported only when a config names them.
"""

from __future__ import annotations

from typing import Any


def build_topology(cfg: Any):
    """Compile a topology config (orchestrator, debate, chain, graph, autogen or langgraph)."""
    from mas.topologies.autogen import build_autogen
    from mas.topologies.chain import build_chain
    from mas.topologies.debate import build_debate
    from mas.topologies.graph import build_graph
    from mas.topologies.langgraph import build_langgraph
    from mas.topologies.orchestrator import build_orchestrator

    builders = {"orchestrator": build_orchestrator, "debate": build_debate, "chain": build_chain, "graph": build_graph,
                "autogen": build_autogen, "langgraph": build_langgraph}
    return builders[cfg.kind](cfg)
