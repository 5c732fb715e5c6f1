"""GGUF files: mas's writer against transformers' own GGUF reader (the round trip), and the header
reader's clear errors for files that are not GGUF, cut short or of an unwritable model."""

from __future__ import annotations

import dataclasses

import gguf
import pytest
import torch
from gguf_helpers import TEXTS, logits, read_back, tiny_llama, with_trained_lora, write_tiny_gguf

from mas.models.gguf import WRITERS, GGUFError, pre_tokenizer_name, read_header, write_gguf
from mas.models.tiny import tiny_causal_lm

IDS = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11, 64, 8]])  # ids below the tiny vocabulary (300)


def assert_same_tokenizer(original, loaded) -> None:
    for text in TEXTS + [original.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                                       add_generation_prompt=True)]:
        assert loaded(text)["input_ids"] == original(text)["input_ids"], text
    assert loaded.chat_template == original.chat_template
    assert (loaded.eos_token, loaded.pad_token) == (original.eos_token, original.pad_token)


@pytest.mark.parametrize("dtype, atol", [("f32", 1e-5), ("f16", 5e-3)])
def test_a_llama_with_a_merged_lora_adapter_round_trips_through_gguf(tmp_path, tiny_tokenizer, dtype, atol):
    base_logits = logits(tiny_llama(tiny_tokenizer), IDS)
    adapted = with_trained_lora(tiny_llama(tiny_tokenizer))
    adapted_logits = logits(adapted, IDS)
    merged = adapted.merge_and_unload()
    assert (adapted_logits - base_logits).abs().max() > 0.1  # the adapter matters, so a lost merge would show
    path = write_tiny_gguf(tmp_path / f"tiny.{dtype}.gguf", merged, tiny_tokenizer, dtype)
    model, tok = read_back(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (logits(model, IDS) - adapted_logits).abs().max() < atol
    assert_same_tokenizer(tiny_tokenizer, tok)
    header = read_header(path)
    assert header.architecture == "llama" and header.parameters == sum(p.numel() for p in merged.parameters())
    assert header.metadata["tokenizer.ggml.pre"] == "smollm"  # digits one by one, then the GPT-2 split
    kinds = header.tensor_types
    assert kinds == ({"F32": len(header.tensors)} if dtype == "f32" else {"F16": 15, "F32": 5})  # vectors stay f32


def test_the_llama_q_and_k_rows_are_reordered_for_gguf(tmp_path, tiny_tokenizer, monkeypatch):
    """The reader un-permutes Q and K (llama.cpp rotates adjacent pairs): written without the
    reordering, the file loads but computes something else."""
    model = tiny_llama(tiny_tokenizer)
    monkeypatch.setitem(WRITERS, "llama", dataclasses.replace(WRITERS["llama"], interleave_qk=False))
    wrong, _ = read_back(write_tiny_gguf(tmp_path / "wrong.gguf", model, tiny_tokenizer))
    assert (logits(wrong, IDS) - logits(model, IDS)).abs().max() > 1e-3


def test_an_untied_output_projection_is_written_and_read(tmp_path, tiny_tokenizer):
    model = tiny_llama(tiny_tokenizer, tied=False)
    path = write_tiny_gguf(tmp_path / "untied.gguf", model, tiny_tokenizer)
    assert "output.weight" in {t.name for t in read_header(path).tensors}
    loaded, _ = read_back(path)
    assert not loaded.config.tie_word_embeddings
    assert (logits(loaded, IDS) - logits(model, IDS)).abs().max() < 1e-5


def test_a_padded_vocabulary_gets_placeholder_tokens(tmp_path, tiny_tokenizer):
    model = tiny_llama(tiny_tokenizer, vocab_size=len(tiny_tokenizer) + 4)
    path = write_tiny_gguf(tmp_path / "padded.gguf", model, tiny_tokenizer)
    loaded, tok = read_back(path)
    assert loaded.config.vocab_size == len(tiny_tokenizer) + 4
    assert (logits(loaded, IDS) - logits(model, IDS)).abs().max() < 1e-5
    assert_same_tokenizer(tiny_tokenizer, tok)


@pytest.mark.parametrize("dtype, atol", [("f32", 1e-5), ("f16", 5e-3)])
def test_a_tiny_qwen2_round_trips_through_gguf(tmp_path, tiny_tokenizer, dtype, atol):
    model = tiny_causal_lm(tiny_tokenizer, seed=3).eval()  # the embedded model's family: Qwen2, q/k/v biases
    path = write_tiny_gguf(tmp_path / "qwen2.gguf", model, tiny_tokenizer, dtype)
    loaded, tok = read_back(path)
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    assert (logits(loaded, IDS) - logits(model, IDS)).abs().max() < atol
    assert_same_tokenizer(tiny_tokenizer, tok)


def test_the_embedded_model_round_trips_through_gguf(tmp_path):
    from mas.embedded import load_embedded

    model, tok = load_embedded()
    path = write_tiny_gguf(tmp_path / "embedded.gguf", model.eval(), tok, "f32")
    loaded, loaded_tok = read_back(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Task: 3+4"}], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    assert (logits(loaded, ids) - logits(model, ids)).abs().max() < 1e-4
    assert_same_tokenizer(tok, loaded_tok)


def test_models_and_tokenizers_it_cannot_write_are_refused_by_name(tmp_path, tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(GGUFError, match=r"architecture 'gpt2' cannot be written as GGUF; supported: \['llama', 'qwen2'\]"):
        write_gguf(gpt2, tiny_tokenizer, tmp_path / "x.gguf")
    with pytest.raises(GGUFError, match="valid: \\['f16', 'f32'\\]"):
        write_gguf(tiny_llama(tiny_tokenizer), tiny_tokenizer, tmp_path / "x.gguf", dtype="q4_0")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_pre_tokenizer_name_follows_the_split(tiny_tokenizer):
    from tokenizers import pre_tokenizers

    assert pre_tokenizer_name(tiny_tokenizer) == "smollm"
    plain = tiny_tokenizer.__class__(tokenizer_object=tiny_tokenizer.backend_tokenizer.__class__.from_str(
        tiny_tokenizer.backend_tokenizer.to_str()))
    plain.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert pre_tokenizer_name(plain) == "gpt2"
    plain.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert pre_tokenizer_name(plain) == "default"


# -------------------------------------------------------------------------------- broken files


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory, tiny_tokenizer):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


def test_a_truncated_file_is_named_as_truncated(tmp_path, tiny_file):
    data = tiny_file.read_bytes()
    for keep, why in ((len(data) - 100, "truncated: its tensors end at byte"),
                      (3000, r"truncated or corrupt: the file ends inside its GGUF header \(3,000 bytes\)"),
                      (10, "too short to be a GGUF file")):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(GGUFError, match=why) as e:
            read_header(cut)
        assert str(cut) in str(e.value)


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match=r"not a GGUF file \(it does not start with the bytes 'GGUF'\)"):
        read_header(fake)


def test_the_header_is_read_without_the_tensor_data(tiny_file, tiny_tokenizer):
    header = read_header(tiny_file)
    assert header.metadata["tokenizer.ggml.tokens"] == len(tiny_tokenizer)  # arrays of strings: their length
    assert header.metadata["general.architecture"] == "qwen2" and header.metadata["general.name"] == "tiny"
    names = {t.name for t in header.tensors}
    assert {"token_embd.weight", "blk.0.attn_q.bias", "output_norm.weight"} <= names and "output.weight" not in names
    reader = gguf.GGUFReader(tiny_file)  # llama.cpp's own reader agrees on the tensor table
    assert {t.name: t.data_offset for t in reader.tensors} == {t.name: header.data_start + t.offset for t in header.tensors}
