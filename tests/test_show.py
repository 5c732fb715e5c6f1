"""`mas show CONFIG`: the team as a text graph and an SVG picture of its topology."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import yaml
from team_helpers import TOPOLOGIES, team_config

from mas.cli import main
from mas.config import load_config
from mas.show import END, START, team_text, topology_graph, topology_svg

SVG = "{http://www.w3.org/2000/svg}"


def config(tmp_path, model_dir, topology: str):
    path = tmp_path / f"{topology}.yaml"
    path.write_text(yaml.safe_dump(team_config(model_dir, topology)))
    return path


@pytest.mark.parametrize(
    "topology, expected",
    [
        ("orchestrator", {(START, "lead", ""), ("lead", "helper", "CALL"), ("helper", "lead", "reply"),
                          ("lead", "checker", "CALL"), ("checker", "lead", "reply"), ("lead", END, "ANSWER")}),
        ("chain", {(START, "lead", ""), ("lead", "helper", ""), ("helper", "checker", ""),
                   ("checker", "lead", "checker said REJECT (≤1×)"), ("checker", END, "ACCEPT / no loops left")}),
        ("debate", {(START, "lead", ""), (START, "helper", ""), (START, "checker", ""),
                    ("lead", "lead", "round 2: reads the others"), ("helper", "helper", "round 2: reads the others"),
                    ("checker", "checker", "round 2: reads the others"), ("lead", "majority vote", "round 2 answers"),
                    ("helper", "majority vote", "round 2 answers"), ("checker", "majority vote", "round 2 answers"),
                    ("majority vote", END, "ANSWER")}),
    ],
)
def test_topology_graph_has_the_edges_the_topology_allows(tmp_path, tiny_model_dir, topology, expected):
    cfg = load_config(config(tmp_path, tiny_model_dir, topology))
    _, edges, _ = topology_graph(cfg)
    assert {(e.source, e.target, e.label) for e in edges} == expected


def test_graph_topology_keeps_nodes_agents_and_conditions(tmp_path, tiny_model_dir):
    cfg = load_config(config(tmp_path, tiny_model_dir, "graph"))
    nodes, edges, agent_of = topology_graph(cfg)
    assert agent_of == {n["name"]: n["agent"] for n in TOPOLOGIES["graph"]["nodes"]}
    assert (START, "draft", "") in {(e.source, e.target, e.label) for e in edges}
    assert ("check", END, "accept") in {(e.source, e.target, e.label) for e in edges}
    text = team_text(cfg)
    assert "draft [lead]" in text and "──accept──▶ END" in text


def test_mas_show_prints_the_team_and_writes_an_svg(tmp_path, tiny_model_dir, capsys):
    path = config(tmp_path, tiny_model_dir, "orchestrator")
    svg = tmp_path / "team.svg"
    assert main(["show", str(path), "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "team test-team"
    assert any(line.strip().startswith("lead") and "policy main (full" in line and "parser orchestrator" for line in lines)
    assert any("checker" in line and "policy judge (frozen" in line for line in lines)
    assert "topology: orchestrator (at most 4 turns)" in out
    assert "──CALL──▶ helper" in out and "──ANSWER──▶ END" in out and "credit: dr_mas" in out

    root = ET.fromstring(svg.read_text())  # well-formed SVG
    assert root.tag == f"{SVG}svg"
    nodes = {g.get("data-agent") for g in root.iter(f"{SVG}g") if g.get("class") == "node"}
    assert nodes == {"lead", "helper", "checker"}
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert {"START", "END", "CALL", "reply", "ANSWER"} <= set(texts)
    assert "policy judge · frozen" in texts  # the frozen policy is marked
    rects = {r.get("stroke-dasharray") for r in root.iter(f"{SVG}rect")}
    assert "5 3" in rects


def test_mas_show_reports_config_errors(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("team: {name: x}\n")
    assert main(["show", str(path)]) == 2
    assert "policies" in capsys.readouterr().err


def test_svg_of_every_shipped_config_is_well_formed():
    from pathlib import Path

    for path in sorted(Path(__file__).parent.parent.glob("configs/*.yaml")):
        cfg = load_config(path)
        root = ET.fromstring(topology_svg(cfg))
        agents = {g.get("data-agent") for g in root.iter(f"{SVG}g") if g.get("class") == "node"}
        assert agents and agents <= set(cfg.agent_names), path.name
