"""Tiny transformers models and tokenizers built in-process (no hub access).

Used by the embedded offline model (``mas.embedded``) and by the tests.  The tokenizer is a
real ``tokenizers`` BPE trained on the given texts, wrapped as a ``PreTrainedTokenizerFast``;
digits are always split one per token so arithmetic stays learnable.  The model is a
random-weight ``Qwen2ForCausalLM`` (the family of the default real model).
"""

from __future__ import annotations

from typing import Iterable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]

# A compact chat template (one special token per role, EOS after every message).  Real models
# bring their own template; this one exists so the embedded model takes the same code path.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 256, chat_template: bool = True) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``; deterministic for the same texts."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        additional_special_tokens=SPECIAL_TOKENS[2:],
    )
    fast.padding_side = "left"
    if chat_template:
        fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_causal_lm(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_positions: int = 512,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A random-weight Qwen2 causal LM sized for CPU tests; deterministic for a seed."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def sft_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded causal-LM inputs for (prompt ids, completion ids) pairs, with the loss on the
    completion only (prompt and padding labelled -100)."""
    return sequence_batch([(p + c, [-100] * len(p) + c) for p, c in pairs], pad_id)


def sequence_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded causal-LM inputs for (ids, labels) rows of equal lengths, labels -100 where
    there is no loss (a multi-turn row has a loss on each of its completions); padding -100."""
    width = max(len(i) for i, _ in rows)
    ids = torch.full((len(rows), width), pad_id)  # [b, S]
    labels = torch.full((len(rows), width), -100)  # [b, S]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [b, S]
    for r, (i, lab) in enumerate(rows):
        ids[r, : len(i)] = torch.tensor(i)
        labels[r, : len(lab)] = torch.tensor(lab)
        mask[r, : len(i)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
