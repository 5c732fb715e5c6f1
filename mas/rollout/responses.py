"""OpenAI's Responses API (``POST /v1/responses``) on the endpoint, as a translation onto chat completions.

Some clients speak only the Responses API: the OpenAI Agents SDK's ``OpenAIResponsesModel`` (its
default for OpenAI's own models), and tools built on it.  A request is translated into the
chat-completions body it means and served through the same path (``check_request``, the
session's ``complete``), so its turns are recorded token for token as any other; the reply is
translated back into a ``response`` object, or its stream of events.

The translation, item by item of ``input`` (a string is one user message):

* ``instructions`` -> a system message first;
* a ``message`` item (``role``, ``content`` as a string or ``input_text`` / ``output_text`` parts)
  -> a chat message of that role;
* ``function_call`` items -> the ``tool_calls`` of an assistant message (joined to the assistant
  message just before them, which the same response produced);
* a ``function_call_output`` item -> a ``tool`` message with its ``call_id``;
* function ``tools`` (``name``, ``description``, ``parameters`` at the top level) -> chat tools;
  ``tool_choice`` likewise (``allowed_tools`` into chat's form, whose tools the endpoint filters); ``max_output_tokens`` -> ``max_tokens``; ``include: ["message.output_text.logprobs"]``
  -> ``logprobs``.

The endpoint keeps no responses (``store`` is false): ``previous_response_id`` and
``conversation`` are refused with a 400 that says to send the whole conversation, which is what
the Agents SDK does.  Other item types (reasoning, images, files, hosted tools) get a 400 naming
them.  One choice a request (the API has no ``n``).
"""

from __future__ import annotations

import json
import secrets
from typing import Any


class BadRequest(ValueError):
    """What is wrong with a Responses request, and the field (the endpoint answers 400 with it)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _parts_text(content: Any, where: str, field: str = "content") -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}.{field}[{k}]: only text parts ({', '.join(_TEXT_PARTS)}) are served; got {kind!r}",
                                 where)
            out.append(part["text"])
        return "".join(out)
    raise BadRequest(f"{where}: {field} must be a string or a list of text parts", where)


def chat_body(body: Any) -> dict[str, Any]:
    """The chat-completions body a Responses request means; ``BadRequest`` naming the Responses
    field that is wrong otherwise."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object; got {type(body).__name__}")
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise BadRequest(f"{key}: this endpoint keeps no responses (store is not supported); send the whole "
                              "conversation as input", key)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be a string or a non-empty list of items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object; got {type(item).__name__}", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise BadRequest(f"{where}: a message's role must be one of {list(_MESSAGE_ROLES)}; got {role!r}", where)
            messages.append({"role": role, "content": _parts_text(item.get("content"), where)})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise BadRequest(f"{where}: a function_call needs call_id, name and arguments as strings", where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the same response's text and calls: one turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadRequest(f"{where}: a function_call_output needs its call_id", where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _parts_text(item.get("output", ""), where, "output")})
        else:
            raise BadRequest(f"{where}: items of type {kind!r} are not served (message, function_call and "
                              "function_call_output are)", where)
    tools = []
    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise BadRequest("tools must be a list", "tools")
    for i, tool in enumerate(raw_tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise BadRequest(f"tools[{i}]: only function tools are served; got {kind!r}", f"tools[{i}]")
        tools.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}})
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":  # in chat's form: the endpoint checks it
        listed = choice.get("tools")
        if isinstance(listed, list):
            listed = [{"type": "function", "function": {"name": t.get("name")}} for t in listed
                      if isinstance(t, dict) and t.get("type") == "function"]
        choice = {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": listed}}
    elif choice not in ("auto", "none", "required"):
        raise BadRequest(f"tool_choice must be 'auto', 'none', 'required', {{'type': 'function', 'name': ...}} or "
                         f"{{'type': 'allowed_tools', 'mode': ..., 'tools': [...]}}; got {choice!r}", "tool_choice")
    include = body.get("include") or []
    chat = {"model": body.get("model"), "messages": messages, "tool_choice": choice, "stream": body.get("stream"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "max_tokens": body.get("max_output_tokens"),
            "logprobs": isinstance(include, list) and "message.output_text.logprobs" in include}
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None:  # chat's response_format (the endpoint checks it): its json_schema wraps name and schema
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        chat["response_format"] = {"type": kind, "json_schema": {k: fmt[k] for k in ("name", "schema") if k in fmt}} \
            if kind == "json_schema" else fmt
    if tools:
        chat["tools"] = tools
    return chat


def _logprobs(choice: Any) -> list[dict[str, Any]]:
    """The sampled tokens' logprobs, where the request included them (``choice.tokens`` is empty otherwise)."""
    return [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(choice.tokens, choice.logprobs)]


def _output(choice: Any) -> list[dict[str, Any]]:
    """The reply's output items: its text as a message, then each tool call as a function_call."""
    out: list[dict[str, Any]] = []
    if choice.content:
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        out.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "status": status, "role": "assistant",
                    "content": [{"type": "output_text", "text": choice.content, "annotations": [],
                                 "logprobs": _logprobs(choice)}]})
    for call in choice.tool_calls:
        out.append({"type": "function_call", "id": f"fc_{secrets.token_hex(12)}", "call_id": call["id"],
                    "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"})
    return out


