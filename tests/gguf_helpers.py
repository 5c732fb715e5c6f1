"""Tiny in-process models for the GGUF tests, and GGUF files written from them with mas's writer
(so the loading tests never need a large file)."""

from __future__ import annotations

from pathlib import Path

import torch

TEXTS = [
    "Hello 123 world",
    "  two  spaces\nand a new line",
    "You are the orchestrator. Task: 3+4-2 CALL adder: 3+4 ANSWER: 5",
    "ünïcödé — and tabs\there",
]


def tiny_llama(tokenizer, seed: int = 0, tied: bool = True, vocab_size: int | None = None):
    """A random LlamaForCausalLM with grouped-query attention (4 heads, 2 KV heads), so the Q and K
    row orders differ between Hugging Face and GGUF and a wrong permutation shows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def with_trained_lora(model, seed: int = 1):
    """``model`` with a LoRA adapter on every projection whose B is non-zero (a fresh adapter's B is
    zero, so merging it would change nothing), merged into the weights; returns (merged, adapted
    logits function) so a test can check the merge against the adapter itself."""
    from peft import LoraConfig, get_peft_model

    from mas.agents.policy import peft_quietly

    with peft_quietly():
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    peft_model.eval()
    return peft_model


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def write_tiny_gguf(path: Path, model, tokenizer, dtype: str = "f32") -> Path:
    from mas.models.gguf import write_gguf

    return write_gguf(model, tokenizer, path, dtype=dtype, name="tiny")


def read_back(path: Path):
    """(model, tokenizer) loaded from the GGUF file by transformers itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).resolve()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=str(path), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=str(path))
