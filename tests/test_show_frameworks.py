"""`mas show` for teams from other frameworks: what is known is drawn, what is code is said plainly."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from team_helpers import TOPOLOGIES, team_config

from mas.cli import main
from mas.config.schema import load_config, validate_config
from mas.show import team_text, topology_graph, topology_svg

REPO = Path(__file__).parents[1]
sys.path.insert(0, str(REPO))  # examples/, as from the repository root


def test_a_yaml_selector_team_draws_the_selector_picking_each_participant():
    cfg = team_config("m", "chain")
    cfg["topology"] = {"kind": "autogen", "team": "selector", "participants": ["lead", "helper"], "selector": "checker",
                       "termination": {"text": "DONE", "max_messages": 6}}
    run = validate_config(cfg)
    nodes, edges, _ = topology_graph(run)
    assert nodes == ["START", "checker", "lead", "helper", "END"]
    pairs = {(e.source, e.target, e.label) for e in edges}
    assert {("checker", "lead", "picks"), ("lead", "checker", "said"), ("helper", "END", "'DONE' said or 6 messages")} <= pairs
    assert 'data-node="checker"' in topology_svg(run)


def test_a_factory_team_is_one_box_and_the_text_says_why(capsys):
    run = load_config(REPO / "configs" / "autogen_selector.yaml")
    text = team_text(run)
    assert "the team is built in code by examples.teams:build" in text and "cannot be drawn" in text
    svg = topology_svg(run)
    assert 'data-node="factory examples.teams:build"' in svg and 'data-agent="selector"' in svg
    assert main(["show", str(REPO / "configs" / "autogen_selector.yaml"), "--mermaid", "x.mmd"]) == 2
    assert "are not LangGraph graphs" in capsys.readouterr().err


def test_a_langgraph_team_draws_the_compiled_graphs_nodes_and_edges(tmp_path):
    run = load_config(REPO / "configs" / "langgraph_custom.yaml")
    nodes, edges, agent_of = topology_graph(run)
    assert nodes == ["START", "solve", "check", "END"] and agent_of == {"solve": "solver", "check": "checker"}
    assert {(e.source, e.target) for e in edges} == {("START", "solve"), ("solve", "check"), ("check", "solve"), ("check", "END")}
    assert "solve [solver]" in team_text(run) and "where that can be read from the code" in team_text(run)
    svg = topology_svg(run)
    assert 'data-node="solve"' in svg and 'data-node="check"' in svg
    out = tmp_path / "graph.mmd"
    assert main(["show", str(REPO / "configs" / "langgraph_custom.yaml"), "--mermaid", str(out)]) == 0
    assert "\tsolve(solve)" in out.read_text() and "\tcheck(check)" in out.read_text()


def test_mermaid_of_the_graph_topology_shows_every_yaml_node(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(team_config("m", "graph")))
    out = tmp_path / "graph.mmd"
    assert main(["show", str(path), "--mermaid", str(out)]) == 0
    for node in TOPOLOGIES["graph"]["nodes"]:
        assert f"\t{node['name']}({node['name']})" in out.read_text()
