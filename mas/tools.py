"""Tools inside agent turns: the tool-call format, argument checks and observations.

An agent with ``tools`` in its config may call them before it replies.  The format is the
JSON-in-tags convention of Qwen2.5 / Hermes function calling (what instruct models of that
family were tuned on), one call per block, any number of blocks in one message::

    <tool_call>{"name": "search", "arguments": {"query": "Kiss and Tell 1945 film", "k": 3}}</tool_call>

Rules (each violation becomes an observation that says what was wrong; nothing raises):

* a message that contains ``<tool_call>`` is a tool message: every block in it is a call
  (at most ``MAX_BLOCKS``; further blocks are one error);
  a block runs from ``<tool_call>`` to the next ``</tool_call>`` (a missing close tag is an
  error); a Markdown code fence around the JSON is tolerated;
* the block holds one JSON object with exactly the keys ``name`` (a string) and
  ``arguments`` (an object; may be omitted when the tool needs none), parsed with
  ``json.loads``: model output is never evaluated;
* ``name`` must be one of the agent's tools; ``arguments`` must give every required
  parameter, no unknown ones, each of its declared type (``str``: a non-empty string,
  ``int``: a JSON integer);
* the tool itself may reject a value (``ToolError``, e.g. an unknown title); that call is
  invalid too.

Tools run outside the training process: the engine hands every call to a
``mas.process.sandbox.Sandbox`` of forked worker processes with a time limit, a memory limit and no
network (``runtime.tool_timeout_s``, ``runtime.tool_memory_mb``, ``runtime.tool_workers``),
so a tool that hangs, allocates without bound or opens a socket costs one error observation,
never the rollout.

The engine (``mas.rollout.engine.EpisodeContext.call``) runs the calls, records them on the turn
(``Turn.tool_calls``: name, arguments, valid, error; ``Turn.observations``: one text per
call) and calls the agent again with the observations in a user message, each inside
``<tool_response>`` tags (how Qwen's chat template shows tool results), until the agent
replies without a tool call or spends ``max_tool_calls``.  ``Turn.extra_rewards["tool_valid"]``
is the fraction of the turn's calls that were valid (SHARP's tool-process reward reads it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "TOOL_VALID_KEY",
    "ToolCall",
    "ToolError",
    "ToolParam",
    "ToolSpec",
    "forced_call_name",
    "forced_call_start",
    "has_tool_call",
    "parse_tool_calls",
    "run_tool_call",
    "skipped_call",
    "tool_call_start",
    "tool_call_text",
    "tool_results_message",
    "tools_prompt",
    "unmet_tool_choice",
]

TOOL_VALID_KEY = "tool_valid"  # Turn.extra_rewards key of the per-turn tool-validity signal
OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE = "```"
MAX_BLOCKS = 64  # tool-call blocks read from one message; more are one error (a degenerate message may hold 10^5)


class ToolError(ValueError):
    """Raised by a tool for an argument value it cannot serve; the message is shown to the agent."""


@dataclass(frozen=True)
class ToolParam:
    name: str
    type: Literal["str", "int"]
    description: str
    required: bool = True
    default: Any = None
    example: Any = None  # shown in the prompt's example call


@dataclass(frozen=True)
class ToolSpec:
    """A named function the agent may call: its parameters and what it does."""

    name: str
    description: str
    params: tuple[ToolParam, ...]
    fn: Callable[..., str] = field(compare=False)

    def signature(self) -> str:
        parts = [f"{p.name}: {p.type}" + ("" if p.required else f" = {p.default!r}") for p in self.params]
        return f"{self.name}({', '.join(parts)})"

    def example(self) -> str:
        args = {p.name: p.example for p in self.params if p.example is not None}
        return tool_call_text(self.name, args)


@dataclass
class ToolCall:
    """One parsed block: either a name and arguments, or the parse error."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None


