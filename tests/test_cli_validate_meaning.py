"""`mas validate`: a config means what it says. A team that cannot do what its config says is
an error naming the YAML path; one that runs but probably not as meant gets a warning; one
override syntax for every command, and switching a section's kind replaces the section."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from mas.agents.parsers import PARSERS
from mas.agents.parsers import PARSER_LABELS
from mas.cli import main
from mas.config.schema import ConfigError, load_config

TEAM: dict = {
    "team": {"name": "meaning"},
    "policies": {"main": {"model": "embedded"}, "judge": {"kind": "frozen", "model": "embedded"}},
    "agents": [
        {"name": "lead", "policy": "main", "role": "You delegate.", "parser": "orchestrator"},
        {"name": "adder", "policy": "main", "role": "You add."},
        {"name": "checker", "policy": "judge", "role": "You check.", "parser": "verdict"},
    ],
    "topology": {"kind": "orchestrator", "orchestrator": "lead", "specialists": ["adder", "checker"]},
    "env": {"name": "synthetic_math"},
    "credit": {"method": "dr_mas", "invalid_penalty": 0.1},
    "trainer": {"steps": 20},
}


def write(tmp_path: Path, data: dict, name: str = "team.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def validate(tmp_path, capsys, data: dict, *args: str) -> tuple[int, str, str]:
    status = main(["validate", str(write(tmp_path, data)), *args])
    out, err = capsys.readouterr()
    return status, out, err


def with_(**sections) -> dict:
    data = copy.deepcopy(TEAM)
    data.update(copy.deepcopy(sections))
    return data


def test_the_team_itself_is_fine(tmp_path, capsys):
    status, out, err = validate(tmp_path, capsys, TEAM)
    assert status == 0 and err == "", err


def test_a_deliberately_wrong_team_gets_every_error_by_name(tmp_path, capsys):
    data = copy.deepcopy(TEAM)
    data["agents"][0]["parser"] = "answer"  # the orchestrator can no longer delegate
    data["agents"].append({"name": "critic", "policy": "main", "role": "You criticise."})  # in no topology part
    status, out, err = validate(tmp_path, capsys, data)
    assert status == 1 and out == ""
    assert "2 error(s)" in err
    assert ("  - agents[0].parser: agent 'lead' is topology.orchestrator and must delegate with CALL <agent>: <subtask> "
            "(without it no specialist is ever called), but parser 'answer' never gives CALL; valid: ['orchestrator'] "
            "(found 'answer')") in err
    assert "  - agents[3].name: no part of the topology (orchestrator) uses this agent" in err and "'critic'" in err
    assert "Traceback" not in err
    # the data is checked once the config itself is sound, as train does before loading any model
    data = copy.deepcopy(TEAM)
    data["trainer"]["eval_size"] = 100_000  # more than the held-out split of the env
    status, out, err = validate(tmp_path, capsys, data)
    assert status == 1 and "  - trainer.eval_size: 100000 is too many:" in err and "(found 100000)" in err


def test_train_refuses_the_same_errors_before_loading_anything(tmp_path, capsys):
    data = copy.deepcopy(TEAM)
    data["agents"][0]["parser"] = "raw"
    assert main(["train", str(write(tmp_path, data)), "--run-dir", str(tmp_path / "run")]) == 2
    assert "agents[0].parser" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_chain_loop_needs_a_judge_that_can_say_reject(tmp_path, capsys):
    chain = {"kind": "chain", "sequence": ["lead", "adder", "checker"], "loop_to": "lead", "verdict_from": "adder"}
    status, _, err = validate(tmp_path, capsys, with_(topology=chain))
    assert status == 1
    assert "agents[1].parser: agent 'adder' decides the loop back to topology.loop_to (topology.verdict_from)" in err
    assert "never gives REJECT; valid: ['verdict']" in err
    chain["verdict_from"] = None  # the last agent (checker, parser verdict) decides: fine
    assert validate(tmp_path, capsys, with_(topology=chain))[0] == 0


def test_a_graph_edge_label_the_source_never_produces_names_the_edge(tmp_path, capsys):
    graph = {"kind": "graph", "entry": "d", "max_turns": 4,
             "nodes": [{"name": "d", "agent": "lead"}, {"name": "a", "agent": "adder"}, {"name": "c", "agent": "checker"}],
             "edges": [{"from": "d", "to": "a", "when": "call"}, {"from": "d", "to": "c"},
                       {"from": "a", "to": "END", "when": "accept"}, {"from": "a", "to": "c"},
                       {"from": "c", "to": "END"}]}
    status, _, err = validate(tmp_path, capsys, with_(topology=graph))
    assert status == 1 and "1 error(s)" in err
    assert ("topology.edges[2].when: node 'a' is agent 'adder', whose parser 'answer' only gives ['answer']: "
            "this edge is never taken") in err


def test_warnings_say_what_the_team_will_not_do(tmp_path, capsys):
    data = copy.deepcopy(TEAM)
    data["policies"]["spare"] = {"model": "embedded"}
    status, out, err = validate(tmp_path, capsys, data)
    assert status == 0 and "# " in out
    assert "warning: policies.spare: no agent uses this policy (nor credit.critic)" in err
    assert main(["validate", "--strict", str(write(tmp_path, data))]) == 1  # warnings fail with --strict
    capsys.readouterr()

    frozen = copy.deepcopy(TEAM)
    frozen["policies"]["main"] = {"kind": "frozen", "model": "embedded"}
    assert "every agent's policy is frozen" in validate(tmp_path, capsys, frozen)[2]

    two = copy.deepcopy(TEAM)
    two["policies"]["solo"] = {"model": "embedded"}
    two["agents"][1]["policy"] = "solo"
    two["trainer"]["alternate"] = ["main"]
    assert "trainer.alternate: policy 'solo' is trainable and used by agents but not listed here" in \
        validate(tmp_path, capsys, two)[2]


def test_train_failed_naming_a_failure_the_config_cannot_have_is_said(tmp_path, capsys):
    data = copy.deepcopy(TEAM)
    data["trainer"]["train_failed"] = ["agent_error", "model_call_limit", "episode_timeout"]
    status, _, err = validate(tmp_path, capsys, data)
    assert status == 0
    assert "warning: trainer.train_failed: names episode_timeout, but runtime.episode_timeout_s is not set" in err
    assert "names model_call_limit, but a team of kind orchestrator has no cap on model calls" in err
    data["runtime"] = {"episode_timeout_s": 60}
    data["trainer"]["train_failed"] = ["agent_error", "episode_timeout"]
    assert "train_failed" not in validate(tmp_path, capsys, data)[2]
    # a LangGraph team that leaves max_model_calls out has a cap all the same (derived from its recursion_limit)
    langgraph = Path(__file__).parents[1] / "configs" / "langgraph_custom.yaml"
    assert "max_model_calls" not in langgraph.read_text()
    assert main(["validate", "-q", str(langgraph), "trainer.train_failed=[model_call_limit]"]) == 0
    assert "train_failed" not in capsys.readouterr().err
    data["trainer"]["train_failed"] = ["backend_error"]  # never the policy's doing: refused, with the valid values
    status, _, err = validate(tmp_path, capsys, data)
    assert status != 0 and "trainer.train_failed" in err and "agent_error" in err and "episode_timeout" in err


def test_sharp_exclude_null_dropping_a_debater_is_said_out_loud(tmp_path, capsys):
    debate = {"kind": "debate", "debaters": ["lead", "adder", "checker"], "rounds": 2}
    data = with_(topology=debate, credit={"method": "sharp"})
    data["agents"][0]["parser"] = "answer"
    status, _, err = validate(tmp_path, capsys, data)
    assert status == 0
    assert ("warning: credit.exclude: in this debate (majority vote) debater 'checker' speaks last in every episode, "
            "so SHARP drops it from the players: it gets no Shapley credit (φ = 0) and is re-sampled in every "
            "coalition; write exclude: ['checker'] to say so, or write exclude: [] to make every agent a player") in err
    data["credit"]["exclude"] = []  # said explicitly: no warning
    assert "credit.exclude" not in validate(tmp_path, capsys, data)[2]
    orchestrated = with_(credit={"method": "sharp"})
    assert "SHARP leaves out the agent who speaks last in each episode (here 'lead')" in \
        validate(tmp_path, capsys, orchestrated)[2]


def test_machine_problems_are_warnings_for_validate_and_errors_for_train(tmp_path, capsys):
    data = copy.deepcopy(TEAM)
    data["policies"]["main"]["model"] = str(tmp_path / "no-such-model")
    status, _, err = validate(tmp_path, capsys, data)
    assert status == 0 and "policies.main.model: local path does not exist" in err and "[on this machine]" in err
    assert main(["train", str(write(tmp_path, data)), "--run-dir", str(tmp_path / "run")]) == 2
    assert "policies.main.model: local path does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("text, label", [
    ("ANSWER: 5", "answer"), ("CALL adder: 2+3", "call"), ("ACCEPT", "accept"), ("REJECT ANSWER: 4", "reject"), ("7", "answer"),
])
def test_parser_labels_list_what_each_parser_can_give(text, label):
    """PARSER_LABELS, which the checks read, holds exactly the labels the built-in parsers produce
    (a plugin's parser is not listed, so not checked)."""
    builtin = {name: PARSERS[name] for name in ("answer", "orchestrator", "verdict", "raw")}
    for name, parse in builtin.items():
        got = parse(text)[0].get("label")
        if got is not None:
            assert got in PARSER_LABELS[name], (name, text)
    assert set(PARSER_LABELS) == set(builtin)
    producers = {name for name, parse in builtin.items() if parse(text)[0].get("label") == label}
    assert producers and all(label in PARSER_LABELS[n] for n in producers)
    assert {n for n, labels in PARSER_LABELS.items() if label in labels} >= producers


# -- one override syntax ---------------------------------------------------------------------


def test_every_command_takes_bare_overrides_and_validate_keeps_set(tmp_path, capsys):
    path = write(tmp_path, TEAM)
    assert main(["validate", str(path), "trainer.steps=3", "--set", "trainer.seed=7"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["trainer"]["steps"] == 3 and resolved["trainer"]["seed"] == 7
    assert main(["show", str(path), "topology.max_turns=9"]) == 0
    assert "topology: orchestrator (at most 9 turns)" in capsys.readouterr().out
    # options may come between the config and its overrides
    assert main(["validate", "-q", str(path), "--strict", "trainer.steps=bad"]) == 1
    assert "trainer.steps" in capsys.readouterr().err


def test_switching_a_sections_kind_replaces_its_block(tmp_path, capsys):
    path = write(tmp_path, TEAM)  # credit: {method: dr_mas, invalid_penalty: 0.1}
    cfg = load_config(path, ["credit.lambda_s=0.5", "credit.method=sharp"])  # any order
    assert cfg.credit.method == "sharp" and cfg.credit.lambda_s == 0.5 and cfg.credit.mask_mode == "mask"
    assert load_config(path, ["credit.method=dr_mas"]).credit.invalid_penalty == 0.1  # same kind: merged
    cfg = load_config(path, ["topology.kind=debate", "topology.debaters=[lead,adder,checker]", "agents.lead.parser=answer"])
    assert cfg.topology.kind == "debate" and cfg.topology.rounds == 2
    with pytest.raises(ConfigError) as e:  # the new kind's required fields are asked for, by path
        load_config(path, ["topology.kind=chain"])
    assert "topology.sequence: missing required field" in str(e.value)
    lora = load_config(path, ["policies.main.kind=lora", "policies.main.lora.r=4"])
    assert lora.policies["main"].lora.r == 4
    full = load_config(write(tmp_path, yaml.safe_load(yaml.safe_dump(lora.model_dump(mode="json"))), "lora.yaml"),
                       ["policies.main.kind=full"])
    assert full.policies["main"].kind == "full" and full.policies["main"].lora is None
    frozen = load_config(path, ["policies.main.kind=frozen", "policies.judge.kind=full"])
    assert frozen.policies["main"].optim is None and frozen.policies["judge"].optim is not None
