"""An AutoGen ``ChatCompletionClient`` whose model is a mas policy: one client per agent name.

``MasModelClient(calls, agent)`` sends every ``create`` of the AutoGen agent that holds it to
``EpisodeContext.call`` of the mas agent ``agent`` (``topologies/adapters.py``): the prompt is
rendered with that agent's policy chat template, the call is batched with every running
episode's calls, recorded as a Turn of that agent, and reused, masked or removed in replays
and interventions.  A generation with ``<tool_call>`` blocks comes back as ``FunctionCall``s
(``finish_reason="function_calls"``) for AutoGen to run; the results reach the turn through
``record_result`` (the topology reads them from the team's event stream).

Messages: ``SystemMessage`` -> system; ``UserMessage`` -> user, prefixed ``<source>: `` when
another agent (not the task's "user") sent it; ``AssistantMessage`` -> assistant (the text the
model wrote, tool calls included) when this client wrote it, else user prefixed with its source
(a swarm hands an agent's context to the next); ``FunctionExecutionResultMessage`` -> user, each result in
``<tool_response>`` tags.  Images are not supported (the policies read text).

``tool_choice`` ``required`` or a tool forces the reply to start as a call (``mas.tools.forced_call_start``).
JSON output (``json_output=True``) and structured output (``json_output`` a pydantic model, what an
agent's ``output_content_type`` sends) are served as the endpoint serves ``response_format``
(``mas.response_format``): the system message asks for one JSON object (the model's schema with
it), and where no tool is offered the reply starts with ``{``; AutoGen parses the text into the
model.  A reply that misses the format stands as written and counts the fault
``response_format_unmet`` (AutoGen's own parse then fails the episode with its error).
``extra_create_args`` are ignored: sampling is the agent's YAML ``sampling`` section.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Literal

from autogen_core import CancellationToken, FunctionCall, Image
from autogen_core.models import (
    AssistantMessage,
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelFamily,
    ModelInfo,
    RequestUsage,
    SystemMessage,
    UserMessage,
)
from autogen_core.tools import Tool, ToolSchema

from mas.response_format import json_schema_format
from mas.tools import tool_call_text
from mas.topologies.adapters import EpisodeCalls, tool_results_text, tool_schema

MODEL_INFO: ModelInfo = {
    "vision": False,
    "function_calling": True,  # in the <tool_call> format of mas.tools
    "json_output": True,  # mas.response_format
    "family": ModelFamily.UNKNOWN,  # a SelectorGroupChat then sends its prompt as a user message
    "structured_output": True,
    "multiple_system_messages": True,
}


class NotInEpisodeError(RuntimeError):
    """A mas client was used outside a mas episode (it has no model of its own)."""


class MasModelClient(ChatCompletionClient):
    """The model client of one mas agent inside one episode (``calls``) of an AutoGen team."""

    def __init__(self, calls: EpisodeCalls | None, agent: str):
        self._calls = calls
        self.agent = agent
        self._usage = RequestUsage(prompt_tokens=0, completion_tokens=0)
        self._own: set[str] = set()  # texts and call ids this client returned: the agent's own messages

    # -- ChatCompletionClient -------------------------------------------------------------

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> CreateResult:
        if self._calls is None:
            raise NotInEpisodeError(f"the mas model client of agent {self.agent!r} was called outside a mas episode; "
                                    "it answers only while mas runs the team (mas train / mas eval)")
        fmt = _json_format(self.agent, json_output)
        schemas = [] if tool_choice == "none" else [_schema(t) for t in tools]
        last = messages[-1] if messages else None  # tool results last: this call continues that tool turn
        results = [r.call_id for r in last.content] if isinstance(last, FunctionExecutionResultMessage) else []
        gen = await self._calls.generate(self.agent, self._chat(messages), schemas, self._calls.parent_of(results),
                                         tool_choice=_openai_choice(tool_choice, [s["name"] for s in schemas]),
                                         response_format=fmt)  # the reply starts as asked
        turn = gen.turn
        usage = RequestUsage(prompt_tokens=len(turn.prompt_ids), completion_tokens=len(turn.completion_ids))
        self._usage = RequestUsage(self._usage.prompt_tokens + usage.prompt_tokens,
                                   self._usage.completion_tokens + usage.completion_tokens)
        self._own.update([turn.text.strip(), gen.content] + [cid for cid, _, _ in gen.calls])
        if gen.calls:
            content: str | list[FunctionCall] = [FunctionCall(id=cid, name=name, arguments=json.dumps(args))
                                                 for cid, name, args in gen.calls]
            return CreateResult(finish_reason="function_calls", content=content, usage=usage, cached=False,
                                thought=gen.content or None)
        finish = "length" if turn.finish_reason == "length" else "stop"
        return CreateResult(finish_reason=finish, content=turn.text.strip(), usage=usage, cached=False)

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> AsyncGenerator[str | CreateResult, None]:
        """The whole generation as one chunk, then the result (a batch is sampled at once)."""
        result = await self.create(messages, tools=tools, tool_choice=tool_choice, json_output=json_output,
                                   extra_create_args=extra_create_args, cancellation_token=cancellation_token)
        if isinstance(result.content, str) and result.content:
            yield result.content
        yield result

    async def close(self) -> None:
        """Nothing to release: the policy belongs to the run, not to the client."""

    def actual_usage(self) -> RequestUsage:
        return self._usage

    def total_usage(self) -> RequestUsage:
        return self._usage

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        if self._calls is None:
            raise NotInEpisodeError(f"the mas model client of agent {self.agent!r} has no tokenizer outside a mas episode")
        ctx = self._calls.ctx
        return len(ctx.prompts.render(ctx.tokenizers[ctx.agents[self.agent].policy], self._chat(messages)))  # the call that follows reuses it

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        ctx = self._calls.ctx if self._calls is not None else None
        limit = getattr(ctx.tokenizers[ctx.agents[self.agent].policy], "model_max_length", None) if ctx else None
        limit = limit if isinstance(limit, int) and limit < 10**8 else 32768  # tokenizers without a limit say 1e30
        return limit - self.count_tokens(messages, tools=tools)

    @property
    def capabilities(self) -> Any:  # deprecated by AutoGen in favour of model_info
        return {k: MODEL_INFO[k] for k in ("vision", "function_calling", "json_output")}

    @property
    def model_info(self) -> ModelInfo:
        return MODEL_INFO

    # -- messages -------------------------------------------------------------------------

    def _chat(self, messages: Sequence[LLMMessage]) -> list[dict[str, str]]:
        out = []
        for m in messages:
            if isinstance(m, SystemMessage):
                out.append({"role": "system", "content": m.content})
            elif isinstance(m, UserMessage):
                text = _text(m.content)
                out.append({"role": "user", "content": text if m.source in ("user", "") else f"{m.source}: {text}"})
            elif isinstance(m, AssistantMessage):
                text = self._assistant_text(m)
                if self._is_own(m):
                    out.append({"role": "assistant", "content": text})
                else:  # another agent's reply in this agent's context (a swarm hands its context over)
                    out.append({"role": "user", "content": f"{m.source}: {text}"})
            elif isinstance(m, FunctionExecutionResultMessage):
                out.append({"role": "user", "content": tool_results_text([r.content for r in m.content])})
            else:  # pragma: no cover - LLMMessage has only these four kinds
                raise TypeError(f"unknown AutoGen message {type(m).__name__}")
        return out

    def _is_own(self, m: AssistantMessage) -> bool:
        if isinstance(m.content, str):
            return m.content.strip() in self._own
        return bool(m.content) and m.content[0].id in self._own

    def _assistant_text(self, m: AssistantMessage) -> str:
        if isinstance(m.content, str):
            return m.content
        raw = self._calls.raw_text.get(m.content[0].id) if self._calls and m.content else None
        if raw is not None:  # exactly what the model wrote
            return raw
        calls = [tool_call_text(c.name, _json_or_text(c.arguments)) for c in m.content]
        return "\n".join(([m.thought] if m.thought else []) + calls)


def _openai_choice(choice: Any, names: list[str]) -> Any:
    """AutoGen's ``tool_choice`` (``auto``, ``required``, ``none`` or one of the tools) in OpenAI's form;
    a tool that is not among ``tools`` is a ValueError."""
    if isinstance(choice, str):
        return choice
    name = choice.schema["name"] if hasattr(choice, "schema") else getattr(choice, "name", None)
    if name not in names:
        raise ValueError(f"tool_choice names the tool {name!r}, which is not among the tools of the call {names}")
    return {"type": "function", "function": {"name": name}}


def _json_format(agent: str, json_output: Any) -> dict[str, Any] | None:
    """AutoGen's ``json_output`` as a format of ``mas.response_format``: None or False (text), True
    (one JSON object), or a pydantic model (its JSON schema, by the model's name)."""
    if json_output is None or json_output is False:
        return None
    if json_output is True:
        return {"type": "json_object"}
    schema = getattr(json_output, "model_json_schema", None)
    if not isinstance(json_output, type) or not callable(schema):
        raise ValueError(f"agent {agent!r}: json_output must be True, False, None or a pydantic model class; "
                         f"got {json_output!r}")
    return json_schema_format(json_output.__name__, schema())


def _schema(tool: Tool | ToolSchema) -> dict[str, Any]:
    s = tool.schema if hasattr(tool, "schema") else tool
    return tool_schema(s["name"], s.get("description", ""), s.get("parameters"))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part if isinstance(part, str) else "[image]" if isinstance(part, Image) else str(part) for part in content)


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
