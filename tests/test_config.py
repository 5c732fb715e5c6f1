"""The run config: shipped configs, clear errors (YAML path, value found, valid choices),
overrides, graph-topology structure checks and immutability.

Validation never loads a model, so hub ids such as ``some/hub-id`` are fine here.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pydantic
import pytest
import yaml

from mas.config.checks import meaning_errors
from mas.cli import main
from mas.config.schema import ConfigError, RunConfig, apply_overrides, dump_config, load_config, validate_config
from mas.training.team import build_team

REPO = Path(__file__).parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))

BASE: dict = {
    "team": {"name": "test-team"},
    "policies": {
        "planner": {"kind": "full", "model": "some/hub-id"},
        "workers": {"kind": "lora", "model": "some/hub-id"},
    },
    "agents": [
        {"name": "orchestrator", "policy": "planner", "role": "You delegate.", "parser": "orchestrator"},
        {"name": "adder", "policy": "workers", "role": "You add.", "parser": "answer"},
        {"name": "verifier", "policy": "workers", "role": "You check.", "parser": "verdict"},
    ],
    "topology": {"kind": "orchestrator", "orchestrator": "orchestrator", "specialists": ["adder", "verifier"]},
    "env": {"name": "synthetic_math"},
    "credit": {"method": "dr_mas"},
}


def base() -> dict:
    return copy.deepcopy(BASE)


def errors_of(data: dict) -> list[str]:
    """The ConfigError lines of an invalid config, its schema and its meaning, as the commands
    check it (fails the test if it validates)."""
    with pytest.raises(ConfigError) as info:
        validate_config(data, "test.yaml", check=meaning_errors)
    assert info.value.lines, "a ConfigError must carry at least one line"
    assert all(line in str(info.value) for line in info.value.lines)
    return info.value.lines


def line_for(lines: list[str], path: str) -> str:
    """The one error line that starts with YAML path ``path``."""
    hits = [ln for ln in lines if ln.startswith(path + ":") or ln.startswith(path + " ")]
    assert len(hits) == 1, f"expected one error at {path!r}, got {lines}"
    return hits[0]


# --------------------------------------------------------------------------------------------
# shipped configs
# --------------------------------------------------------------------------------------------


def test_there_are_shipped_configs():
    assert CONFIGS, "configs/*.yaml not found"
    assert any(p.name == "quickstart.yaml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads_and_validates(path: Path, capsys):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    raw = yaml.safe_load(path.read_text())
    assert cfg.team.name == raw["team"]["name"]
    assert cfg.agent_names == [a["name"] for a in raw["agents"]]
    assert set(cfg.policies) == set(raw["policies"])
    assert cfg.credit.method == raw["credit"]["method"]
    # the resolved config round-trips: dumping and validating again gives the same config
    assert validate_config(yaml.safe_load(dump_config(cfg))) == cfg
    assert main(["validate", "-q", str(path)]) == 0
    assert f"{path}: ok" in capsys.readouterr().out


_KEY = re.compile(r"^(\s*)(- )?([A-Za-z_]+):(.*)$")
_BLOCK = re.compile(r"[|>][+-]?\d*\s*(#.*)?$")  # a block scalar indicator ends the key line


def uncommented_keys(text: str) -> list[str]:
    """Key lines whose nearest previous non-blank line is not a comment.

    For a list item the comment goes above its ``- key:`` line; each later key of the item
    needs its own comment.  Continuation lines of block scalars (``role: >-``) are text,
    not keys.
    """
    bad: list[str] = []
    lines = text.splitlines()
    block_indent: int | None = None
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if not line.strip() or indent > block_indent:
                continue
            block_indent = None
        m = _KEY.match(line)
        if not m:
            continue
        if _BLOCK.match(m.group(4).strip()):
            block_indent = indent + (2 if m.group(2) else 0)
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if not prev.lstrip().startswith("#"):
            bad.append(f"line {i + 1}: {line.strip()}")
    return bad


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_yaml_field_has_a_comment_above_it(path: Path):
    assert uncommented_keys(path.read_text()) == []


def test_comment_checker_catches_missing_comments():
    good = "# team\nteam:\n  # name\n  name: x\n# agents\nagents:\n  # first\n  - name: a\n    # its policy\n    policy: p\n"
    assert uncommented_keys(good) == []
    assert uncommented_keys("# team\nteam:\n  name: x\n") == ["line 3: name: x"]
    # the second key of a list item needs its own comment
    assert uncommented_keys("# agents\nagents:\n  # first\n  - name: a\n    policy: p\n") == ["line 5: policy: p"]
    # a list item's first key needs the comment above the '- name:' line
    assert uncommented_keys("# agents\nagents:\n  - name: a\n") == ["line 3: - name: a"]
    # text in a block scalar is not a key; the key after it is
    block = "# role\nrole: >-\n  Note: not a key\n  Also: text\nparser: answer\n"
    assert uncommented_keys(block) == ["line 5: parser: answer"]


# --------------------------------------------------------------------------------------------
# the base config and defaults
# --------------------------------------------------------------------------------------------


def test_base_config_is_valid_and_fills_defaults():
    cfg = validate_config(base())
    assert cfg.trainer.steps == 10
    assert cfg.policies["planner"].optim.micro_batch_size == 8
    assert cfg.policies["workers"].lora is None  # defaults apply at build time
    assert cfg.agent("adder").sampling.temperature == 1.0
    assert cfg.topology.max_turns == 6
    assert cfg.credit.invalid_penalty == pytest.approx(0.1)


# --------------------------------------------------------------------------------------------
# misspelled keys
# --------------------------------------------------------------------------------------------


def test_misspelled_trainer_key_names_path_and_valid_keys():
    data = base()
    data["trainer"] = {"stepz": 5}
    line = line_for(errors_of(data), "trainer.stepz")
    assert "unknown key" in line
    assert "'steps'" in line and "'batch_size'" in line and "'group_size'" in line
    assert "found 5" in line


def test_misspelled_key_inside_a_policy_lists_policy_keys():
    data = base()
    data["policies"]["planner"]["optimm"] = {"lr": 1e-5}
    line = line_for(errors_of(data), "policies.planner.optimm")
    assert "unknown key" in line
    for key in ("optim", "kind", "model", "lora", "dtype"):
        assert f"'{key}'" in line


def test_misspelled_key_inside_a_policy_optimizer_lists_optim_keys():
    data = base()
    data["policies"]["workers"]["optim"] = {"lrr": 1e-5}
    line = line_for(errors_of(data), "policies.workers.optim.lrr")
    assert "'lr'" in line and "'micro_batch_size'" in line


def test_misspelled_key_inside_lora_lists_lora_keys():
    data = base()
    data["policies"]["workers"]["lora"] = {"rank": 4}
    line = line_for(errors_of(data), "policies.workers.lora.rank")
    assert "'r'" in line and "'alpha'" in line and "'target_modules'" in line


def test_misspelled_key_inside_credit_lists_that_methods_keys():
    data = base()
    data["credit"]["invalid_penalti"] = 0.2
    line = line_for(errors_of(data), "credit.invalid_penalti")
    assert "unknown key" in line
    assert "'invalid_penalty'" in line and "'eps'" in line and "'method'" in line


def test_misspelled_key_inside_an_agent_sampling():
    data = base()
    data["agents"][1]["sampling"] = {"temprature": 0.5}
    line = line_for(errors_of(data), "agents[1].sampling.temprature")
    assert "'temperature'" in line and "'top_p'" in line


def test_misspelled_top_level_section():
    data = base()
    data["trainers"] = {"steps": 1}
    line = line_for(errors_of(data), "trainers")
    assert "'trainer'" in line and "'policies'" in line


def test_misspelled_key_inside_a_graph_edge_lists_edge_keys():
    data = base()
    data["topology"] = graph([("a", "orchestrator")], [{"from": "a", "to": "END", "wen": "accept"}])
    line = line_for(errors_of(data), "topology.edges[0].wen")
    assert "'from'" in line and "'to'" in line and "'when'" in line


# --------------------------------------------------------------------------------------------
# bad values and references
# --------------------------------------------------------------------------------------------


def test_unknown_credit_method_names_path_value_and_methods():
    data = base()
    data["credit"] = {"method": "shapley_magic"}
    line = line_for(errors_of(data), "credit.method")
    assert "'shapley_magic'" in line
    for method in ("dr_mas", "grpo", "dr_grpo", "rloo"):
        assert f"'{method}'" in line
    assert "found 'shapley_magic'" in line  # the value found, not the whole section


def test_missing_credit_method_lists_methods():
    data = base()
    data["credit"] = {"invalid_penalty": 0.1}
    line = line_for(errors_of(data), "credit.method")
    assert "missing" in line and "'dr_mas'" in line and "'grpo'" in line


def test_agent_with_undefined_policy_lists_policies():
    data = base()
    data["agents"][1]["policy"] = "ghost"
    line = line_for(errors_of(data), "agents[1].policy")
    assert "'ghost'" in line
    assert "'planner'" in line and "'workers'" in line


def test_unknown_topology_kind_lists_kinds():
    data = base()
    data["topology"] = {"kind": "star", "hub": "orchestrator"}
    line = line_for(errors_of(data), "topology.kind")
    assert "found 'star'" in line
    for kind in ("orchestrator", "debate", "chain", "graph"):
        assert f"'{kind}'" in line


def test_missing_topology_kind_lists_kinds():
    data = base()
    del data["topology"]["kind"]
    line = line_for(errors_of(data), "topology.kind")
    assert "missing" in line and "'chain'" in line and "'graph'" in line


def test_unknown_env_name_lists_envs():
    data = base()
    data["env"] = {"name": "mnist"}
    line = line_for(errors_of(data), "env.name")
    assert "found 'mnist'" in line and "'synthetic_math'" in line and "'gsm8k'" in line


def test_unknown_specialist_lists_agents():
    data = base()
    data["topology"]["specialists"] = ["adder", "multiplier"]
    line = line_for(errors_of(data), "topology.specialists[1]")
    assert "'multiplier'" in line
    assert "'orchestrator'" in line and "'adder'" in line and "'verifier'" in line


def test_unknown_orchestrator_agent():
    data = base()
    data["topology"]["orchestrator"] = "boss"
    line = line_for(errors_of(data), "topology.orchestrator")
    assert "'boss'" in line and "'adder'" in line


def test_chain_loop_to_outside_sequence():
    data = base()
    data["topology"] = {"kind": "chain", "sequence": ["adder", "verifier"], "loop_to": "orchestrator"}
    line = line_for(errors_of(data), "topology.loop_to")
    assert "'orchestrator'" in line and "'adder'" in line and "'verifier'" in line


def test_debate_with_unknown_debater_and_aggregator():
    data = base()
    data["topology"] = {"kind": "debate", "debaters": ["adder", "nobody"], "aggregator": "judge"}
    lines = errors_of(data)
    assert "'nobody'" in line_for(lines, "topology.debaters[1]")
    assert "'judge'" in line_for(lines, "topology.aggregator")


def test_duplicate_agent_name():
    data = base()
    data["agents"][2]["name"] = "adder"
    assert "duplicate" in line_for(errors_of(data), "agents[2].name")


def test_invalid_parser_lists_parsers():
    data = base()
    data["agents"][0]["parser"] = "json"
    line = line_for(errors_of(data), "agents[0].parser")
    assert "'json'" in line
    for parser in ("answer", "orchestrator", "verdict", "raw"):
        assert f"'{parser}'" in line


def test_out_of_range_number_names_path_and_value():
    data = base()
    data["agents"][0]["sampling"] = {"temperature": -1.0}
    line = line_for(errors_of(data), "agents[0].sampling.temperature")
    assert "-1.0" in line and "greater than or equal to 0" in line


def test_missing_required_field():
    data = base()
    del data["agents"][1]["role"]
    assert "missing" in line_for(errors_of(data), "agents[1].role")


def test_lora_settings_on_a_full_policy_is_an_error():
    data = base()
    data["policies"]["planner"]["lora"] = {"r": 4}
    line = line_for(errors_of(data), "policies.planner")
    assert "lora" in line and "'full'" in line


def test_lora_settings_on_a_lora_policy_are_fine():
    data = base()
    data["policies"]["workers"]["lora"] = {"r": 4}
    assert validate_config(data).policies["workers"].lora.r == 4


def test_several_errors_are_all_reported():
    data = base()
    data["trainer"] = {"stepz": 5}
    data["credit"] = {"method": "shapley_magic"}
    data["agents"][0]["sampling"] = {"temperature": -1.0}
    data["policies"]["planner"]["optimm"] = {}
    lines = errors_of(data)
    line_for(lines, "trainer.stepz")
    line_for(lines, "credit.method")
    line_for(lines, "agents[0].sampling.temperature")
    line_for(lines, "policies.planner.optimm")
    assert len(lines) == 4


def test_reference_errors_are_reported_together_with_field_errors():
    """A bad key elsewhere must not hide an agent naming an undefined policy or agent."""
    data = base()
    data["trainer"] = {"stepz": 5}
    data["agents"][1]["policy"] = "ghost"
    data["topology"]["specialists"] = ["adder", "multiplier"]
    lines = errors_of(data)
    line_for(lines, "trainer.stepz")
    assert "'planner'" in line_for(lines, "agents[1].policy")
    assert "'multiplier'" in line_for(lines, "topology.specialists[1]")
    assert len(lines) == 3


def test_error_message_names_the_source():
    data = base()
    data["trainer"] = {"stepz": 5}
    with pytest.raises(ConfigError) as info:
        validate_config(data, "my/team.yaml")
    assert str(info.value).startswith("my/team.yaml: 1 error(s)")


def test_non_mapping_config():
    with pytest.raises(ConfigError) as info:
        validate_config(["team"], "list.yaml")  # type: ignore[arg-type]
    assert "mapping" in info.value.lines[0]


# --------------------------------------------------------------------------------------------
# graph topology structure
# --------------------------------------------------------------------------------------------


def graph(nodes: list[tuple[str, str]], edges: list[dict], entry: str = "a", **extra) -> dict:
    return {"kind": "graph", "entry": entry, "nodes": [{"name": n, "agent": a} for n, a in nodes], "edges": edges, **extra}


LOOP_NODES = [("a", "adder"), ("b", "verifier")]
LOOP_EDGES = [{"from": "a", "to": "b"}, {"from": "b", "to": "a", "when": "reject"}, {"from": "b", "to": "END"}]


def with_topology(topology: dict) -> dict:
    """The base team on ``topology``; a graph keeps only the agents its nodes use (an unused agent is an error)."""
    data = base()
    data["topology"] = topology
    if topology["kind"] == "graph":
        used = {n["agent"] for n in topology["nodes"]}
        data["agents"] = [a for a in data["agents"] if a["name"] in used]
    return data


def test_valid_acyclic_graph():
    data = with_topology(graph(LOOP_NODES, [{"from": "a", "to": "b"}, {"from": "b", "to": "END"}]))
    cfg = validate_config(data, check=meaning_errors)
    assert [e.target for e in cfg.topology.edges] == ["b", "END"]


def test_graph_cycle_without_max_turns_names_max_turns_and_the_cycle():
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, LOOP_EDGES))), "topology.max_turns")
    assert "cycle" in line
    assert "a -> b -> a" in line or "b -> a -> b" in line


def test_graph_cycle_with_max_turns_validates():
    cfg = validate_config(with_topology(graph(LOOP_NODES, LOOP_EDGES, max_turns=6)), check=meaning_errors)
    assert cfg.topology.max_turns == 6


def test_the_structure_is_checked_above_the_schema_and_team_building_refuses_it_first():
    """``mas.config.schema`` sits below the topologies (docs/architecture.md, "Layering"), so it checks the schema
    only; ``mas.config.checks.meaning_errors`` checks the structure, passed to validate_config/load_config
    by the commands, and ``build_team`` refuses a config it flags before anything loads."""
    data = with_topology(graph(LOOP_NODES, LOOP_EDGES))  # a cycle and no max_turns
    cfg = validate_config(data)  # the schema holds
    with pytest.raises(ConfigError, match=r"topology\.max_turns: the graph has a cycle"):
        validate_config(data, check=meaning_errors)
    with pytest.raises(ConfigError, match=r"topology\.max_turns: the graph has a cycle"):
        build_team(cfg)  # before the env or any model is built


def test_graph_self_loop_without_max_turns():
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "b", "when": "reject"}, {"from": "b", "to": "END"}]
    assert "b -> b" in line_for(errors_of(with_topology(graph(LOOP_NODES, edges))), "topology.max_turns")


def test_graph_unreachable_node():
    nodes = LOOP_NODES + [("c", "orchestrator")]
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "END"}, {"from": "c", "to": "END"}]
    line = line_for(errors_of(with_topology(graph(nodes, edges))), "topology.nodes[2].name")
    assert "unreachable" in line and "'c'" in line


def test_graph_without_terminal():
    edges = [{"from": "a", "to": "b"}]
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, edges))), "topology.edges")
    assert "END" in line and "a->b" in line


def test_graph_node_that_cannot_reach_end():
    nodes = LOOP_NODES + [("c", "orchestrator")]
    edges = [{"from": "a", "to": "END", "when": "accept"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"},
             {"from": "c", "to": "b"}]
    lines = errors_of(with_topology(graph(nodes, edges, max_turns=5)))
    assert "cannot reach END" in line_for(lines, "topology.nodes[1].name")
    assert "cannot reach END" in line_for(lines, "topology.nodes[2].name")


def test_graph_edge_to_unknown_node_lists_nodes():
    edges = [{"from": "a", "to": "zz"}, {"from": "b", "to": "END"}]
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, edges))), "topology.edges[0].to")
    assert "'zz'" in line and "'a'" in line and "'b'" in line and "'END'" in line


def test_graph_edge_from_unknown_node_lists_nodes():
    edges = [{"from": "a", "to": "b"}, {"from": "qq", "to": "END"}, {"from": "b", "to": "END"}]
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, edges))), "topology.edges[1].from")
    assert "'qq'" in line and "'a'" in line and "'b'" in line


def test_graph_two_default_edges_out_of_one_node():
    edges = [{"from": "a", "to": "b"}, {"from": "a", "to": "END"}, {"from": "b", "to": "END"}]
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, edges))), "topology.edges[1].when")
    assert "default edge" in line and "'a'" in line


def test_graph_conditional_edges_plus_one_default_are_fine():
    edges = [{"from": "a", "to": "b", "when": "answer"}, {"from": "a", "to": "END"}, {"from": "b", "to": "END", "when": "accept"},
             {"from": "b", "to": "a", "when": "reject"}, {"from": "b", "to": "END"}]
    validate_config(with_topology(graph(LOOP_NODES, edges, max_turns=4)), check=meaning_errors)


def test_graph_unknown_entry():
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "END"}]
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, edges, entry="start"))), "topology.entry")
    assert "'start'" in line and "'a'" in line


def test_graph_node_with_unknown_agent():
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "END"}]
    line = line_for(errors_of(with_topology(graph([("a", "adder"), ("b", "ghost")], edges))), "topology.nodes[1].agent")
    assert "'ghost'" in line and "'adder'" in line


def test_graph_duplicate_node_names_and_end_as_a_node():
    lines = errors_of(with_topology(graph([("a", "adder"), ("a", "verifier")], [{"from": "a", "to": "END"}])))
    line_for(lines, "topology.nodes[1].name")
    lines = errors_of(with_topology(graph([("a", "adder"), ("END", "verifier")], [{"from": "a", "to": "END"}])))
    assert "END" in line_for(lines, "topology.nodes[1].name")


def test_graph_invalid_edge_label_lists_labels():
    edges = [{"from": "a", "to": "b", "when": "maybe"}, {"from": "b", "to": "END"}]
    line = line_for(errors_of(with_topology(graph(LOOP_NODES, edges))), "topology.edges[0].when")
    assert "'maybe'" in line
    for label in ("accept", "reject", "call", "answer"):
        assert f"'{label}'" in line


# --------------------------------------------------------------------------------------------
# loading files
# --------------------------------------------------------------------------------------------


def test_yaml_syntax_error_is_a_config_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("team:\n  name: [unclosed\npolicies: {\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "YAML syntax" in info.value.lines[0]


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.lines == ["file not found"]
    assert str(path) in str(info.value)


def test_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_empty_file_reports_the_missing_sections(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    for section in ("team", "policies", "agents", "topology", "env", "credit"):
        assert any(line.startswith(f"{section}:") and "missing" in line for line in info.value.lines), section


def test_load_config_from_file_with_overrides(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(base()))
    cfg = load_config(path, ["trainer.steps=3", "agents.adder.sampling.temperature=0.25"])
    assert cfg.trainer.steps == 3
    assert cfg.agent("adder").sampling.temperature == 0.25
    assert path.read_text() == yaml.safe_dump(base())  # the file itself is untouched


# --------------------------------------------------------------------------------------------
# overrides
# --------------------------------------------------------------------------------------------


def test_override_sets_an_int():
    out = apply_overrides(base(), ["trainer.steps=5"])
    assert out["trainer"]["steps"] == 5 and isinstance(out["trainer"]["steps"], int)
    assert validate_config(out).trainer.steps == 5


def test_override_values_are_parsed_as_yaml():
    out = apply_overrides(base(), ["trainer.eval_before=false", "policies.planner.optim.lr=1.0e-5",
                                   "topology.specialists=[adder]", "team.name=other"])
    assert out["trainer"]["eval_before"] is False
    assert out["policies"]["planner"]["optim"]["lr"] == pytest.approx(1e-5)
    assert out["topology"]["specialists"] == ["adder"]
    assert out["team"]["name"] == "other"


def test_override_addresses_a_list_entry_by_name():
    out = apply_overrides(base(), ["agents.orchestrator.sampling.temperature=0.5"])
    assert out["agents"][0]["sampling"] == {"temperature": 0.5}
    assert "sampling" not in out["agents"][1]
    assert validate_config(out).agent("orchestrator").sampling.temperature == 0.5


def test_override_addresses_a_list_entry_by_index():
    out = apply_overrides(base(), ["agents.0.name=x"])
    assert [a["name"] for a in out["agents"]] == ["x", "adder", "verifier"]
    out = apply_overrides(base(), ["agents.2.policy=planner"])
    assert out["agents"][2]["policy"] == "planner"


def test_override_does_not_modify_its_input():
    data = base()
    apply_overrides(data, ["trainer.steps=5", "agents.0.name=x"])
    assert data == BASE


def test_overrides_apply_in_order():
    out = apply_overrides(base(), ["trainer.steps=5", "trainer.steps=7"])
    assert out["trainer"]["steps"] == 7


@pytest.mark.parametrize(
    "override",
    [
        "trainer.steps",  # no '='
        "=5",  # no key
        "trainer..steps=5",  # empty key part
        "agents.ghost.policy=planner",  # no agent of that name
        "agents.9.policy=planner",  # index out of range
        "team.name.first=x",  # into a scalar
        "trainer.steps=[1",  # value is not YAML
    ],
)
def test_bad_override_is_a_config_error(override):
    with pytest.raises(ConfigError) as info:
        apply_overrides(base(), [override])
    assert info.value.lines


def test_override_with_bad_value_names_the_path_at_validation(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(base()))
    with pytest.raises(ConfigError) as info:
        load_config(path, ["trainer.steps=many"])
    assert "'many'" in line_for(info.value.lines, "trainer.steps")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["credit.method=shapley_magic"])
    assert "'shapley_magic'" in line_for(info.value.lines, "credit.method")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["agents.adder.policy=ghost"])
    assert "'ghost'" in line_for(info.value.lines, "agents[1].policy")


def test_override_can_fix_an_invalid_file(tmp_path):
    """Overrides are applied before validation, so they can repair a value."""
    data = base()
    data["trainer"] = {"steps": -3}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError):
        load_config(path)
    assert load_config(path, ["trainer.steps=2"]).trainer.steps == 2


# --------------------------------------------------------------------------------------------
# immutability
# --------------------------------------------------------------------------------------------


def test_config_is_frozen():
    cfg = validate_config(base())
    with pytest.raises(pydantic.ValidationError):
        cfg.trainer.steps = 99  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.trainer = cfg.trainer  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.policies["planner"].optim.lr = 1.0  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.agents[0].sampling.temperature = 0.0  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.credit.invalid_penalty = 0.0  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        cfg.topology.max_turns = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.agents[0] = cfg.agents[1]  # type: ignore[index]
    assert cfg.trainer.steps == 10 and cfg.agents[0].name == "orchestrator"


def test_graph_cycle_in_an_unreachable_part_is_an_error_not_a_traceback():
    nodes = LOOP_NODES + [("c", "orchestrator"), ("d", "adder")]
    edges = [{"from": "a", "to": "b"}, {"from": "b", "to": "END"}, {"from": "c", "to": "d"}, {"from": "d", "to": "c"}]
    lines = errors_of(with_topology(graph(nodes, edges)))
    assert "unreachable" in line_for(lines, "topology.nodes[2].name")
    assert "c -> d -> c" in line_for(lines, "topology.max_turns") or "d -> c -> d" in line_for(lines, "topology.max_turns")


@pytest.mark.parametrize("topology,field", [
    ({"kind": "orchestrator", "orchestrator": "orchestrator", "specialists": []}, "topology.specialists"),
    ({"kind": "debate", "debaters": ["adder"]}, "topology.debaters"),
    ({"kind": "chain", "sequence": []}, "topology.sequence"),
    ({"kind": "graph", "entry": "a", "nodes": [], "edges": []}, "topology.nodes"),
])
def test_empty_topologies_are_rejected(topology, field):
    assert line_for(errors_of(with_topology(topology)), field)


def test_orchestrator_cannot_be_its_own_specialist():
    topo = {"kind": "orchestrator", "orchestrator": "orchestrator", "specialists": ["adder", "orchestrator"]}
    assert "own specialist" in line_for(errors_of(with_topology(topo)), "topology.specialists")


def test_chain_verdict_from_must_be_in_the_sequence():
    topo = {"kind": "chain", "sequence": ["adder", "verifier"], "loop_to": "adder", "verdict_from": "orchestrator"}
    assert "not in sequence" in line_for(errors_of(with_topology(topo)), "topology.verdict_from")


def test_full_fine_tuning_in_bfloat16_is_refused_with_the_alternatives():
    data = base()
    data["policies"]["planner"]["dtype"] = "bfloat16"
    line = line_for(errors_of(data), "policies.planner")
    assert "float32" in line and "lora" in line
    data["policies"]["planner"]["kind"] = "lora"
    validate_config(data)  # adapters on a bfloat16 base are fine


def test_optimizer_settings_on_a_frozen_policy_are_refused():
    data = base()
    data["policies"]["planner"] = {"kind": "frozen", "model": "x/y", "optim": {"lr": 1e-5}}
    assert "frozen" in line_for(errors_of(data), "policies.planner")


def test_rollout_batch_tokens_is_for_the_hf_backend_only():
    data = base()
    data["policies"]["planner"]["rollout_batch_tokens"] = 8192
    assert validate_config(data).policies["planner"].rollout_batch_tokens == 8192
    data["policies"]["planner"]["backend"] = "vllm"
    line = line_for(errors_of(data), "policies.planner")
    assert "rollout_batch_tokens" in line and "backend: hf" in line


@pytest.mark.parametrize("credit,path", [
    ({"method": "m_grpo", "main_agent": "boss"}, "credit.main_agent"),
    ({"method": "critic", "critic": "oracle"}, "credit.critic"),
    ({"method": "sharp", "exclude": ["nobody"]}, "credit.exclude[0]"),
    ({"method": "ccpo", "upstream": "ghost"}, "credit.upstream"),
    ({"method": "c3", "fanout": [3, 2]}, "trainer.group_size"),
])
def test_credit_methods_naming_missing_agents_or_policies_fail_at_load_time(credit, path):
    data = base()
    data["credit"] = credit
    data["trainer"] = {"group_size": 4}
    assert line_for(errors_of(data), path)


def test_an_error_shows_a_long_path_whole_and_cuts_a_huge_value():
    """A model path in a deep folder (test runners and CI put them there) is named whole in the
    error about it; a value of 10^5 characters is cut, not printed."""
    from mas.config.schema import issue_lines

    deep = "/tmp/" + "/".join(f"folder-{i:02d}" for i in range(20)) + "/no.gguf"  # 200 characters
    assert len(deep) > 150
    (line,) = issue_lines([(("policies", "main", "model"), deep, "GGUF file does not exist")])
    assert deep in line and line.startswith("policies.main.model: GGUF file does not exist")
    (line,) = issue_lines([(("team", "name"), "x" * 100_000, "too long")])
    assert len(line) < 1_000 and "..." in line
