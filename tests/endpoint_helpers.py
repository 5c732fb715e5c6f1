"""Teams written with the plain `openai` client, for the endpoint tests (entry points of `kind: openai`).

Each records what its client received under its base_url (unique per episode) and returns the
base_url as its answer, so a test finds each episode's received replies from the episode."""

from __future__ import annotations

import threading

from openai import OpenAI

RECEIVED: dict[str, list[dict]] = {}
_LOCK = threading.Lock()
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a number up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                          "required": ["q"]}}}


def _keep(base_url: str, **reply) -> None:
    with _LOCK:
        RECEIVED.setdefault(base_url, []).append(reply)


def received(groups, agents) -> list:
    """``(episode, [(turn, reply its client received), ...])`` for every episode of ``groups``, each
    checked to have ended ok with turns by ``agents``, in order."""
    out = []
    for group in groups:
        for ep in group.episodes:
            assert ep.status == "ok", ep.error
            got = RECEIVED.pop(ep.answer)
            assert [t.agent for t in ep.turns] == list(agents)
            out.append((ep, list(zip(ep.turns, got))))
    return out


def _lps(choice) -> tuple[list[float], list[str]]:
    content = choice.logprobs.content if choice.logprobs is not None else []
    return [t.logprob for t in content], [t.token for t in content]


def protocol_team(task: str, base_url: str, api_key: str) -> str:
    """n=2 with logprobs (lead), a streamed reply (helper), a tool round named by header (checker)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    first = client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}], n=2, logprobs=True)
    for ch in first.choices:
        _keep(base_url, agent="lead", content=ch.message.content, logprobs=_lps(ch)[0], tokens=_lps(ch)[1],
              finish=ch.finish_reason)
    text, lps, toks, finish = "", [], [], None
    for chunk in client.chat.completions.create(model="helper", stream=True, logprobs=True, stream_options={"include_usage": True},
                                                messages=[{"role": "system", "content": "You help."},
                                                          {"role": "user", "content": f"{task}\nlead: {first.choices[0].message.content}"}]):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs is not None and ch.logprobs.content:
                lps += [t.logprob for t in ch.logprobs.content]
                toks += [t.token for t in ch.logprobs.content]
            finish = ch.finish_reason or finish
    _keep(base_url, agent="helper", content=text, logprobs=lps, tokens=toks, finish=finish)
    messages = [{"role": "user", "content": task}]
    other = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, default_headers={"X-Mas-Agent": "checker"})
    reply = other.chat.completions.create(model="gpt-4o", messages=messages, tools=[LOOKUP])
    msg = reply.choices[0].message
    _keep(base_url, agent="checker", content=msg.content, tool_calls=[(c.id, c.function.name, c.function.arguments)
                                                                      for c in msg.tool_calls or []],
          finish=reply.choices[0].finish_reason)
    if msg.tool_calls:
        messages += [msg.model_dump(exclude_none=True)] + [{"role": "tool", "tool_call_id": c.id, "content": "42"}
                                                           for c in msg.tool_calls]
        final = other.chat.completions.create(model="gpt-4o", messages=messages, tools=[LOOKUP])
        _keep(base_url, agent="checker", content=final.choices[0].message.content, tool_calls=[],
              finish=final.choices[0].finish_reason)
    return base_url


def two_agents(task: str, base_url: str, api_key: str) -> str:
    """lead, then helper (path-named), each with logprobs; async-free and plain."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    a = client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}], logprobs=True)
    _keep(base_url, agent="lead", content=a.choices[0].message.content, logprobs=_lps(a.choices[0])[0],
          tokens=_lps(a.choices[0])[1])
    helper = OpenAI(base_url=base_url.replace("/v1", "/agents/helper/v1"), api_key=api_key, max_retries=0)
    b = helper.chat.completions.create(model="anything", messages=[{"role": "user", "content": f"{task}\n{a.choices[0].message.content}"}],
                                       logprobs=True, max_tokens=3)
    _keep(base_url, agent="helper", content=b.choices[0].message.content, logprobs=_lps(b.choices[0])[0],
          tokens=_lps(b.choices[0])[1])
    return base_url


async def async_echo(task: str, base_url: str, api_key: str) -> str:
    """An async team: one call of lead with the async client; returns its reply."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = await client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}])
    await client.close()
    return reply.choices[0].message.content or ""


def chatty(task: str, base_url: str, api_key: str) -> str:
    """Never stops by itself: the cap on model calls must end it."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    while True:
        client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}])


