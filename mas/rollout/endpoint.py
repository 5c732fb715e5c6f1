"""The OpenAI-compatible endpoint: a team's own code calls mas's agents over HTTP.

A team written with any framework that speaks OpenAI's chat completions (the ``openai`` client,
the OpenAI Agents SDK, AutoGen's ``OpenAIChatCompletionClient``, LangChain's ``ChatOpenAI``) is
trained by pointing its ``base_url`` here.  Each request becomes one ``EpisodeContext.call``
of the agent it names, so it is batched with every other episode's requests by the engine's
``Batcher``, recorded as a ``Turn`` with the prompt ids rendered here and the completion ids
and logprobs the backend sampled (token in, token out: the learner trains those ids, never a
re-tokenisation of the reply), replayed or masked when a credit method asks.

Routes (``<token>``: the episode's secret, ``secrets.token_urlsafe``, live while it runs)::

    POST /<token>/v1/chat/completions                  the agent is the request's ``model``
    POST /<token>/agents/<agent>/v1/chat/completions   ... or named in the path
    POST /<token>/v1/responses                         the Responses API, translated onto chat
    POST /<token>/agents/<agent>/v1/responses          completions (``mas.rollout.responses``)
    GET  /<token>/v1/models                            the team's agents

A request may also name its agent in the ``X-Mas-Agent`` header (for frameworks that cannot set
a model per agent); the path wins over the header, the header over ``model``.

The server.  One per process, started at the first episode that asks (``shared_server``):
Starlette on uvicorn, bound to 127.0.0.1 on a free port, in a daemon thread with its own event
loop.  A handler hands its request to the episode's session on the loop the session lives on
(the engine's, for a training episode) and waits for the reply; the engine's loop never runs
the HTTP stack, so uvicorn's signal handling and the user's blocking clients stay off it.  A
client that goes away mid-request cancels that request's call only.

Bad requests get OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``:
malformed JSON and wrong types 400, an unknown token or agent 404, a body over
``max_body_bytes`` 413, ``max_tokens`` over ``MAX_TOKENS_LIMIT`` 400; a request to an episode
that has ended (stopped at its timeout or its cap on model calls, or failed) 410.  None of them
changes an episode.

The prompt.  The request's messages become chat messages as the framework adapters write them
(``topologies/adapters.py``): text content only; ``developer`` is ``system``; with no system
message the agent's YAML role is one; an assistant message's ``tool_calls`` are written back in
the model's own call format (the exact text the model wrote, where the call came from this
episode); ``tool`` results go back in ``<tool_response>`` tags as a user message.  ``tools``
are rendered by the model's chat template where it renders tools
(``mas.agents.prompts.template_takes_tools``), else described in the system message
(``describe_tools``, which the warm-up's framework teacher reads).  The reply's ``tool_calls``
are the ``<tool_call>`` blocks of the model's text (``mas.agents.tools.parse_tool_calls``).

``tool_choice``.  ``none`` offers no tools.  ``required`` and a named function are met by forcing
the start of the reply (``mas.tools.forced_call_start``): the model continues ``<tool_call>{"name": "`` (the one
tool's full name where the request offers one), or ``<tool_call>{"name": "<name>", "arguments": ``
for a named function.  Those ids end the turn's prompt ids, so only what the model sampled after
them is trained, and the reply holds the whole call.  A continuation that still makes no valid
call (an unknown name, JSON that does not close) stands as sampled, and counts the fault
``tool_choice_unmet``.

``response_format``.  ``json_object`` and ``json_schema`` (the Agents SDK's ``output_type``,
LangChain's ``with_structured_output``) end the system message with an instruction to reply with
one JSON object (``mas.response_format``: the schema with it), and, where the request offers no
tool, force the reply to start with ``{`` (``reply_start``).  What follows is sampled, not
constrained to the schema: a text reply that is not one JSON object, or lacks a property the
schema requires, stands and counts the fault ``response_format_unmet``.  An episode's requests
get both, and both faults, from ``EpisodeCalls.generate``, as the in-process adapters do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mas.agents.prompts import render_prompt, template_takes_tools, text_ids
from mas.rollout.backends.base import BackendUnavailable, GenRequest, GenResult, generate_apart
from mas.rollout.batcher import settle
from mas.response_format import reply_start, with_format
from mas.rollout.responses import BadRequest, chat_body, response_body, response_events
from mas.tools import has_tool_call, parse_tool_calls, tool_call_text
from mas.topologies.adapters import (EpisodeCalls, Generation, describe_tools, finish_messages, outside_calls,
                                     tool_results_text, tool_schema)
from mas.types import EpisodeContext, Turn

MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body over this gets 413 (a long transcript is ~100 KB)
MAX_TOKENS_LIMIT = 1 << 17  # max_tokens above this is a client bug: 400 (below it, the agent's budget caps it)
MAX_N = 16  # choices per request
API_KEY = "mas-local"  # the key handed to the team's code; the URL's token is the secret, the key is not checked
AGENT_HEADER = "x-mas-agent"
ROLES = ("system", "developer", "user", "assistant", "tool")


class EndpointError(Exception):
    """A request refused with an HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> EndpointError:
    return EndpointError(400, message, param=param, code=code)


