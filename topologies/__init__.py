"""Topologies: each kind is one module that registers itself (``topologies/registry.py``).

The built-in kinds (orchestrator, debate, chain, graph) compile to LangGraph graphs; ``autogen``
runs an AutoGen AgentChat team and ``langgraph`` the user's own LangGraph graph, with every
model call routed to ``EpisodeContext.call`` (``topologies/adapters.py``); ``openai`` runs the
user's code against an OpenAI-compatible endpoint whose requests are those calls
(``topologies/endpoint.py``, ``mas/rollout/endpoint.py``).  AutoGen and the
user's code are imported only when a config names them.  Other packages add kinds through the
``mas.topologies`` entry-point group (``mas/config/plugins.py``): the entry point names a module
that registers its kind when imported.
"""

from __future__ import annotations

from typing import Any

# the built-in kinds register themselves on import, in this order (the schema's union lists them so)
from mas.topologies import orchestrator, debate, chain, graph, autogen, langgraph, endpoint  # noqa: F401,E401
from mas.topologies.registry import (Drawing, Edge, get_topology, kind_of, register_topology, topology_config_union,
                                     topology_kinds)

__all__ = ["Drawing", "Edge", "build_topology", "get_topology", "kind_of", "register_topology", "topology_config_union",
           "topology_kinds"]


def build_topology(cfg: Any) -> Any:
    """Compile a topology config with its kind's builder."""
    return kind_of(cfg).build(cfg)