def tool_call_text(name: str, arguments: Any) -> str:
    """One call as a model writes it: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, the
    JSON's text kept literal (a non-ASCII title stays as it reads, not ``\\u`` escapes)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


def tool_call_start(name: str | None = None) -> str:
    """The start of a call as ``tool_call_text`` writes it, up to where a model's own choice begins:
    ``<tool_call>{"name": "`` (any tool), or with ``name`` up to its arguments
    (``<tool_call>{"name": "add", "arguments": ``).  A reply forced to begin with it is a call (how the
    endpoint meets a request's ``tool_choice``)."""
    if name is None:
        return f'{OPEN}{{"name": "'
    return f'{OPEN}{json.dumps({"name": name}, ensure_ascii=False)[:-1]}, "arguments": '


def forced_call_start(choice: Any, names: list[str]) -> str:
    """The start a reply is forced to so that it meets an OpenAI ``tool_choice`` (checked against the
    tools ``names`` offered): ``required``, a call (of the one tool, where one is offered); a named
    function (``{"type": "function", "function": {"name": ...}}``), that function's call; else, and with
    no tools offered, none."""
    if not names:
        return ""
    if choice == "required":
        return tool_call_start(names[0] if len(names) == 1 else None)
    if isinstance(choice, dict):
        return tool_call_start(choice["function"]["name"])
    return ""


def forced_call_name(start: str) -> str | None:
    """The tool a forced start names (``tool_call_start(name)``), None where it names none."""
    head = tool_call_start()
    if not start.startswith(head) or not start.endswith(', "arguments": '):
        return None
    try:
        return json.loads(start[len(OPEN):] + "null}")["name"]
    except (ValueError, KeyError, TypeError):
        return None


def unmet_tool_choice(choice: Any, called: list[str]) -> str | None:
    """How a reply that called the tools ``called`` failed a ``tool_choice`` (None: it did not).  The
    reply starts as a call (``forced_call_start``), but what the model wrote after that start may
    still make no valid call: a name not offered, JSON that does not close."""
    if choice == "required" and not called:
        return "tool_choice 'required' asked for a tool call, and the reply called none"
    if isinstance(choice, dict) and choice["function"]["name"] not in called:
        return (f"tool_choice asked for a call of {choice['function']['name']!r}, and the reply called "
                f"{', '.join(repr(c) for c in called) if called else 'none'}")
    return None


def has_tool_call(text: str) -> bool:
    return OPEN in text


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block of ``text`` in order (no block: [])."""
    calls: list[ToolCall] = []
    pos = text.find(OPEN)
    while pos != -1:
        if len(calls) == MAX_BLOCKS:
            calls.append(ToolCall(None, None, f"more than {MAX_BLOCKS} tool calls in one message; the rest were not read"))
            break
        start = pos + len(OPEN)
        end = text.find(CLOSE, start)
        if end == -1:
            calls.append(ToolCall(None, None, f"the tool call has no closing {CLOSE} tag"))
            break
        calls.append(_parse_block(text[start:end]))
        pos = text.find(OPEN, end + len(CLOSE))
    return calls


def _unfence(body: str) -> str:
    """The inside of a Markdown code fence around the whole (stripped) block: ```json ... ```.

    Plain string operations, linear in the length: a backtracking pattern here took cubic time
    on an opening fence followed by a long run of whitespace and no closing fence.  A block
    that opens a fence without closing it is left as it is (and fails as JSON).
    """
    if len(body) >= 2 * len(FENCE) and body.startswith(FENCE) and body.endswith(FENCE):
        inner = body[len(FENCE) : -len(FENCE)]
        return (inner[len("json") :] if inner.startswith("json") else inner).strip()
    return body


def _parse_block(body: str) -> ToolCall:
    body = _unfence(body.strip())
    if not body:
        return ToolCall(None, None, "the tool call is empty; put a JSON object between the tags")
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, None, f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    except RecursionError:  # brackets nested deeper than the JSON decoder goes
        return ToolCall(None, None, "the tool call is not valid JSON (nested too deeply)")
    if not isinstance(obj, dict):
        return ToolCall(None, None, f"the tool call must be a JSON object, found {type(obj).__name__}")
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return ToolCall(None, None, f"unknown key(s) {extra} in the tool call; valid keys: 'name', 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCall(None, None, "the tool call has no 'name' string")
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        return ToolCall(name, None, f"'arguments' must be a JSON object, found {type(args).__name__}")
    return ToolCall(name.strip(), args)


def _check_arguments(spec: ToolSpec, args: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    names = [p.name for p in spec.params]
    unknown = sorted(set(args) - set(names))
    if unknown:
        return None, f"{spec.name} got unknown argument(s) {unknown}; its signature is {spec.signature()}"
    out: dict[str, Any] = {}
    for p in spec.params:
        if p.name not in args:
            if p.required:
                return None, f"{spec.name} needs the argument {p.name!r}; its signature is {spec.signature()}"
            out[p.name] = p.default
            continue
        value = args[p.name]
        if p.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            return None, f"argument {p.name!r} of {spec.name} must be an integer, found {value!r}"
        if p.type == "str" and (not isinstance(value, str) or not value.strip()):
            return None, f"argument {p.name!r} of {spec.name} must be a non-empty string, found {value!r}"
        out[p.name] = value.strip() if p.type == "str" else value
    return out, None


def run_tool_call(
    call: ToolCall, tools: Mapping[str, ToolSpec], runner: Callable[..., Any] | None = None
) -> tuple[dict[str, Any], str]:
    """Run one parsed call against the agent's ``tools``: (record for Turn.tool_calls, observation).

    ``runner(name, **arguments)`` runs the tool: the engine passes a ``mas.process.sandbox.Sandbox``
    holding the env's tool functions (a subprocess with a time limit, a memory limit and no
    network); without one the function is called in this process (unit tests of the format).
    A call the tool could not finish (it raised, hung past the time limit or ran out of memory)
    is an error observation whose record carries ``fault``: "tool_error", "tool_timeout" or
    "tool_memory"; a ``ToolError`` (the tool's answer to a value it cannot serve) is not a fault.
    """
    from mas.process.sandbox import SandboxMemoryError, SandboxTimeout

    record: dict[str, Any] = {"name": call.name, "arguments": call.arguments, "valid": False, "error": None}
    if call.error is None and call.name not in tools:
        call = ToolCall(call.name, call.arguments, f"unknown tool {call.name!r}; you can call {', '.join(sorted(tools)) or 'none'}")
    if call.error is not None:
        record["error"] = call.error
        return record, f"error: {call.error}. Write a call as {_any_example(tools)}"
    spec = tools[call.name]
    args, error = _check_arguments(spec, call.arguments or {})
    if error is not None:
        record["error"] = error
        return record, f"error: {error}. Example: {spec.example()}"
    record["arguments"] = args
    try:
        observation = runner(spec.name, **args) if runner is not None else spec.fn(**args)
    except ToolError as e:
        record["error"] = str(e)
        return record, f"error: {e}"
    except SandboxTimeout as e:
        record["error"], record["fault"] = f"{spec.name} failed: {e}", "tool_timeout"
        return record, f"error: {record['error']}"
    except SandboxMemoryError as e:
        record["error"], record["fault"] = f"{spec.name} failed: {e}", "tool_memory"
        return record, f"error: {record['error']}"
    except Exception as e:  # noqa: BLE001 - a tool failure is an observation, never a crashed episode
        record["error"], record["fault"] = f"{spec.name} failed: {type(e).__name__}: {e}", "tool_error"
        return record, f"error: {record['error']}"
    if not isinstance(observation, str):
        record["error"], record["fault"] = f"{spec.name} failed: it returned {type(observation).__name__}, not text", "tool_error"
        return record, f"error: {record['error']}"
    record["valid"] = True
    return record, observation


def skipped_call(call: ToolCall, reason: str) -> tuple[dict[str, Any], str]:
    """A call that is not run (the agent's tool-call budget is spent)."""
    return {"name": call.name, "arguments": call.arguments, "valid": False, "error": reason}, f"not run: {reason}"


def _any_example(tools: Mapping[str, ToolSpec]) -> str:
    return next(iter(tools.values())).example() if tools else f'{OPEN}{{"name": ..., "arguments": {{...}}}}{CLOSE}'


CALLS_LEFT = "tool calls left"


def tool_results_message(observations: list[str], calls_left: int) -> str:
    """The user message that hands a tool round's observations back to the agent."""
    blocks = "\n".join(f"<tool_response>\n{obs}\n</tool_response>" for obs in observations)
    if calls_left > 0:
        return f"{blocks}\n({CALLS_LEFT}: {calls_left})"
    return f"{blocks}\nYou have used all your tool calls. Reply now, without a tool call."


def calls_spent(results_message: str) -> bool:
    """Whether a ``tool_results_message`` says the agent's tool calls are spent (a scripted
    teacher reads this to reply instead of calling again)."""
    return CALLS_LEFT not in results_message


def tools_prompt(specs: list[ToolSpec], max_calls: int) -> str:
    """Text appended to an agent's role prompt: its tools, the call format and the budget."""
    lines = [f"You can call these tools (at most {max_calls} calls) before you reply:"]
    lines += [f"- {s.signature()}: {s.description}" for s in specs]
    lines += [
        f"To call a tool, write {OPEN}, one JSON object with \"name\" and \"arguments\", then {CLOSE}, e.g.",
        specs[0].example(),
        "Each result comes back inside <tool_response> tags. When you have what you need, reply without a tool call.",
    ]
    return "\n".join(lines)
