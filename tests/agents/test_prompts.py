"""Prompt rendering: chat template when the tokenizer has one, the documented plain format otherwise."""

from __future__ import annotations

from mas.agents.prompts import completion_stop_ids, render_prompt

MESSAGES = [
    {"role": "system", "content": "You are a solver."},
    {"role": "user", "content": "Question: 3+4?"},
]


def test_plain_format_without_chat_template(tiny_plain_tokenizer):
    ids = render_prompt(tiny_plain_tokenizer, MESSAGES)
    expected = "### system\nYou are a solver.\n### user\nQuestion: 3+4?\n### assistant\n"
    assert tiny_plain_tokenizer.decode(ids) == expected
    assert ids == tiny_plain_tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_chat_template_used_when_present(tiny_tokenizer):
    ids = render_prompt(tiny_tokenizer, MESSAGES)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    text = tiny_tokenizer.decode(ids, skip_special_tokens=False)
    assert text == "<|system|>You are a solver.<eos><|user|>Question: 3+4?<eos><|assistant|>"
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|system|>")
    assert ids[-1] == tiny_tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert "###" not in text


def test_completion_stop_ids_merges_model_and_tokenizer_eos(tiny_tokenizer, tiny_model):
    eos = tiny_tokenizer.eos_token_id
    tiny_model.generation_config.eos_token_id = eos
    assert completion_stop_ids(tiny_tokenizer, tiny_model) == [eos]
    extra = tiny_tokenizer.convert_tokens_to_ids("<|user|>")
    tiny_model.generation_config.eos_token_id = [extra, eos]
    assert completion_stop_ids(tiny_tokenizer, tiny_model) == [extra, eos]
    tiny_model.generation_config.eos_token_id = None
    assert completion_stop_ids(tiny_tokenizer, tiny_model) == [eos]
