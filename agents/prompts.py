"""Turn chat messages into prompt token ids, and find the ids that end a completion.

A tokenizer with a chat template (every real instruct model, and the embedded tiny model)
renders the messages with it, ``add_generation_prompt=True``.  A tokenizer without one uses
the PLAIN format, one block per message and an open assistant block at the end::

    ### system
    You are a solver.
    ### user
    What is 3+4?
    ### assistant

that is ``"### {role}\\n{content}\\n"`` for each message, then ``"### assistant\\n"``.

In both cases the text is encoded with ``add_special_tokens=False``: a chat template
already writes whatever BOS/role tokens the model expects, and the plain format wants none
(a BOS added by the tokenizer would appear in neither the template nor the learner's view).
"""

from __future__ import annotations

from typing import Any

PLAIN_MESSAGE = "### {role}\n{content}\n"
PLAIN_GENERATION_PROMPT = "### assistant\n"


def render_prompt_text(tokenizer: Any, messages: list[dict]) -> str:
    """The prompt as text: the tokenizer's chat template if it has one, else the plain format."""
    if getattr(tokenizer, "chat_template", None):
        # transformers 5: tokenize=True returns a BatchEncoding; render text and encode ourselves
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(PLAIN_MESSAGE.format(role=m["role"], content=m["content"]) for m in messages) + PLAIN_GENERATION_PROMPT


def render_prompt(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of the prompt for ``messages`` (ready for generation: ends in the assistant header)."""
    return list(tokenizer(render_prompt_text(tokenizer, messages), add_special_tokens=False)["input_ids"])


def completion_stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """Ids that end a completion: the model's generation EOS ids (int or list) and the tokenizer's EOS.

    Instruct models often stop on more than one id (Qwen2.5: ``<|im_end|>`` and
    ``<|endoftext|>``); generation stops on any of them.  Order is kept, duplicates dropped.
    """
    ids: list[int] = []
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    for i in ([] if eos is None else [eos] if isinstance(eos, int) else list(eos)) + [tokenizer.eos_token_id]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an EOS token id")
    return ids
