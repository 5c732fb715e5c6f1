"""A user's mistakes and broken files get a message and a non-zero exit, never a Python traceback
(issue 55): the CLI over a corpus of broken configs, broken checkpoints and failing teams.

Each case runs ``mas`` through its entry point (``mas.cli.main``) in this process: an exception
that escaped it would be the traceback a user sees, and fails the case as one.  Each asserts the
exit code, that the message names what is wrong (the field, the policy and file, the teacher's
task) and that nothing on stderr is a traceback.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from team_helpers import team_config

from mas.cli import main

ROOT = Path(__file__).parents[1]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return code, text


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir):
    """One step of a tiny team with a checkpoint; each test damages its own copy."""
    base = tmp_path_factory.mktemp("corpus")
    cfg = base / "team.yaml"
    cfg.write_text(yaml.safe_dump(team_config(tiny_model_dir, "orchestrator")))
    run = base / "run"
    assert main(["train", str(cfg), "trainer.steps=1", "trainer.eval_size=0", "--run-dir", str(run)]) == 0
    return cfg, run


def copy_run(trained_run, tmp_path) -> tuple[Path, Path, Path]:
    cfg, run = trained_run
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return cfg, dest, dest / "checkpoints" / "step_000000"


# --- broken configs ------------------------------------------------------------------------------

def custom_env_config(tmp_path: Path, **env) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "langgraph_custom.yaml").read_text())
    data["env"].update({"tasks": str(ROOT / "examples" / "data" / "sums.jsonl"), **env})
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


CONFIG_CASES = {
    # a misspelt reward function: mas validate said it; mas train crashed in build_env
    "misspelt_reward": (lambda p: custom_env_config(p, reward="examples.rewards:scor"),
                        "env: the data cannot be read: env.reward: 'examples.rewards' has no attribute 'scor'"),
    "missing_task_file": (lambda p: custom_env_config(p, tasks=str(p / "nope.jsonl")), "env: the data cannot be read"),
    "yaml_syntax": (lambda p: (p / "team.yaml").write_text("team: {name: x\n") and p / "team.yaml", "team.yaml"),
    "unknown_key": (lambda p: custom_env_config(p, rewardz="x"), "env.rewardz"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_broken_config_stops_train_and_validate_with_its_field_named(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # examples.rewards is found from the repository root, as the README runs it
    make, needle = CONFIG_CASES[case]
    path = make(tmp_path)
    code, text = run_cli(["train", path, "trainer.steps=1", "--run-dir", tmp_path / "run"], capsys)
    assert code != 0 and needle in text, text
    code, text = run_cli(["validate", "-q", path], capsys)
    assert code != 0 and needle in text, text


# --- broken checkpoints ----------------------------------------------------------------------------

def cut_weights(ckpt: Path) -> Path:
    path = ckpt / "policies" / "main" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:300])  # a copy that stopped, a disk that filled
    return path


def test_exporting_a_cut_checkpoint_names_the_policy_and_the_file(trained_run, tmp_path, capsys):
    _, run, ckpt = copy_run(trained_run, tmp_path)
    bad = cut_weights(ckpt)
    code, text = run_cli(["export", run, "--out", tmp_path / "out"], capsys)
    assert code == 2 and f"policy 'main': the checkpoint {ckpt} is damaged: {bad}: " in text, text
    assert "cut short" in text and not (tmp_path / "out").exists()  # nothing half-written


def test_exporting_a_checkpoint_whose_config_is_not_json_names_it(trained_run, tmp_path, capsys):
    _, run, ckpt = copy_run(trained_run, tmp_path)
    (ckpt / "policies" / "main" / "config.json").write_text("{not json")
    code, text = run_cli(["export", run, "--out", tmp_path / "out", "--gguf"], capsys)
    assert code == 2 and f"{ckpt / 'policies' / 'main' / 'config.json'}: not valid JSON" in text, text


def test_resuming_or_evaluating_a_cut_checkpoint_names_the_policy_and_the_file(trained_run, tmp_path, capsys):
    cfg, run, ckpt = copy_run(trained_run, tmp_path)
    bad = cut_weights(ckpt)
    code, text = run_cli(["train", "--resume", run, "trainer.steps=2"], capsys)
    assert code == 2 and "policy 'main'" in text and str(bad) in text, text
    code, text = run_cli(["eval", cfg, "--checkpoint", run, "--size", "2"], capsys)
    assert code == 2 and "policy 'main'" in text and str(bad) in text, text


def config_not_json(ckpt: Path) -> Path:
    path = ckpt / "policies" / "main" / "config.json"
    path.write_text("{not json")
    return path


SERVE_DAMAGE = {"cut_weights": (cut_weights, "cut short"), "config_not_json": (config_not_json, "not valid JSON")}


@pytest.mark.parametrize("damage", list(SERVE_DAMAGE))
def test_serving_a_damaged_checkpoint_names_the_policy_and_the_file_and_serves_nothing(damage, trained_run, tmp_path,
                                                                                      capsys):
    _, run, ckpt = copy_run(trained_run, tmp_path)
    assert not (run / "checkpoints" / "best").exists()  # mas serve takes the latest checkpoint: the one damaged here
    make, words = SERVE_DAMAGE[damage]
    bad = make(ckpt)
    code, text = run_cli(["serve", run, "--port", "0"], capsys)
    assert code == 2 and f"policy 'main': the checkpoint {ckpt} is damaged: {bad}: " in text and words in text, text
    assert "base_url" not in text and "loaded" not in text  # refused before any model loaded or anything was served


def test_resuming_with_a_damaged_trainer_state_says_which_file(trained_run, tmp_path, capsys):
    _, run, ckpt = copy_run(trained_run, tmp_path)
    (ckpt / "trainer_state.json").write_text('{"step": 0, ')
    code, text = run_cli(["train", "--resume", run, "trainer.steps=2"], capsys)
    assert code == 2 and f"{ckpt / 'trainer_state.json'}: cannot be read" in text, text


# --- failing teams -------------------------------------------------------------------------------

def test_a_warm_up_whose_teacher_hits_the_model_call_cap_stops_with_what_to_change(tmp_path, monkeypatch, capsys):
    """The LangGraph solver/checker needs two model calls; at a cap of one every teacher episode fails."""
    monkeypatch.chdir(ROOT)
    code, text = run_cli(["train", "configs/langgraph_custom.yaml", "topology.max_model_calls=1", "trainer.steps=1",
                          "trainer.eval_size=0", "trainer.warmup.steps=1", "trainer.warmup.episodes=2",
                          "--run-dir", tmp_path / "run"], capsys)
    assert code == 2, text
    assert "trainer.warmup: 2 of the scripted teacher's 2 episodes failed" in text
    assert "model call limit" in text and "raise topology.max_model_calls" in text
    assert "trainer.warmup.demonstrations" in text and "trainer.warmup.steps=0" in text
