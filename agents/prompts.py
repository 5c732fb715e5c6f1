"""Turn chat messages into prompt token ids (the ids that end a completion: ``mas.rollout.backends.base``).

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

import re
from typing import Any


PLAIN_MESSAGE = "### {role}\n{content}\n"
PLAIN_GENERATION_PROMPT = "### assistant\n"
# what in a chat template can make two renders of the same messages differ: the clock
# (transformers' strftime_now) and jinja's random draws (the random filter, lipsum)
_VOLATILE_TEMPLATE = re.compile(r"strftime_now|\brandom\b|\blipsum\b")


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` list (Qwen2.5's, Llama 3.1's do;
    the plain format and templates that never read ``tools`` do not: describe the tools in a
    message instead)."""
    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and re.search(r"\btools\b", str(template)) is not None


def render_prompt_text(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The prompt as text: the tokenizer's chat template if it has one, else the plain format.
    ``tools`` (OpenAI-style function specs) go to a template that renders them
    (``template_takes_tools``); asking the plain format for them is a ValueError."""
    if tools is not None and not template_takes_tools(tokenizer):
        raise ValueError("this tokenizer's chat template does not render tools; describe them in a message instead")
    if getattr(tokenizer, "chat_template", None):
        # transformers 5: tokenize=True returns a BatchEncoding; render text and encode ourselves
        if tools is not None:
            return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(PLAIN_MESSAGE.format(role=m["role"], content=m["content"]) for m in messages) + PLAIN_GENERATION_PROMPT


def render_prompt(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """Token ids of the prompt for ``messages`` (ready for generation: ends in the assistant header)."""
    return text_ids(tokenizer, render_prompt_text(tokenizer, messages, tools))


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens: a prompt's, or the forced start of a reply that
    follows a rendered prompt (``GenRequest.prefix``)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class PromptCache:
    """``render_prompt`` with a memo, for the turns of one rollout.

    Many turns of a rollout share a prompt: the G episodes of a task open with the same
    messages, and specialists are handed the same subtasks again and again.  Rendering (the
    chat template, then the tokenizer) is the largest per-turn cost outside the model, so a
    prompt seen before is not rendered again.

    The memo is exact by construction: its key is the tokenizer and the whole message list
    (every key and value of every message, in order), and a hit returns the ids that
    ``render_prompt`` returned for that very input.  Nothing is assembled from the ids of
    parts (the ids of a concatenation are not always the concatenation of the ids).  Not
    memoised: messages holding anything but strings (multi-part content, tool calls; equal
    values of other types need not render alike: 1 == 1.0 == True), and templates whose
    output may change from call to call (ones that read the clock, ``strftime_now``, or draw
    with jinja's ``random``).  One cache serves one rollout (the engine makes a new one per
    run), so a tokenizer changed between rollouts (added tokens, a new template) is never
    answered with ids from before the change.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple, tuple[int, ...]] = {}
        self._tokenizers: dict[int, tuple[Any, bool]] = {}  # id -> (the tokenizer, kept alive so its id stays its own; memoisable)
        self.hits = 0
        self.misses = 0

    def render(self, tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """``render_prompt(tokenizer, messages)``, from the memo when this prompt was rendered before
        (a prompt with ``tools`` is rendered every time: tool specs are nested data)."""
        if tools is not None:
            return render_prompt(tokenizer, messages, tools)
        known = self._tokenizers.get(id(tokenizer))
        if known is None:
            known = self._tokenizers[id(tokenizer)] = (tokenizer, _deterministic_template(tokenizer))
        if not known[1]:
            return render_prompt(tokenizer, messages)
        items = tuple(tuple(m.items()) for m in messages)
        # only plain strings: equal keys then mean equal renders (1 == 1.0 == True would not), and all hash
        if not all(type(k) is str and type(v) is str for m in items for k, v in m):
            return render_prompt(tokenizer, messages)
        key = (id(tokenizer), items)
        ids = self._ids.get(key)
        if ids is None:
            self.misses += 1
            ids = self._ids[key] = tuple(render_prompt(tokenizer, messages))
        else:
            self.hits += 1
        return list(ids)  # every turn owns its list


def _deterministic_template(tokenizer: Any) -> bool:
    """False when the chat template may render the same messages differently from call to call."""
    template = getattr(tokenizer, "chat_template", None)
    return not (template and _VOLATILE_TEMPLATE.search(str(template)))