NOTE = {"type": "function", "function": {"name": "note", "description": "Write a note.",
                                         "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}


def forced_tools(task: str, base_url: str, api_key: str) -> str:
    """Each agent told to call a tool: lead by tool_choice 'required' with one tool, helper by name, checker
    by 'required' with two tools."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    for agent, choice, tools in (("lead", "required", [LOOKUP]),
                                 ("helper", {"type": "function", "function": {"name": "lookup"}}, [LOOKUP, NOTE]),
                                 ("checker", "required", [LOOKUP, NOTE])):
        msg = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": task}], tools=tools,
                                             tool_choice=choice).choices[0].message
        _keep(base_url, agent=agent, content=msg.content, calls=[c.function.name for c in msg.tool_calls or []])
    return base_url


ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def json_replies(task: str, base_url: str, api_key: str) -> str:
    """Structured output: lead by a JSON schema (no tools), helper by json_object with a tool offered, checker by
    a JSON schema, its reply lacking the required property."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    schema = {"type": "json_schema", "json_schema": {"name": "Answer", "schema": ANSWER_SCHEMA, "strict": True}}
    for agent, fmt, tools in (("lead", schema, None), ("helper", {"type": "json_object"}, [LOOKUP]), ("checker", schema, None)):
        extra = {"tools": tools} if tools else {}
        msg = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": task}], response_format=fmt,
                                             **extra).choices[0].message
        _keep(base_url, agent=agent, content=msg.content, calls=[c.function.name for c in msg.tool_calls or []])
    return base_url


def solver_checker(task: str, base_url: str, api_key: str) -> str:
    """lead answers, checker reads it: the reply of each depends only on the messages (replayable)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    a = client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}]).choices[0].message.content
    client.chat.completions.create(model="checker", messages=[{"role": "user", "content": f"{task}\nlead: {a}"}])
    return a or ""


def with_settings(task: str, base_url: str, api_key: str) -> str:
    """One request with its own temperature, top_p and stop."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}], temperature=0.3,
                                           top_p=0.5, stop=[" ACCEPT"])
    _keep(base_url, agent="lead", content=reply.choices[0].message.content, finish=reply.choices[0].finish_reason)
    return base_url


FIRST_CALL_DONE = threading.Event()  # set by ``slow`` once its first call has its reply (the test's clock waits for it)


def slow(task: str, base_url: str, api_key: str) -> str:
    """One call, then a pause past the episode's timeout, then another call (to an ended episode)."""
    import time

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}])
    FIRST_CALL_DONE.set()
    time.sleep(2)
    client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}])
    return base_url


def tool_turns(task: str, base_url: str, api_key: str) -> str:
    """lead is offered a tool; helper answers after a tool round the client writes itself (its
    assistant tool call and the tool's result), each with logprobs."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    a = client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}], tools=[LOOKUP],
                                       logprobs=True)
    call = {"id": "call_lookup_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    b = client.chat.completions.create(model="helper", tools=[LOOKUP], logprobs=True, messages=[
        {"role": "user", "content": task},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_lookup_1", "content": "7"}])
    for agent, reply in (("lead", a), ("helper", b)):
        _keep(base_url, agent=agent, logprobs=_lps(reply.choices[0])[0])
    return base_url


LOOKUP_RESPONSES = {"type": "function", "name": "lookup", "description": "Look a number up.",
                    "parameters": LOOKUP["function"]["parameters"]}


def responses_team(task: str, base_url: str, api_key: str) -> str:
    """The Responses API: lead answers (instructions + input), helper streams, checker makes a tool
    round and sends it back as function_call / function_call_output items."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    a = client.responses.create(model="lead", instructions="You lead.", input=task, include=["message.output_text.logprobs"])
    lps = a.output[0].content[0].logprobs
    _keep(base_url, agent="lead", content=a.output_text, status=a.status, usage=(a.usage.input_tokens, a.usage.output_tokens),
          logprobs=[t.logprob for t in lps], tokens=[t.token for t in lps])
    kinds, text, final = [], "", None
    for event in client.responses.create(model="helper", input=[{"role": "user", "content": f"{task}\nlead: {a.output_text}"}],
                                         stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            final = event.response
    _keep(base_url, agent="helper", content=text, kinds=kinds, final=final.output_text)
    items: list = [{"role": "user", "content": [{"type": "input_text", "text": task}]}]
    first = client.responses.create(model="checker", input=items, tools=[LOOKUP_RESPONSES])
    calls = [o for o in first.output if o.type == "function_call"]
    _keep(base_url, agent="checker", content=first.output_text or None,
          tool_calls=[(c.call_id, c.name, c.arguments) for c in calls])
    if calls:
        items += [o.model_dump(exclude_none=True) for o in first.output]  # as the Agents SDK sends its history back
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls]
        last = client.responses.create(model="checker", input=items, tools=[LOOKUP_RESPONSES])
        _keep(base_url, agent="checker", content=last.output_text, tool_calls=[])
    return base_url
