"""The graph topology compiles to the user's graph: one LangGraph node per YAML node, the
``when`` labels as conditional edges, the turn bound kept (behaviour: tests/test_topologies.py);
the built-in topologies draw every edge they can take."""

from __future__ import annotations

from pathlib import Path

import pytest
from team_helpers import TOPOLOGIES, team_config
from test_engine import scripted_engine

from mas.config.checks import meaning_errors
from mas.config.schema import load_config, validate_config
from mas.topologies import build_topology
from mas.types import Task

REPO = Path(__file__).parents[2]


def compiled(topology: dict):
    cfg = team_config("m", "graph")
    cfg["topology"] = topology
    used = {n["agent"] for n in topology["nodes"]}
    cfg["agents"] = [a for a in cfg["agents"] if a["name"] in used]  # an agent no node uses is a config error
    return build_topology(validate_config(cfg).topology).graph


def test_every_yaml_node_is_a_langgraph_node_with_labelled_edges():
    graph = compiled(TOPOLOGIES["graph"]).get_graph()
    assert set(graph.nodes) == {"__start__", "draft", "check", "fix", "__end__"}
    edges = {(e.source, e.target, e.data) for e in graph.edges}
    assert ("__start__", "draft", None) in edges
    assert ("draft", "check", "otherwise") in edges  # the default edge
    assert ("check", "__end__", "accept") in edges and ("check", "fix", "otherwise") in edges
    assert ("fix", "check", "otherwise") in edges
    mermaid = graph.draw_mermaid()
    for name in ("draft", "check", "fix"):
        assert f"\t{name}({name})" in mermaid
    assert "accept" in mermaid


def test_the_shipped_search_orchestra_draws_as_its_yaml_graph():
    cfg = load_config(REPO / "configs" / "hotpotqa_search_orchestra_drmas.yaml")
    mermaid = build_topology(cfg.topology).graph.get_graph().draw_mermaid()
    for node in cfg.topology.nodes:  # node names such as 'answer' are also state keys
        assert f"\t{node.name}({node.name})" in mermaid
    assert "step" not in mermaid  # no dispatcher node


def test_a_node_without_a_default_edge_ends_when_no_label_matches(tiny_tokenizer):
    topology = {"kind": "graph", "entry": "draft", "nodes": [{"name": "draft", "agent": "lead"}, {"name": "check", "agent": "checker"}],
                "edges": [{"from": "draft", "to": "check", "when": "call"}, {"from": "check", "to": "END"}]}
    cfg = team_config("m", "graph")
    cfg["topology"] = topology
    cfg["agents"] = [a for a in cfg["agents"] if a["name"] in ("lead", "checker")]  # an agent no node uses is a config error
    engine, _ = scripted_engine(cfg, lambda req: "ANSWER: 5", tiny_tokenizer)
    ep = engine.rollout([Task("t", "2+3", "5")], 1, seed=0)[0].episodes[0]
    assert [t.agent for t in ep.turns] == ["lead"] and ep.status == "ok" and ep.answer == "5"
    assert {(e.source, e.target, e.data) for e in compiled(topology).get_graph().edges} >= {("draft", "__end__", "no match")}


S, E = "__start__", "__end__"
BUILT_IN_EDGES = {  # (source, target, conditional): the nodes that pick their successor declare where they may go
    "orchestrator": {(S, "orchestrator", False), ("orchestrator", "orchestrator", True), ("orchestrator", "specialist", True),
                     ("orchestrator", E, True), ("specialist", "orchestrator", True), ("specialist", E, True)},
    "debate": {(S, "round", False), ("round", "round", True), ("round", "aggregate", True), ("aggregate", E, False)},
    "chain": {(S, "0_lead", False), ("0_lead", "1_helper", False), ("1_helper", "2_checker", False),
              ("2_checker", "0_lead", True), ("2_checker", E, True)},
}


@pytest.mark.parametrize("kind", sorted(BUILT_IN_EDGES))
def test_built_in_topologies_compile_to_graphs_with_every_edge_they_can_take(kind):
    graph = build_topology(validate_config(team_config("m", kind)).topology).graph.get_graph()
    assert {(e.source, e.target, e.conditional) for e in graph.edges} == BUILT_IN_EDGES[kind]


@pytest.mark.parametrize("name", ["a|b", "x:y", "__start__"])
def test_node_names_langgraph_reserves_are_config_errors(name):
    cfg = team_config("m", "graph")
    topo = TOPOLOGIES["graph"]
    cfg["topology"] = {**topo, "entry": name, "nodes": [{"name": name, "agent": "lead"}, *topo["nodes"][1:]],
                       "edges": [{"from": name, "to": "check"}, *topo["edges"][1:]]}
    from mas.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"topology.nodes\[0\].name: LangGraph reserves"):
        validate_config(cfg, check=meaning_errors)
