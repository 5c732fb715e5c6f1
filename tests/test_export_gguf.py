"""Train on a GGUF file, get GGUF back: `mas train` on tiny GGUF models (full and LoRA) and on a
Hugging Face folder, then `mas export --gguf`, read back by transformers and compared with the
trained policy's own logits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from gguf_helpers import logits, read_back, tiny_llama, write_tiny_gguf
from team_helpers import team_config, varied_reward

from mas.agents.policy import peft_quietly
from mas.cli import main
from mas.models.tiny import tiny_causal_lm

IDS = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11]])


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def train(tmp_path: Path, model: str, kind: str, monkeypatch) -> Path:
    from mas.envs.math.synthetic import SyntheticMathEnv

    monkeypatch.setattr(SyntheticMathEnv, "score", lambda self, ep: varied_reward(ep))  # something to learn
    cfg = team_config(model, "chain")
    cfg["policies"]["main"]["kind"] = kind
    cfg["trainer"] = {**cfg["trainer"], "steps": 1}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    assert main(["train", str(path), "--run-dir", str(run)]) == 0
    return run


def test_a_full_policy_trained_from_a_gguf_exports_as_gguf(tmp_path, cache, tiny_tokenizer, monkeypatch, capsys):
    start = tiny_causal_lm(tiny_tokenizer, seed=2)
    base = write_tiny_gguf(tmp_path / "models" / "qwen.gguf", start, tiny_tokenizer)
    run = train(tmp_path, str(base), "full", monkeypatch)
    source = json.loads((run / "run_info.json").read_text())["policies"]["main"]["source"]
    assert source["source"] == "gguf" and source["sha256"] == __import__("hashlib").sha256(base.read_bytes()).hexdigest()

    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out), "--gguf", "--gguf-dtype", "f32"]) == 0
    assert "exported 1 policy" in capsys.readouterr().out
    gguf_path = out / "main" / "main.f32.gguf"
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000000" / "policies" / "main").eval()
    assert (logits(trained, IDS) - logits(start, IDS)).abs().max() > 1e-4  # it trained: the export must carry that
    loaded, _ = read_back(gguf_path)
    assert (logits(loaded, IDS) - logits(trained, IDS)).abs().max() < 1e-5
    assert "GGUF for llama.cpp, Ollama, LM Studio: `main.f32.gguf`" in (out / "main" / "README.md").read_text()


def test_a_lora_policy_on_a_gguf_llama_exports_merged_into_gguf(tmp_path, cache, tiny_tokenizer, monkeypatch):
    from peft import PeftModel

    base = write_tiny_gguf(tmp_path / "models" / "llama.gguf", tiny_llama(tiny_tokenizer), tiny_tokenizer)
    run = train(tmp_path, str(base), "lora", monkeypatch)
    adapter = run / "checkpoints" / "step_000000" / "policies" / "main"
    recorded = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not os.path.isabs(recorded) and (run / recorded).resolve() == base.resolve()  # portable, like a folder

    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out), "--gguf"]) == 0  # f16 by default
    # a GGUF is one standalone model, so --gguf merges the adapter as --merge-lora does (folder and file alike)
    assert (out / "main" / "model.safetensors").is_file() and not (out / "main" / "adapter_config.json").exists()
    from mas.agents.policy import load_model_and_tokenizer

    base_model, _ = load_model_and_tokenizer(str(base), "float32", "cpu", False)
    base_logits = logits(base_model, IDS)
    with peft_quietly():
        adapted = PeftModel.from_pretrained(base_model, str(adapter)).eval()
    expected = logits(adapted, IDS)
    assert (expected - base_logits).abs().max() > 1e-4  # the adapter trained: a lost merge would show
    loaded, _ = read_back(out / "main" / "main.f16.gguf")
    assert (logits(loaded, IDS) - expected).abs().max() < 5e-3


def test_a_lora_policy_on_a_hugging_face_folder_exports_as_gguf(tmp_path, cache, tiny_model_dir, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = train(tmp_path, str(tiny_model_dir), "lora", monkeypatch)
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out), "--merge-lora", "--gguf", "--gguf-dtype", "f32"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out / "main").eval()  # the merged HF folder, as before
    with peft_quietly():
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                            str(run / "checkpoints" / "step_000000" / "policies" / "main")).eval()
    assert (logits(merged, IDS) - logits(adapted, IDS)).abs().max() < 1e-5
    loaded, _ = read_back(out / "main" / "main.f32.gguf")
    assert (logits(loaded, IDS) - logits(adapted, IDS)).abs().max() < 1e-5