# ---------------------------------------------------------------------------------------------
# the request
# ---------------------------------------------------------------------------------------------


@dataclass
class ChatRequest:
    """A chat-completions request, checked: what a session needs to answer it."""

    agent: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)  # tool_schema dicts (name, description, parameters)
    tool_choice: Any = "auto"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    model: str = ""  # the request's model field, echoed in the reply
    response_format: dict[str, Any] | None = None  # None: text; {"type": "json_object"} or {"type": "json_schema", ...}


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """A request's ``tool_choice``, checked against its tools: ``auto``, ``none``, ``required`` or
    ``{"type": "function", "function": {"name": ...}}``, and the tools offered.  ``allowed_tools``
    (``{"type": "allowed_tools", "allowed_tools": {"mode": ..., "tools": [...]}}``) offers only the
    tools it lists and becomes its mode.  A choice that asks for a call needs a tool to call."""
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        spec = choice.get("allowed_tools")
        listed = spec.get("tools") if isinstance(spec, dict) else None
        mode = spec.get("mode", "auto") if isinstance(spec, dict) else None
        if not isinstance(listed, list) or mode not in ("auto", "required"):
            raise _bad("tool_choice allowed_tools must be {'mode': 'auto' or 'required', 'tools': [...]}", "tool_choice")
        allowed = {(t.get("function") or {}).get("name") for t in listed
                   if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)}
        choice, tools = mode, [t for t in tools if t["name"] in allowed]
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
        and isinstance(choice["function"].get("name"), str)
    if not (choice in ("auto", "none", "required") or named):
        raise _bad("tool_choice must be 'auto', 'none', 'required', {'type': 'function', 'function': {'name': ...}} or "
                   f"{{'type': 'allowed_tools', 'allowed_tools': {{...}}}}; got {choice!r}", "tool_choice")
    if (choice == "required" or named) and not tools:
        raise _bad(f"tool_choice {choice!r} asks for a tool call, but the request offers no tools", "tool_choice")
    if named and choice["function"]["name"] not in {t["name"] for t in tools}:
        raise _bad(f"tool_choice names function {choice['function']['name']!r}, which is not among the request's tools "
                   f"{[t['name'] for t in tools]}", "tool_choice")
    return choice, tools


