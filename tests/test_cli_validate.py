"""``mas validate``: the resolved config for a good file, every error with its path for a bad one."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from mas.cli import main
from mas.config.schema import validate_config

REPO = Path(__file__).parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"

GOOD: dict = {
    "team": {"name": "cli-team"},
    "policies": {"main": {"model": "some/hub-id"}},
    "agents": [
        {"name": "orchestrator", "policy": "main", "role": "You delegate.", "parser": "orchestrator"},
        {"name": "adder", "policy": "main", "role": "You add."},
    ],
    "topology": {"kind": "orchestrator", "orchestrator": "orchestrator", "specialists": ["adder"]},
    "env": {"name": "synthetic_math"},
    "credit": {"method": "grpo"},
}


def write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture()
def good(tmp_path) -> Path:
    return write(tmp_path, "good.yaml", GOOD)


@pytest.fixture()
def bad(tmp_path) -> Path:
    data = copy.deepcopy(GOOD)
    data["trainer"] = {"stepz": 5}
    data["credit"] = {"method": "shapley_magic"}
    data["agents"][1]["policy"] = "ghost"
    data["policies"]["main"]["optimm"] = {}
    return write(tmp_path, "bad.yaml", data)


BAD_PATHS = ("trainer.stepz", "credit.method", "agents[1].policy", "policies.main.optimm")


def test_validate_good_file_prints_the_resolved_config(good, capsys):
    assert main(["validate", str(good)]) == 0
    out, err = capsys.readouterr()
    # the only remark: the hub model cannot be had offline here (a warning: the config may be for another machine)
    assert err.splitlines() == [f"{good}: warning: policies.main.model: not in the local Hugging Face cache and "
                                "HF_HUB_OFFLINE is set; download it where there is network (`hf download some/hub-id`) "
                                "or give a local path (found 'some/hub-id') [on this machine]"]
    assert "# policies.main.optim.lr: unset: chosen by the model's size when its config is downloaded" in out
    assert f"# {good}: ok" in out
    assert "micro_batch_size: 8" in out  # a default the file does not set
    assert "max_new_tokens: 64" in out
    assert "clip_high: 0.2" in out
    resolved = yaml.safe_load(out)  # the header is a comment: the rest is the config as YAML
    assert resolved["policies"]["main"]["optim"]["micro_batch_size"] == 8
    assert resolved["trainer"]["steps"] == 10
    assert resolved["credit"] == {"method": "grpo", "normaliser": "group", "scale_by_std": True, "eps": 1e-6, "invalid_penalty": 0.0}
    assert validate_config(resolved) == validate_config(copy.deepcopy(GOOD))


def test_validate_quickstart_resolved_config(capsys):
    assert main(["validate", str(QUICKSTART)]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["team"]["name"] == "quickstart"
    assert resolved["policies"]["planner"]["optim"]["micro_batch_size"] == 64
    assert resolved["policies"]["planner"]["optim"]["weight_decay"] == 0.0  # default


def test_validate_quiet_prints_only_ok(good, capsys):
    assert main(["validate", "-q", str(good)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{good}: ok (1 warning(s))"  # the hub model is not in this machine's cache
    assert err.count("warning:") == 1
    assert main(["validate", "-q", str(good), "policies.main.model=embedded"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{good}: ok" and err == ""


def test_validate_bad_file_lists_every_error_with_its_path(bad, capsys):
    status = main(["validate", str(bad)])
    out, err = capsys.readouterr()
    assert status != 0
    assert out == ""
    assert f"{bad}: {len(BAD_PATHS)} error(s)" in err
    for path in BAD_PATHS:
        assert f"  - {path}: " in err, path
    assert "'shapley_magic'" in err and "'dr_mas'" in err
    assert "'steps'" in err
    assert "'ghost'" in err and "'main'" in err
    assert "Traceback" not in err


def test_validate_bad_file_quiet_still_lists_errors(bad, capsys):
    assert main(["validate", "-q", str(bad)]) != 0
    out, err = capsys.readouterr()
    assert out == ""
    for path in BAD_PATHS:
        assert f"  - {path}: " in err


def test_validate_several_files_reports_each(good, bad, capsys):
    status = main(["validate", "-q", str(good), str(bad), *map(str, sorted((REPO / "configs").glob("*.yaml")))])
    out, err = capsys.readouterr()
    assert status != 0
    assert f"{good}: ok" in out and f"{bad}: ok" not in out
    assert str(QUICKSTART) + ": ok" in out
    assert f"{bad}: {len(BAD_PATHS)} error(s)" in err


def test_validate_with_overrides(good, capsys):
    assert main(["validate", str(good), "--set", "trainer.steps=3", "--set", "agents.adder.sampling.temperature=0.5"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["trainer"]["steps"] == 3
    assert resolved["agents"][1]["sampling"]["temperature"] == 0.5


def test_validate_with_bad_override_value(good, capsys):
    assert main(["validate", str(good), "--set", "trainer.steps=-1"]) != 0
    err = capsys.readouterr().err
    assert "trainer.steps:" in err and "-1" in err


def test_validate_with_malformed_override(good, capsys):
    assert main(["validate", str(good), "--set", "agents.ghost.policy=main"]) != 0
    err = capsys.readouterr().err
    assert "ghost" in err and "Traceback" not in err


def test_validate_missing_file(tmp_path, capsys):
    path = tmp_path / "missing.yaml"
    assert main(["validate", str(path)]) != 0
    err = capsys.readouterr().err
    assert str(path) in err and "file not found" in err


def test_validate_yaml_syntax_error(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("team: [unclosed\n")
    assert main(["validate", str(path)]) != 0
    err = capsys.readouterr().err
    assert str(path) in err and "YAML syntax" in err


def test_validate_needs_a_file(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate"])
    assert info.value.code != 0


@pytest.mark.parametrize("key,value,message", [
    ("policies.main.resources.num_gpus", "-1", "policies.main.resources.num_gpus: Input should be greater than or equal to 0 (found -1)"),
    ("policies.main.resources.gpus", "1", "policies.main.resources.gpus: unknown key; did you mean 'num_gpus'? valid: ['custom', 'num_cpus', 'num_gpus']"),
    ("policies.main.resources.custom", "{node_a: -0.5}", "policies.main.resources.custom.node_a: Input should be greater"),
    ("policies.main.workers", "0", "policies.main.workers: Input should be greater than or equal to 1"),
    ("runtime.adress", "auto", "runtime.adress: unknown key"),
    ("runtime.kind", "slurm", "runtime.kind: invalid value; valid: 'local' or 'ray'"),
    ("runtime.address", "somewhere", "address 'somewhere': valid: null (start a local Ray), 'auto', 'host:port' or 'ray://host:port'"),
    ("trainer.max_staleness", "2", "trainer.max_staleness: invalid value; valid: 0 or 1"),
])
def test_bad_runtime_and_resources_entries_are_rejected_with_their_yaml_path(good, capsys, key, value, message):
    overrides = ["--set", "runtime.kind=ray", "--set", f"{key}={value}"] if key != "runtime.kind" else ["--set", f"{key}={value}"]
    assert main(["validate", str(good), *overrides]) == 1
    assert message in capsys.readouterr().err


def test_lora_policies_on_one_base_share_an_actor_so_their_resources_must_agree(tmp_path, capsys):
    data = copy.deepcopy(GOOD)
    data["policies"] = {name: {"kind": "lora", "model": "some/hub-id", "resources": {"num_cpus": cpus}}
                        for name, cpus in (("alpha", 1), ("beta", 2))}
    data["agents"][0]["policy"], data["agents"][1]["policy"] = "alpha", "beta"
    assert main(["validate", str(write(tmp_path, "lora.yaml", data))]) == 1
    assert "policies.beta.resources: LoRA policies on one base share one actor; set the same resources as policies.alpha.resources" in capsys.readouterr().err


def test_validate_refuses_an_unknown_verifier_with_the_valid_names(good, capsys):
    assert main(["validate", "-q", str(good), "policies.main.model=embedded", "verifier.name=gold_oracle"]) != 0
    err = capsys.readouterr().err
    assert "  - verifier.name: unknown verifier 'gold_oracle'; valid: auto, none, facts, hotpotqa, synthetic_math, team_conjunctive, team_fork, " \
           "team_relay, team_saboteur, or 'package.module:function' (found 'gold_oracle')" in err
    assert main(["validate", "-q", str(good), "policies.main.model=embedded", "verifier.name=no_such_pkg.checks:verify"]) != 0
    err = capsys.readouterr().err
    assert "  - verifier.name: cannot import 'no_such_pkg.checks'" in err and "valid: auto, none," in err
    # a registered name and a reference that imports are fine
    assert main(["validate", "-q", str(good), "policies.main.model=embedded", "verifier.name=team_relay"]) == 0
    assert main(["validate", "-q", str(good), "policies.main.model=embedded",
                 "verifier.name=mas.envs.math.turns:verify_math_turn"]) == 0


def test_newcomer_mistakes_get_named(good, tmp_path, capsys):
    """A misspelt key suggests the right one; an unknown list entry lists the valid names; a YAML
    syntax error names the file; an absurd learning rate and a group of one are caught."""
    assert main(["validate", "-q", str(good), "trainer.stpes=3"]) == 1
    assert "trainer.stpes: unknown key; did you mean 'steps'?" in capsys.readouterr().err
    assert main(["validate", "-q", str(good), "agents.addr.role=x"]) == 1
    err = capsys.readouterr().err
    assert "no list entry named 'addr'; did you mean 'adder'? valid: ['orchestrator', 'adder']" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("team: {name: x\n")
    assert main(["validate", "-q", str(broken)]) == 1
    err = capsys.readouterr().err
    assert f'in "{broken}"' in err and "<unicode string>" not in err
    assert main(["validate", "-q", str(good), "policies.main.optim.lr=1e5"]) == 1
    assert "policies.main.optim.lr: a learning rate must be > 0 and < 1: AdamW moves" in capsys.readouterr().err
    assert main(["validate", "-q", str(good), "trainer.group_size=1"]) == 1
    assert "trainer.group_size: credit 'grpo': normaliser 'group' takes its mean and std over each task's group" \
           in capsys.readouterr().err


def test_version(capsys):
    from mas.version import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"mas {__version__}"