def _format(body: dict[str, Any]) -> Any:
    """The request's ``text.format``, echoed (``{"type": "text"}`` where it gave none)."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return fmt if isinstance(fmt, dict) else {"type": "text"}


def response_body(body: dict[str, Any], agent: str, choice: Any, rid: str, created: int,
                  output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``response`` object of one choice (``output``: its items, made once when streamed)."""
    cut = choice.finish_reason == "length"
    prompt, completion = len(choice.prompt_ids), len(choice.completion_ids)
    return {
        "id": rid, "object": "response", "created_at": created, "status": "incomplete" if cut else "completed",
        "error": None, "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model") or agent, "output": _output(choice) if output is None else output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)), "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": body.get("temperature"),
        "text": {"format": _format(body)}, "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "top_p": body.get("top_p"), "truncation": "disabled", "metadata": {},
        "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": completion,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion},
    }


def response_events(body: dict[str, Any], agent: str, choice: Any, rid: str, created: int) -> list[str]:
    """The reply as the Responses API streams it: created, each output item added, its text or its
    arguments (one delta each: a batch is sampled whole), each item done, completed."""
    output = _output(choice)
    final = response_body(body, agent, choice, rid, created, output)
    events: list[str] = []

    def event(kind: str, **data: Any) -> None:
        payload = {"type": kind, "sequence_number": len(events), **data}
        events.append(f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n")

    started = {**final, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    event("response.created", response=started)
    event("response.in_progress", response=started)
    for k, item in enumerate(output):
        if item["type"] == "message":
            text, lps = item["content"][0]["text"], item["content"][0]["logprobs"]
            event("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            event("response.content_part.added", item_id=item["id"], output_index=k, content_index=0, part=part)
            event("response.output_text.delta", item_id=item["id"], output_index=k, content_index=0, delta=text, logprobs=lps)
            event("response.output_text.done", item_id=item["id"], output_index=k, content_index=0, text=text, logprobs=lps)
            event("response.content_part.done", item_id=item["id"], output_index=k, content_index=0,
                  part={**part, "text": text, "logprobs": lps})
        else:
            event("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "arguments": ""})
            event("response.function_call_arguments.delta", item_id=item["id"], output_index=k, delta=item["arguments"])
            event("response.function_call_arguments.done", item_id=item["id"], output_index=k, arguments=item["arguments"])
        event("response.output_item.done", output_index=k, item=item)
    event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
    return events