def _response_format(fmt: Any) -> dict[str, Any] | None:
    """A request's ``response_format``, checked: None for text, ``{"type": "json_object"}``, or
    ``{"type": "json_schema", "name": ..., "schema": {...}}`` (from OpenAI's ``json_schema`` wrapper)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(spec, dict) and isinstance(spec.get("name"), str) \
            and isinstance(spec.get("schema", {}), dict):
        return {"type": "json_schema", "name": spec["name"], "schema": spec.get("schema") or {}}
    raise _bad("response_format must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
               f"'json_schema': {{'name': ..., 'schema': {{...}}}}}}; got {str(fmt)[:120]!r}", "response_format")


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise _bad(f"{key} must be a number in [{low}, {high}]; got {v!r}", key)
    return float(v)


def _integer(body: dict[str, Any], key: str, low: int, high: int, code: str | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"{key} must be an integer; got {v!r}", key)
    if not low <= v <= high:
        raise _bad(f"{key} must be in [{low}, {high}]; got {v}", key, code)
    return v


def read_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"the body is not valid JSON: {exc}") from None


def parse_request(raw: bytes, agents: Iterable[str], path_agent: str | None = None,
                  header_agent: str | None = None) -> ChatRequest:
    """The checked request of a body; ``EndpointError`` with what is wrong otherwise."""
    return check_request(read_json(raw), agents, path_agent, header_agent)


def check_request(body: Any, agents: Iterable[str], path_agent: str | None = None,
                  header_agent: str | None = None) -> ChatRequest:
    """The checked request of a decoded chat-completions body (``parse_request``; the Responses
    route hands its translation here)."""
    if not isinstance(body, dict):
        raise _bad(f"the body must be a JSON object; got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad(f"model must be a string (an agent of the team); got {model!r}", "model")
    names = list(agents)
    agent = path_agent or header_agent or model
    if agent not in names:
        where = "the path" if path_agent else f"the {AGENT_HEADER} header" if header_agent else "model"
        raise EndpointError(404, f"no agent {agent!r} (from {where}) in this team; valid: {names}", param="model",
                            code="model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}] must be an object with a role in {list(ROLES)}; got {str(m)[:80]!r}", f"messages[{i}]")
    chat_messages(messages, {})  # their contents and tool calls: refused here, before any agent sees them
    tools = []
    raw_tools = body.get("tools")
    if raw_tools is not None:
        if not isinstance(raw_tools, list):
            raise _bad("tools must be a list", "tools")
        for i, t in enumerate(raw_tools):
            fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}", f"tools[{i}]")
            params = fn.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise _bad(f"tools[{i}].function.parameters must be a JSON schema object", f"tools[{i}]")
            desc = fn.get("description") or ""
            if not isinstance(desc, str):
                raise _bad(f"tools[{i}].function.description must be a string", f"tools[{i}]")
            tools.append(tool_schema(fn["name"], desc, params))
    tool_choice, tools = _tool_choice(body.get("tool_choice", "auto"), tools)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise _bad("stop must be a string or a list of at most 4 strings", "stop")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise _bad("give max_tokens or max_completion_tokens, not both", "max_tokens")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, 1, MAX_TOKENS_LIMIT, code="max_tokens_too_large")
    for flag in ("stream", "logprobs"):
        if body.get(flag) is not None and not isinstance(body[flag], bool):
            raise _bad(f"{flag} must be a boolean", flag)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    _integer(body, "top_logprobs", 0, 20)  # accepted; the reply's top_logprobs are empty (only sampled ids are kept)
    return ChatRequest(
        agent=agent, messages=messages, tools=tools, tool_choice=tool_choice,
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0),
        max_tokens=max_tokens, stop=stops, n=_integer(body, "n", 1, MAX_N) or 1, stream=bool(body.get("stream")),
        include_usage=bool((options or {}).get("include_usage")), logprobs=bool(body.get("logprobs")), model=model,
        response_format=_response_format(body.get("response_format")))


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}: only text content is served; got a {str(part)[:60]!r} part", where)
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}: content must be a string or a list of text parts", where)


def chat_messages(raw: list[dict[str, Any]], raw_text: dict[str, str]) -> tuple[list[dict[str, str]], list[tuple[str, str]]]:
    """The request's messages as chat messages (module docstring), and the tool results they hand
    back as (call id, content).  ``raw_text``: call id -> the full text of the generation that made
    the call (this episode's), so the model reads back exactly what it wrote."""
    out: list[dict[str, str]] = []
    results: list[tuple[str, str]] = []
    pending: list[str] = []  # a run of tool results: one user message

    def flush() -> None:
        if pending:
            out.append({"role": "user", "content": tool_results_text(pending)})
            pending.clear()

    for i, m in enumerate(raw):
        role, where = m["role"], f"messages[{i}]"
        content = _text(m.get("content"), where)
        if role == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str):
                raise _bad(f"{where}: a tool message needs its tool_call_id", where)
            results.append((cid, content))
            pending.append(content)
            continue
        flush()
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls):
                raise _bad(f"{where}: tool_calls must be a list of {{'id', 'function': {{'name', 'arguments'}}}}", where)
            first = calls[0].get("id")
            if isinstance(first, str) and first in raw_text:
                content = raw_text[first]
            else:
                written = []
                for c in calls:
                    args = c["function"].get("arguments") or "{}"
                    try:
                        args = json.loads(args) if isinstance(args, str) else args
                    except ValueError:
                        pass  # written back as the string it is
                    written.append(tool_call_text(str(c["function"].get("name", "")), args))
                content = "\n".join([content, *written]) if content else "\n".join(written)
        out.append({"role": "system" if role == "developer" else role, "content": content})
    flush()
    return out, results


