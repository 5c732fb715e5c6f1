"""`mas show CONFIG`: the team as a text graph and an SVG picture of its topology."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from team_helpers import TOPOLOGIES, team_config

from mas.cli import main
from mas.config.schema import GraphTopology, load_config, validate_config
from mas.show import END, START, short_model, team_text, topology_graph, topology_svg

SVG = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).parent.parent
SHIPPED = sorted(ROOT.glob("configs/*.yaml"))


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


def test_graph_text_aligns_node_rows_and_counts_node_visits(tmp_path, tiny_model_dir):
    text = team_text(load_config(config(tmp_path, tiny_model_dir, "graph")))
    assert "topology: graph (at most 5 node visits)" in text
    rows = text.split("topology: graph")[1].split("\n\n")[0].splitlines()[1:]
    assert rows[0].startswith("  START") and any(r.startswith("  draft [lead]") for r in rows)
    assert len({r.index("──") for r in rows}) == 1, rows  # every arrow starts in one column
    assert "──otherwise──▶ fix" in text  # check's default edge, next to its conditional one


def test_agents_list_their_tools(tmp_path):
    text = team_text(load_config(ROOT / "configs/hotpotqa_heterogeneous.yaml"))
    agents = text.split("\n\n")[1].splitlines()
    researcher = next(line for line in agents if line.strip().startswith("researcher"))
    assert researcher.endswith("tools search, read (max_tool_calls 3)")
    assert not any("tools" in line for line in agents if line.strip().startswith(("orchestrator", "answerer")))
    assert "topology: orchestrator (at most 14 turns)" in text


def test_short_model():
    assert short_model("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen2.5-1.5B-Instruct"
    assert short_model("/data/models/tiny/") == "tiny"
    assert short_model("embedded") == "embedded"


def test_mas_show_prints_the_team_and_writes_an_svg(tmp_path, tiny_model_dir, capsys):
    path = config(tmp_path, tiny_model_dir, "orchestrator")
    svg = tmp_path / "team.svg"
    assert main(["show", str(path), "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "team test-team"
    assert any(line.strip().startswith("lead") and "policy main (full" in line and "parser orchestrator" in line for line in lines)
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
    assert texts.count(tiny_model_dir.name) == 3  # each agent's base model, short form
    rects = {r.get("stroke-dasharray") for r in root.iter(f"{SVG}rect")}
    assert "5 3" in rects


def test_mas_show_reports_config_errors(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("team: {name: x}\n")
    assert main(["show", str(path)]) == 2
    assert "policies" in capsys.readouterr().err


def test_svg_of_every_shipped_config_is_well_formed():
    for path in SHIPPED:
        cfg = load_config(path)
        root = ET.fromstring(topology_svg(cfg))
        agents = {g.get("data-agent") for g in root.iter(f"{SVG}g") if g.get("class") == "node"}
        assert agents and agents <= set(cfg.agent_names), path.name


# --- SVG geometry ------------------------------------------------------------------------------
# Boxes, edge paths and label patches are read back from the SVG and checked as shapes.


def _svg_shapes(svg: str):
    """(node boxes {name: (x0, y0, x1, y1)}, edges [(source, target, d, points along it)],
    labels [(source, target, text, anchor (x, y), patch (x0, y0, x1, y1))])."""
    root = ET.fromstring(svg)
    boxes = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") in ("node", "terminal"):
            r = g.find(f"{SVG}rect")
            x, y, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
            boxes[g.get("data-node")] = (x, y, x + w, y + h)
    edges = [(p.get("data-source"), p.get("data-target"), p.get("d"), _path_points(p.get("d")))
             for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]
    labels = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "edge-label":
            r, t = g.find(f"{SVG}rect"), g.find(f"{SVG}text")
            x, y, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
            labels.append((g.get("data-source"), g.get("data-target"), t.text,
                           (float(t.get("x")), float(t.get("y"))), (x, y, x + w, y + h)))
    return boxes, edges, labels


def _path_points(d: str, n: int = 24) -> list[tuple[float, float]]:
    """Points along an SVG path of absolute M, L, Q and C commands."""
    pts: list[tuple[float, float]] = []
    cur = (0.0, 0.0)
    for cmd, args in re.findall(r"([MLQC])([^MLQC]*)", d):
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", args)]
        ctrl = [cur] + list(zip(nums[::2], nums[1::2]))
        for i in range(n + 1):
            t = i / n
            if cmd == "M":
                p = ctrl[1]
            elif cmd == "L":
                p = tuple(a + (b - a) * t for a, b in zip(ctrl[0], ctrl[1]))
            elif cmd == "Q":
                p = tuple((1 - t) ** 2 * a + 2 * (1 - t) * t * b + t ** 2 * c for a, b, c in zip(*ctrl))
            else:
                p = tuple((1 - t) ** 3 * a + 3 * (1 - t) ** 2 * t * b + 3 * (1 - t) * t ** 2 * c + t ** 3 * e
                          for a, b, c, e in zip(*ctrl))
            pts.append(p)
        cur = ctrl[-1]
    return pts


def _inside(p, box, margin: float = 1.5) -> bool:
    x0, y0, x1, y1 = box
    return x0 + margin < p[0] < x1 - margin and y0 + margin < p[1] < y1 - margin


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


STRESS_GRAPHS = {  # over the test team's agents: skips, back edges, a same-column edge, a self-loop, parallels
    "skips": {
        "kind": "graph", "entry": "v", "max_turns": 12,
        "nodes": [{"name": n, "agent": a} for n, a in [("v", "checker"), ("s1", "helper"), ("s2", "helper"),
                                                      ("s3", "helper"), ("t1", "lead"), ("t2", "lead"), ("f", "lead")]],
        "edges": [{"from": a, "to": b, **({"when": w} if w else {})} for a, b, w in [
            ("v", "s1", "accept"), ("v", "s2", "reject"), ("v", "s3", None), ("s1", "t1", None), ("s2", "t2", "accept"),
            ("s2", "END", "reject"), ("s3", "f", "accept"), ("s3", "END", None), ("t1", "f", None), ("t2", "v", "reject"),
            ("t2", "s1", None), ("f", "END", "answer"), ("f", "f", None), ("t1", "END", "accept"), ("f", "s2", "reject")]],
    },
    "parallel": {
        "kind": "graph", "entry": "v", "max_turns": 6,
        "nodes": [{"name": "v", "agent": "checker"}, {"name": "s", "agent": "helper"}],
        "edges": [{"from": "v", "to": "s", "when": "accept"}, {"from": "v", "to": "s", "when": "reject"},
                  {"from": "v", "to": "s"}, {"from": "s", "to": "v", "when": "call"}, {"from": "s", "to": "v", "when": "reject"},
                  {"from": "s", "to": "s", "when": "accept"}, {"from": "s", "to": "s", "when": "answer"}, {"from": "s", "to": "END"}],
    },
}


PICTURES = [p.name for p in SHIPPED] + ["orchestrator", "chain", "debate", "graph", *STRESS_GRAPHS]


def _picture(name: str) -> str:
    """The SVG of a shipped config, of the test team in one topology, or of a stress graph."""
    if name.endswith(".yaml"):
        return topology_svg(load_config(ROOT / "configs" / name))
    data = team_config("embedded", "graph" if name in STRESS_GRAPHS else name)
    cfg = validate_config(data)
    if name in STRESS_GRAPHS:  # drawing stress only: labels the agents' parsers never give are fine here
        cfg = cfg.model_copy(update={"topology": GraphTopology.model_validate(STRESS_GRAPHS[name])})
    return topology_svg(cfg)


@pytest.mark.parametrize("name", PICTURES)
def test_svg_edges_and_labels_keep_clear_of_the_boxes(name):
    boxes, edges, labels = _svg_shapes(_picture(name))
    assert boxes and edges
    for source, target, text, anchor, patch in labels:
        for node, box in boxes.items():
            assert not _inside(anchor, box, 0), f"{name}: label {text!r} ({source}->{target}) anchored inside {node}"
            assert not _overlap(patch, box), f"{name}: label {text!r} ({source}->{target}) covers box {node}"
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert not _overlap(a[4], b[4]), f"{name}: labels {a[2]!r} and {b[2]!r} overlap"
    for source, target, _, points in edges:  # no edge runs through a box (its ends touch the boxes' edges)
        for node, box in boxes.items():
            assert not any(_inside(p, box) for p in points), f"{name}: edge {source}->{target} crosses box {node}"


@pytest.mark.parametrize("name", PICTURES)
def test_svg_parallel_edges_are_drawn_apart(name):
    _, edges, labels = _svg_shapes(_picture(name))
    pairs: dict = {}
    for source, target, d, points in edges:
        pairs.setdefault((source, target), []).append((d, points))
    for pair, drawn in pairs.items():
        for i, (d, pts) in enumerate(drawn):
            for d2, pts2 in drawn[i + 1:]:
                assert d != d2, f"{name}: parallel edges {pair} share one path"
                apart = max(min(abs(p[0] - q[0]) + abs(p[1] - q[1]) for q in pts2) for p in pts)
                assert apart >= 10, f"{name}: parallel edges {pair} nearly coincide"
        anchors = [a for s, t, _, a, _ in labels if (s, t) == pair]
        for i, a in enumerate(anchors):
            assert all(abs(a[1] - b[1]) >= 15 or abs(a[0] - b[0]) >= 40 for b in anchors[i + 1:]), f"{name}: labels of {pair}"


def test_svg_routes_skips_above_and_replies_below_the_nodes():
    svg = topology_svg(load_config(ROOT / "configs/hotpotqa_orchestrator_mgrpo.yaml"))
    boxes, edges, labels = _svg_shapes(svg)
    agents_top = min(b[1] for b in boxes.values())
    agents_bottom = max(b[3] for b in boxes.values())
    (answer,) = [pts for s, t, _, pts in edges if (s, t) == ("orchestrator", END)]
    assert min(y for _, y in answer) < agents_top  # over the specialists, not through them
    (answer_label,) = [a for s, t, text, a, _ in labels if text == "ANSWER"]
    assert answer_label[1] < agents_top
    replies = [pts for s, t, _, pts in edges if t == "orchestrator" and s != START]
    assert len(replies) == 3 and all(max(y for _, y in pts) > agents_bottom for pts in replies)
    assert all(a[1] > agents_bottom for s, t, text, a, _ in labels if text == "reply")


def test_svg_shows_the_parallel_default_edge_of_the_search_orchestra():
    svg = topology_svg(load_config(ROOT / "configs/hotpotqa_search_orchestra_drmas.yaml"))
    _, edges, labels = _svg_shapes(svg)
    assert len([1 for s, t, _, _ in edges if (s, t) == ("verify", "answer")]) == 2
    assert {text for s, t, text, _, _ in labels if (s, t) == ("verify", "answer")} == {"accept", "otherwise"}


def test_svg_shows_base_models_and_tools_of_a_heterogeneous_team():
    root = ET.fromstring(topology_svg(load_config(ROOT / "configs/hotpotqa_heterogeneous.yaml")))
    nodes = {g.get("data-agent"): g for g in root.iter(f"{SVG}g") if g.get("class") == "node"}

    def texts(g, cls=None):
        return [t.text for t in g.iter(f"{SVG}text") if cls is None or t.get("class") == cls]

    assert texts(nodes["orchestrator"], "model") == ["Qwen2.5-1.5B-Instruct"]
    assert texts(nodes["researcher"], "model") == ["SmolLM2-360M-Instruct"]
    assert texts(nodes["answerer"], "model") == ["Qwen2.5-1.5B-Instruct"]
    assert "policy oracle · frozen" in texts(nodes["answerer"])
    assert nodes["answerer"].find(f"{SVG}rect").get("stroke-dasharray") == "5 3"
    assert texts(nodes["researcher"], "tools") == ["tools: search, read"]
    assert texts(nodes["orchestrator"], "tools") == texts(nodes["answerer"], "tools") == []
    footer = [t.text for t in root.findall(f"{SVG}text")]
    assert any(t.startswith("2 base models: Qwen2.5-1.5B-Instruct (orchestrator, answerer)") for t in footer)
