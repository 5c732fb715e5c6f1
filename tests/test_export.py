"""`mas export`: trained policies as standalone Hugging Face models, LoRA merged, pushed to a
hub (a local stand-in for its HTTP API; the real huggingface_hub client talks to it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from hub_stub import FakeHub, closed_port  # noqa: F401 (a fixture)
from team_helpers import team_config, varied_reward

from mas.agents.policy import peft_quietly
from mas.cli import main


def train_run(tmp_path: Path, model_dir: Path, kind: str, monkeypatch) -> Path:
    from mas.envs.math.synthetic import SyntheticMathEnv

    monkeypatch.setattr(SyntheticMathEnv, "score", lambda self, ep: varied_reward(ep))  # something to learn
    cfg = team_config(model_dir, "chain")
    cfg["policies"]["main"]["kind"] = kind
    cfg["trainer"] = {**cfg["trainer"], "steps": 1}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert main(["train", str(path), "--run-dir", str(run)]) == 0
    return run


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_checkpoint_names_its_base_relative_to_the_run_and_exports_merged(tmp_path, tiny_model_dir, capsys, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = train_run(tmp_path, tiny_model_dir, "lora", monkeypatch)
    adapter = run / "checkpoints" / "step_000000" / "policies" / "main"
    recorded = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not os.path.isabs(recorded) and recorded == os.path.relpath(tiny_model_dir, run)
    assert (run / recorded).resolve() == Path(tiny_model_dir).resolve()

    out = tmp_path / "export"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["export", str(run), "--merge-lora", "--out", str(out)]) == 0
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]  # clean output
    assert "exported 1 policy" in capsys.readouterr().out  # 'judge' is frozen: nothing trained to export
    assert sorted(p.name for p in out.iterdir()) == ["main"]
    merged_dir = out / "main"
    assert (merged_dir / "config.json").exists() and not (merged_dir / "adapter_config.json").exists()
    assert (merged_dir / "tokenizer.json").exists() and "base model: `" in (merged_dir / "README.md").read_text()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with peft_quietly():
        reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter))
    ids = torch.tensor([[3, 7, 11, 19, 5]])
    assert torch.allclose(logits(merged, ids), logits(reference, ids), atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.allclose(logits(merged, ids), logits(base, ids), atol=1e-6)  # the adapter trained: it shows

    # without --merge-lora the adapter itself is exported; an existing --out is never overwritten
    assert main(["export", str(run), "--out", str(tmp_path / "adapters")]) == 0
    assert (tmp_path / "adapters" / "main" / "adapter_model.safetensors").exists()
    assert main(["export", str(run), "--merge-lora", "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_a_hub_base_or_the_embedded_model_is_recorded_by_name(tmp_path, tiny_model_dir):
    from mas.agents.policy import build_policies, portable_model_ref
    from mas.training.checkpoint import record_base_models
    from mas.config.schema import PolicyConfig

    handle = build_policies({"main": PolicyConfig(kind="lora", model=str(tiny_model_dir), device="cpu")})["main"]
    handle.save_pretrained(tmp_path / "ckpt" / "policies" / "main")
    saved = tmp_path / "ckpt" / "policies" / "main" / "adapter_config.json"
    assert os.path.isabs(json.loads(saved.read_text())["base_model_name_or_path"])  # what peft writes
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "embedded"):
        record_base_models(tmp_path / "ckpt", {"main": PolicyConfig(kind="lora", model=name)}, ["main"], tmp_path)
        assert json.loads(saved.read_text())["base_model_name_or_path"] == name
    assert portable_model_ref(str(tiny_model_dir), tiny_model_dir) == "."


def test_a_full_policy_is_exported_as_saved(tmp_path, tiny_model_dir, monkeypatch):
    run = train_run(tmp_path, tiny_model_dir, "full", monkeypatch)
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--policy", "main"]) == 0
    saved = run / "checkpoints" / "step_000000" / "policies" / "main" / "model.safetensors"
    assert (tmp_path / "out" / "main" / "model.safetensors").read_bytes() == saved.read_bytes()
    assert main(["export", str(run), "--out", str(tmp_path / "out2"), "--policy", "judge"]) == 2  # frozen: not trained


def test_push_to_hub_uploads_the_merged_model(tmp_path, tiny_model_dir, monkeypatch):
    run = train_run(tmp_path, tiny_model_dir, "lora", monkeypatch)
    out = tmp_path / "export"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    with FakeHub() as hub:
        env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN="hf_test_token", HF_HOME=str(tmp_path / "hf"))
        done = subprocess.run([sys.executable, "-m", "mas.cli", "export", str(run), "--merge-lora", "--out", str(out),
                               "--push-to-hub", "team/trained-main"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"pushed to {hub.url}/team/trained-main" in done.stdout
    assert [(c["organization"], c["name"]) for c in hub.created] == [("team", "trained-main")]
    files = hub.repos["team/trained-main"]
    local = {p.name: p.read_bytes() for p in (out / "main").iterdir()}
    assert set(files) == set(local) and all(files[k] == local[k] for k in local)  # one policy: at the repo root
    assert any(h.get("authorization") == "Bearer hf_test_token" for m, _, h in hub.requests if m == "POST")


def test_push_without_a_reachable_hub_fails_at_once_keeping_the_export(tmp_path, tiny_model_dir, closed_port, monkeypatch):
    run = train_run(tmp_path, tiny_model_dir, "full", monkeypatch)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port}", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-m", "mas.cli", "export", str(run), "--out", str(tmp_path / "out"),
                           "--push-to-hub", "team/x"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "cannot be reached" in done.stderr and "Traceback" not in done.stderr
    assert "Retrying" not in done.stderr  # no back-off: one try
    assert (tmp_path / "out" / "main" / "model.safetensors").exists()


def test_a_failed_export_leaves_nothing_and_the_retry_works(tmp_path, tiny_model_dir, monkeypatch):
    import mas.export as export

    run = train_run(tmp_path, tiny_model_dir, "full", monkeypatch)
    out = tmp_path / "exported"

    def broken(*args, **kwargs):
        raise export.ExportError("policy 'main': cannot be written as GGUF: a stand-in failure")

    monkeypatch.setattr(export, "_write_gguf", broken)
    assert main(["export", str(run), "--out", str(out), "--gguf"]) == 2
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".exported.")]  # no half folder
    monkeypatch.undo()
    assert main(["export", str(run), "--out", str(out)]) == 0  # the retry is not refused
    assert (out / "main" / "model.safetensors").is_file()
    assert (run / "warnings.jsonl").is_file()  # present even when the run had no warning
