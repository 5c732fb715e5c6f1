"""Replies in a JSON format a caller asks for: OpenAI's ``response_format``, an AutoGen agent's
``output_content_type``.

A format is ``{"type": "json_object"}`` or ``{"type": "json_schema", "name": ..., "schema": {...}}``.
Asking for one does three things, wherever the call comes from (the OpenAI-compatible endpoint,
the AutoGen model client):

* the system message ends with an instruction to reply with one JSON object, the schema with it
  (``format_instruction``, ``with_format``);
* where the call offers no tool (a tool call is then a reply too), the reply is forced to start
  with ``JSON_START``: those ids end the turn's prompt ids, and only what the model sampled after
  them is trained;
* what follows is sampled, not constrained to the schema: a reply that is not one JSON object, or
  lacks a property the schema requires, stands as written, and ``unmet_response_format`` says how
  it missed (the caller counts the fault ``response_format_unmet``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from mas.tools import forced_call_start

__all__ = ["JSON_START", "asked_format", "format_instruction", "json_schema_format", "reply_start", "shortest_object",
           "shortest_reply", "unmet_response_format", "with_format"]

JSON_START = "{"  # a JSON object's first character: the start a formatted reply is forced to
_PLAIN = "Reply with one JSON object and nothing else."
_SCHEMA = re.compile(re.escape(_PLAIN[:-1]) + r", following this JSON schema \((?P<name>[^)\n]*)\):\n(?P<schema>\{.*)")


def reply_start(tool_choice: Any, tool_names: list[str], fmt: dict[str, Any] | None) -> str:
    """The start a reply is forced to: the tool call a ``tool_choice`` asks for
    (``mas.tools.forced_call_start``), else ``JSON_START`` where a format is asked and no tool is
    offered (a tool call is then a reply too), else none."""
    return forced_call_start(tool_choice, tool_names) or (JSON_START if fmt is not None and not tool_names else "")


def json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The ``json_schema`` format of a named JSON schema (e.g. a pydantic model's ``model_json_schema()``)."""
    return {"type": "json_schema", "name": name, "schema": schema}


def format_instruction(fmt: dict[str, Any]) -> str:
    """What the system message asks of a reply in ``fmt``'s format (the model sees the schema)."""
    if fmt["type"] == "json_object":
        return _PLAIN
    schema = json.dumps(fmt["schema"], ensure_ascii=False, separators=(", ", ": "))
    return f"{_PLAIN[:-1]}, following this JSON schema ({fmt['name']}):\n{schema}"


def asked_format(system: str) -> dict[str, Any] | None:
    """The format a system message asks for, read back from its ``format_instruction`` (None: none,
    or a schema that does not parse)."""
    m = _SCHEMA.search(system)
    if m is not None:
        try:
            schema = json.loads(m.group("schema"))
        except ValueError:
            return None
        return json_schema_format(m.group("name"), schema) if isinstance(schema, dict) else None
    return {"type": "json_object"} if _PLAIN in system else None


def with_format(messages: list[dict[str, str]], fmt: dict[str, Any] | None) -> list[dict[str, str]]:
    """``messages`` with the format's instruction at the end of the first system message (a system
    message of its own first, where there is none)."""
    if fmt is None:
        return messages
    at = next((i for i, m in enumerate(messages) if m["role"] == "system"), None)
    if at is None:
        return [{"role": "system", "content": format_instruction(fmt)}, *messages]
    out = list(messages)
    out[at] = {"role": "system", "content": f"{out[at]['content']}\n\n{format_instruction(fmt)}"}
    return out


def unmet_response_format(fmt: dict[str, Any] | None, text: str) -> str | None:
    """How a text reply failed the format ``fmt`` (None: it did not, or no format was asked): not one
    JSON object, or without a property the schema requires."""
    if fmt is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"response_format {fmt['type']!r} asked for one JSON object, and the reply is not JSON ({exc})"
    if not isinstance(value, dict):
        return f"response_format {fmt['type']!r} asked for one JSON object, and the reply is a {type(value).__name__}"
    required = fmt.get("schema", {}).get("required")  # the client's schema: a list of names, or it asks nothing
    missing = [k for k in required if isinstance(k, str) and k not in value] if isinstance(required, list) else []
    if missing:
        return f"the reply's JSON object lacks {missing}, which the response_format schema {fmt['name']!r} requires"
    return None


def shortest_object(schema: dict[str, Any]) -> dict[str, Any]:
    """The shortest object a JSON schema allows, for measuring whether a reply budget can hold one:
    its required fields, each at its shortest value (a field with allowed values at its longest
    one: any of them may be the one to write)."""
    empty = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    out = {}
    for name in schema.get("required") or []:
        prop = (schema.get("properties") or {}).get(name) or {}
        values = prop.get("enum")
        out[name] = max(values, key=lambda v: len(str(v))) if isinstance(values, list) and values else \
            empty.get(prop.get("type"), "")
    return out


def shortest_reply(fmt: dict[str, Any], tools_offered: bool) -> str:
    """The shortest reply in the format ``fmt`` (its ``shortest_object``), less the ``JSON_START`` it is
    forced to begin with where no tool is offered: what a reply budget must hold."""
    text = json.dumps(shortest_object(fmt.get("schema") or {}), ensure_ascii=False)
    return text if tools_offered else text[len(JSON_START):]