# ---------------------------------------------------------------------------------------------
# the reply
# ---------------------------------------------------------------------------------------------


@dataclass
class Choice:
    """One generated reply as the protocol returns it, with the ids it was sampled as."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    tokens: list[str]  # each completion id's text


def choice_of(gen: Generation, tokenizer: Any, tokens: bool = True) -> Choice:
    """The protocol's view of one generation (its turn holds the ids); ``tokens``: each completion
    token's text, decoded one by one (what a reply's logprobs show; skipped when none were asked for)."""
    turn = gen.turn
    calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
             for cid, name, args in gen.calls]
    finish = "tool_calls" if calls else "length" if turn.finish_reason == "length" else "stop"
    content = (gen.content or None) if calls else gen.content
    return Choice(content, calls, finish, list(turn.prompt_ids), list(turn.completion_ids), list(turn.logprobs),
                  [tokenizer.decode([i]) for i in turn.completion_ids] if tokens else [])


def _logprobs(c: Choice) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                        for t, lp in zip(c.tokens, c.logprobs)], "refusal": None}


def completion_body(req: ChatRequest, choices: list[Choice], rid: str, created: int) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": req.model or req.agent,
        "choices": [{"index": i, "finish_reason": c.finish_reason, "logprobs": _logprobs(c) if req.logprobs else None,
                     "message": {"role": "assistant", "content": c.content, "tool_calls": c.tool_calls or None,
                                 "refusal": None}}
                    for i, c in enumerate(choices)],
        "usage": _usage(choices),
    }


def _usage(choices: list[Choice]) -> dict[str, int]:
    prompt = len(choices[0].prompt_ids) if choices else 0
    completion = sum(len(c.completion_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stream_events(req: ChatRequest, choices: list[Choice], rid: str, created: int) -> list[str]:
    """The reply as server-sent events: per choice its role, its text, its tool calls and its finish,
    then the usage (if asked for) and ``[DONE]``."""
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model or req.agent}

    def event(choice: dict[str, Any] | None, **extra: Any) -> str:
        chunk = {**base, "choices": [choice] if choice is not None else [], **extra}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    out = []
    for i, c in enumerate(choices):
        out.append(event({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}))
        if c.content:
            out.append(event({"index": i, "delta": {"content": c.content},
                              "logprobs": _logprobs(c) if req.logprobs else None, "finish_reason": None}))
        elif req.logprobs and c.tokens:
            out.append(event({"index": i, "delta": {}, "logprobs": _logprobs(c), "finish_reason": None}))
        if c.tool_calls:
            calls = [{"index": k, "id": t["id"], "type": "function", "function": t["function"]} for k, t in enumerate(c.tool_calls)]
            out.append(event({"index": i, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}))
        out.append(event({"index": i, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}))
    if req.include_usage:
        out.append(event(None, usage=_usage(choices)))
    out.append("data: [DONE]\n\n")
    return out


# ---------------------------------------------------------------------------------------------
# sessions: who answers the requests of one token
# ---------------------------------------------------------------------------------------------


class Session(Protocol):
    """What the server serves behind one token: the agents, and the loop ``complete`` runs on."""

    agents: list[str]
    loop: asyncio.AbstractEventLoop

    async def complete(self, req: ChatRequest) -> list[Choice]: ...


class EpisodeSession:
    """The requests of one training episode: each one is ``EpisodeContext.call``s of its agent
    through the framework adapters' ``EpisodeCalls`` (the cap on model calls, env tools run by
    mas inside a call, tool calls and their results recorded on the turns)."""

    def __init__(self, ctx: EpisodeContext, max_calls: int | None, request_sampling: bool):
        self.ctx = ctx
        self.calls = EpisodeCalls(ctx, max_calls)
        self.loop = self.calls.loop
        self.agents = list(ctx.agents)
        self.request_sampling = request_sampling  # use a request's temperature/top_p (else the agent's)

    async def complete(self, req: ChatRequest) -> list[Choice]:
        if self.calls.error is not None:
            raise EndpointError(410, f"this episode has ended: {self.calls.error}", code="episode_ended")
        agent = self.ctx.agents[req.agent]
        tokenizer = self.ctx.tokenizers[agent.policy]
        messages, results = chat_messages(req.messages, self.calls.raw_text)
        for cid, content in results:
            self.calls.record_result(cid, content, False)
        parent = self.calls.parent_of([cid for cid, _ in results])
        tools = [] if req.tool_choice == "none" else req.tools
        template = bool(tools) and template_takes_tools(tokenizer)
        options: dict[str, Any] = {"max_new_tokens": req.max_tokens, "stop": req.stop, "tool_choice": req.tool_choice,
                                   "response_format": req.response_format}  # met by a forced start (EpisodeCalls)
        if self.request_sampling:
            options.update(temperature=req.temperature, top_p=req.top_p)
        specs = [{"type": "function", "function": t} for t in tools] if template else None
        try:
            gens = await asyncio.gather(*(self.calls.generate(req.agent, messages, tools, parent, template_tools=specs,
                                                               **options) for _ in range(req.n)))
        except Exception as exc:  # noqa: BLE001 - the episode's error (kept by EpisodeCalls); the client is told
            raise EndpointError(410, f"this episode has ended: {type(exc).__name__}: {exc}", code="episode_ended") from exc
        return [choice_of(g, tokenizer, tokens=req.logprobs) for g in gens]


class ServeBatcher:
    """The requests of concurrent clients, generated together (``mas serve``).

    A request that finds the backend idle starts at once (after one turn of the loop, so that
    requests handed to it at the same moment join); those that arrive while a batch generates
    wait, and when it is done everything waiting goes to the backend as one ``generate_batch``
    call, in the order it arrived.  A backend takes mixed policies and sampling settings in one
    call, as the engine's ``Batcher`` sends them (hf groups them by policy and sampling
    parameters and cuts each row at its own ``max_new_tokens``; vLLM and the openai backend
    take each request's own), so nothing is grouped here.  No seed is passed: what a greedy
    request gets does not depend on which others shared its batch.

    Runs on one event loop (the session's); the backend is called from one worker thread at a
    time, under a lock, since a backend is not thread-safe.  A batch that fails is retried one
    client request at a time, so a request the backend cannot serve fails alone; a ``BatchError``
    fails only the client requests whose rows failed, and ``BackendUnavailable`` every request of
    the batch (``generate_apart``, as the engine's ``Batcher``)."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.calls = 0  # generate_batch calls made
        self._lock = threading.Lock()
        self._waiting: list[tuple[list[GenRequest], asyncio.Future]] = []
        self._server: asyncio.Task | None = None

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """One client request's rows (``n`` of them), generated with whatever else is waiting."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiting.append((requests, fut))
        if self._server is None or self._server.done():
            self._server = loop.create_task(self._serve())
        return await fut

    async def _serve(self) -> None:
        await asyncio.sleep(0)  # one turn of the loop: requests handed to it together are served together
        while True:
            batch = [(reqs, fut) for reqs, fut in self._waiting if not fut.done()]  # done: its client went away
            self._waiting = []
            if not batch:
                return
            try:
                await self._generate(batch)
            except Exception as exc:  # a bug here must not leave clients waiting forever
                for _, fut in batch + self._waiting:
                    settle(fut, error=exc)
                self._waiting = []
                raise

    async def _generate(self, batch: list[tuple[list[GenRequest], asyncio.Future]]) -> None:
        try:  # each client request is a group: one the backend cannot serve fails alone (as in the engine)
            outcomes = await asyncio.to_thread(generate_apart, self._call, [reqs for reqs, _ in batch])
        except BackendUnavailable as exc:
            outcomes = [(None, exc)] * len(batch)
        for (_, fut), (results, error) in zip(batch, outcomes):
            settle(fut, result=results, error=error)

    def _call(self, rows: list[GenRequest]) -> list[GenResult]:
        with self._lock:
            self.calls += 1
            return self.backend.generate_batch(rows, seed=None)


class PolicySession:
    """``mas serve``: the team's agents answering requests outside any episode.  Each request is
    rendered as in training (the role as system message when there is none, tools by the chat
    template or described in the system message) and sampled by the backend together with the
    other clients' requests waiting at that moment (``ServeBatcher``); greedy unless the request
    sends a temperature, and a greedy reply is the one the request would get alone.  Nothing is
    recorded."""

    def __init__(self, agents: dict[str, Any], tokenizers: dict[str, Any], backend: Any,
                 loop: asyncio.AbstractEventLoop):
        self.team, self.tokenizers, self.backend, self.loop = agents, tokenizers, backend, loop
        self.agents = list(agents)
        self.raw_text: dict[str, str] = {}  # call id -> the text that made it (bounded below)
        self.batcher = ServeBatcher(backend)  # on self.loop, where complete() runs
        self._calls = 0

    async def complete(self, req: ChatRequest) -> list[Choice]:
        agent = self.team[req.agent]
        tokenizer = self.tokenizers[agent.policy]
        messages, _ = chat_messages(req.messages, self.raw_text)
        messages = with_format(finish_messages(messages, agent.role), req.response_format)
        tools = [] if req.tool_choice == "none" else req.tools
        template = bool(tools) and template_takes_tools(tokenizer)
        if tools and not template:
            at = next(i for i, m in enumerate(messages) if m["role"] == "system")
            messages[at] = {"role": "system", "content": messages[at]["content"] + "\n\n" + describe_tools(tools)}
        rendered = render_prompt(tokenizer, messages, [{"type": "function", "function": t} for t in tools] if template else None)
        prefix = reply_start(req.tool_choice, [t["name"] for t in tools], req.response_format)
        if prefix:
            rendered = rendered + text_ids(tokenizer, prefix)
        budget = agent.sampling.max_new_tokens
        gen = GenRequest(policy=agent.policy, prompt_ids=rendered, temperature=req.temperature or 0.0,
                         top_p=1.0 if req.top_p is None else req.top_p, top_k=0,
                         max_new_tokens=min(req.max_tokens or budget, budget), agent=req.agent, messages=messages,
                         prefix=prefix)
        results = await self.batcher.generate([gen] * req.n)
        choices = []
        for res in results:
            self._calls += 1
            text = res.text
            for s in req.stop:
                text = text.split(s)[0] if s else text
            text = prefix + text  # the forced start is the reply's (a stop text ends what follows it)
            turn = Turn(agent=req.agent, policy=agent.policy, index=self._calls, parent=None, messages=messages,
                        prompt_ids=rendered, completion_ids=res.completion_ids, logprobs=res.logprobs, text=text,
                        finish_reason=res.finish_reason)
            calls = []
            if tools and has_tool_call(text):
                for k, c in enumerate(parse_tool_calls(text)):
                    if c.error is None:
                        cid = f"call_{self._calls}_{k}"
                        calls.append((cid, c.name, c.arguments or {}))
                        if len(self.raw_text) < 100_000:
                            self.raw_text[cid] = text
            choices.append(choice_of(Generation(turn, calls, outside_calls(text) if calls else text), tokenizer))
        return choices


# ---------------------------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------------------------


class EndpointServer:
    """Starlette on uvicorn in a daemon thread, bound to 127.0.0.1; sessions registered by token."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = MAX_BODY_BYTES):
        self.host, self.max_body_bytes = host, max_body_bytes
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        # IPPROTO_TCP named, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on accepted
        # sockets whose protocol says TCP, and uvicorn writes a reply's headers and body apart, so with
        # Nagle on the body waited for the client's delayed ACK, up to 40 ms a call (bench/endpoint_overhead.py)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def url(self, token: str, agent: str | None = None) -> str:
        """The base_url of a session (``agent``: one that names the agent in its path)."""
        return f"http://{self.host}:{self.port}/{token}" + (f"/agents/{agent}" if agent else "") + "/v1"

    def register(self, session: Session) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._sessions[token] = session
        return token

    def unregister(self, token: str) -> None:
        with self._lock:
            self._sessions.pop(token, None)

    def session(self, token: str) -> Session:
        with self._lock:
            found = self._sessions.get(token)
        if found is None:
            raise EndpointError(404, "no live episode at this address (an unknown token, or an episode that has ended)",
                                code="unknown_token")
        return found

    # -- running ----------------------------------------------------------------------------

    def start(self) -> "EndpointServer":
        import uvicorn

        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
                                        name="mas-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the OpenAI-compatible endpoint did not start")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sock.close()

    # -- the app ----------------------------------------------------------------------------

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        def error(exc: EndpointError) -> Response:
            return JSONResponse(exc.body(), status_code=exc.status)

        async def read_body(request: Request) -> bytes:
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                raise EndpointError(413, f"the body is over the limit of {self.max_body_bytes} bytes", code="body_too_large")
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise EndpointError(413, f"the body is over the limit of {self.max_body_bytes} bytes", code="body_too_large")
                chunks.append(chunk)
            return b"".join(chunks)

        async def answer(session: Session, req: ChatRequest) -> list[Choice]:
            fut = asyncio.run_coroutine_threadsafe(session.complete(req), session.loop)
            try:
                return await asyncio.wrap_future(fut)
            except asyncio.CancelledError:  # the client went away: that call ends, the episode goes on
                fut.cancel()
                raise

        async def chat(request: Request) -> Response:
            try:
                session = self.session(request.path_params["token"])
                raw = await read_body(request)
                req = parse_request(raw, session.agents, request.path_params.get("agent"), request.headers.get(AGENT_HEADER))
                choices = await answer(session, req)
            except EndpointError as exc:
                return error(exc)
            rid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
            if not req.stream:
                return JSONResponse(completion_body(req, choices, rid, created))

            async def events() -> AsyncIterator[str]:
                for e in stream_events(req, choices, rid, created):
                    yield e

            return StreamingResponse(events(), media_type="text/event-stream")

        async def responses(request: Request) -> Response:  # the Responses API, translated (mas.rollout.responses)
            try:
                session = self.session(request.path_params["token"])
                body = read_json(await read_body(request))
                try:
                    chat = chat_body(body)
                except BadRequest as exc:
                    raise _bad(str(exc), exc.param) from None
                try:
                    req = check_request(chat, session.agents, request.path_params.get("agent"),
                                        request.headers.get(AGENT_HEADER))
                except EndpointError as exc:  # named as this API names it
                    if exc.param == "max_tokens":
                        exc.message, exc.param = exc.message.replace("max_tokens", "max_output_tokens"), "max_output_tokens"
                    elif exc.param == "response_format":
                        exc.message, exc.param = "text.format: " + exc.message, "text"
                    raise
                [choice] = await answer(session, req)
            except EndpointError as exc:
                return error(exc)
            rid, created = f"resp_{secrets.token_hex(12)}", int(time.time())
            if not req.stream:
                return JSONResponse(response_body(body, req.agent, choice, rid, created))

            async def events() -> AsyncIterator[str]:
                for e in response_events(body, req.agent, choice, rid, created):
                    yield e

            return StreamingResponse(events(), media_type="text/event-stream")

        async def models(request: Request) -> Response:
            try:
                session = self.session(request.path_params["token"])
            except EndpointError as exc:
                return error(exc)
            return JSONResponse({"object": "list", "data": [{"id": a, "object": "model", "created": 0, "owned_by": "mas"}
                                                            for a in session.agents]})

        async def not_found(request: Request, exc: Exception) -> Response:
            status = getattr(exc, "status_code", 404)
            return error(EndpointError(status, f"{request.method} {request.url.path}: no such route (POST "
                                               "/<token>/v1/chat/completions or /<token>/v1/responses, GET /<token>/v1/models)",
                                       code="not_found" if status == 404 else "method_not_allowed"))

        async def crashed(request: Request, exc: Exception) -> Response:
            return error(EndpointError(500, f"{type(exc).__name__}: {exc}", type_="server_error"))

        routes = [Route("/{token}/v1/chat/completions", chat, methods=["POST"]),
                  Route("/{token}/agents/{agent}/v1/chat/completions", chat, methods=["POST"]),
                  Route("/{token}/v1/responses", responses, methods=["POST"]),
                  Route("/{token}/agents/{agent}/v1/responses", responses, methods=["POST"]),
                  Route("/{token}/v1/models", models, methods=["GET"]),
                  Route("/{token}/agents/{agent}/v1/models", models, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found, Exception: crashed})


_SHARED: EndpointServer | None = None
_SHARED_LOCK = threading.Lock()


def shared_server() -> EndpointServer:
    """The process's endpoint server, started at the first call."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = EndpointServer().start()
        return _SHARED


@dataclass
class Door:
    """What a team's code is handed: where to send its requests, and the key to send."""

    base_url: str
    api_key: str
    session: EpisodeSession

    def rethrow(self, exc: BaseException | None = None) -> None:
        """Raise the episode's own error if a call failed (the team's client wraps it in its own)."""
        self.session.calls.rethrow(exc)


@contextlib.asynccontextmanager
async def episode_endpoint(ctx: EpisodeContext, max_calls: int | None = None,
                           request_sampling: bool = False) -> AsyncIterator[Door]:
    """The endpoint of one episode while it runs: its token is live inside the block, and 404s after."""
    server = shared_server()
    session = EpisodeSession(ctx, max_calls, request_sampling)
    token = server.register(session)
    try:
        yield Door(server.url(token), API_KEY, session)
    finally:
        server.unregister(token)
        session.calls.cancel_pending()
