"""Topologies: each compiles a team section of the config into a runnable LangGraph graph."""

from __future__ import annotations

from typing import Any


def build_topology(cfg: Any):
    """Compile a topology config (orchestrator, debate, chain or graph)."""
    from mas.topologies.chain import build_chain
    from mas.topologies.debate import build_debate
    from mas.topologies.graph import build_graph
    from mas.topologies.orchestrator import build_orchestrator

    builders = {"orchestrator": build_orchestrator, "debate": build_debate, "chain": build_chain, "graph": build_graph}
    return builders[cfg.kind](cfg)
