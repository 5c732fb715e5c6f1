"""Defaults that work: the learning rate by model, checkpoints about every 10% of the steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from team_helpers import team_config

from mas.cli import main
from mas.config.schema import TrainerConfig
from mas.config.defaults import EMBEDDED_LR, default_lr, lr_table_markdown, model_parameters

REPO = Path(__file__).parents[1]


def test_default_lr_follows_the_size_bands_and_lora_factor():
    # full fine-tuning: one rate per band (lower bound inclusive); LoRA: ten times the row
    assert default_lr("full", 220_000) == 1e-4  # < 10M
    assert default_lr("full", 135_000_000) == 2e-6  # 100M–1B
    assert default_lr("full", 99_999_999) == 1e-5  # just under 100M
    assert default_lr("full", 494_000_000) == 2e-6  # Qwen2.5-0.5B
    assert default_lr("lora", 494_000_000) == pytest.approx(2e-5)
    assert default_lr("full", 1_000_000_000) == 1e-6  # the bound belongs to the band above
    assert default_lr("lora", 7_600_000_000) == pytest.approx(1e-5)
    assert default_lr("full", 72_000_000_000) == 5e-7
    assert default_lr("full", 405_000_000_000) == 2e-7
    assert default_lr("full", None) == EMBEDDED_LR and default_lr("lora", None) == pytest.approx(10 * EMBEDDED_LR)


def test_the_readme_and_docs_show_the_table_the_code_uses():
    table = lr_table_markdown()
    assert "| 100M – 1B | 2e-6 | 2e-5 |" in table
    assert table in (REPO / "README.md").read_text()
    assert table in (REPO / "docs" / "running.md").read_text()


def test_parameters_are_counted_from_the_config_without_loading_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model_parameters(str(tiny_model_dir)) == sum(p.numel() for p in loaded.parameters())


def test_save_every_defaults_to_about_ten_percent_of_the_steps():
    assert TrainerConfig(steps=40).save_every == 4
    assert TrainerConfig(steps=200).save_every == 20
    assert TrainerConfig(steps=4).save_every == 1  # at least every step
    assert TrainerConfig(steps=35).save_every == 4  # round(3.5) = 4
    assert TrainerConfig(steps=40, save_every=0).save_every == 0  # explicit: only at the end / when stopped
    assert TrainerConfig().save_every == 1 and TrainerConfig().keep_last == 3


def unset_lr_config(tmp_path, model_dir, kind="full") -> Path:
    cfg = team_config(model_dir, "chain")
    cfg["policies"]["main"] = {"kind": kind, "model": str(model_dir), "device": "cpu", "optim": {"micro_batch_size": 4}}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_fills_an_unset_lr_and_says_so_everywhere(tmp_path, tiny_model_dir, capsys):
    path = unset_lr_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", str(path), "trainer.steps=1", "--run-dir", str(run)]) == 0
    err = capsys.readouterr().err
    assert "policies.main.optim.lr = 0.0001 (unset: the default for kind full on a 0.102M-parameter model)" in err
    assert yaml.safe_load((run / "config.yaml").read_text())["policies"]["main"]["optim"]["lr"] == 1e-4
    info = json.loads((run / "run_info.json").read_text())
    assert info["policies"]["main"]["lr"] == 1e-4 and "policies.main.optim.lr" in info["defaults"]
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert step["policies"]["main"]["lr"] == pytest.approx(1e-4)  # the optimiser ran at it


def test_validate_shows_the_resolved_lr(tmp_path, tiny_model_dir, capsys):
    path = unset_lr_config(tmp_path, tiny_model_dir, kind="lora")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# policies.main.optim.lr: 0.001 (unset: the default for kind lora on a 0.102M-parameter model)" in out
    assert yaml.safe_load(out)["policies"]["main"]["optim"]["lr"] == pytest.approx(1e-3)


def test_validate_resolves_the_embedded_rate_without_building_the_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "empty-cache"))
    quickstart = REPO / "configs" / "quickstart.yaml"
    assert main(["validate", str(quickstart), "policies.planner.optim.lr=null", "policies.workers.optim.lr=null"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["policies"]["planner"]["optim"]["lr"] == EMBEDDED_LR == resolved["policies"]["workers"]["optim"]["lr"]
    assert not (tmp_path / "empty-cache").exists()  # nothing was built to find the rate
