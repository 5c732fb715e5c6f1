"""A LangChain chat model bound to a mas agent: ``MasChatModel(agent="solver")``.

Use it in a LangGraph graph wherever the graph used a chat model (``ChatOpenAI(...)``):
``invoke``/``ainvoke`` become ``EpisodeContext.call`` of that agent in the episode that is
running the graph (``topologies/adapters.py``: batched, recorded as the agent's Turn, reused,
masked or removed by replays and interventions).  ``bind_tools`` works as with any LangChain
chat model: the tools are described to the policy, calls in the ``<tool_call>`` format come
back as ``AIMessage.tool_calls`` (malformed ones as ``invalid_tool_calls``), and the results
(``ToolMessage``s, e.g. from a ``ToolNode``) are recorded on the turn that made the calls.

The episode is found through a context variable that ``kind: langgraph`` sets for each run,
so one compiled graph serves every concurrent episode.  In an ``async def`` node use
``await model.ainvoke(...)``; a plain ``def`` node may call ``model.invoke(...)``: LangGraph runs
it in a worker thread, and the call is handed to the engine's event loop.

Messages: system -> system, human -> user, AI -> assistant (the text the model wrote, tool
calls included), tool -> user with the result in ``<tool_response>`` tags.  An AI message of
another agent (its ``name``, or the agent mas recorded on it, is not this model's agent: a
shared message list in a supervisor or network graph) -> user, as ``<name>: <text>``, so the
policy never reads another agent's words as its own.  ``stop`` words are
ignored (a completion ends at the policy's stop tokens or ``max_new_tokens``); sampling is the
agent's YAML ``sampling`` section.

``with_structured_output(Schema)`` is LangChain's own (``method="function_calling"``, the
default): the schema bound as the one tool with ``tool_choice="any"``, so every reply starts as a
call of it and its arguments are the object (a reply whose arguments do not parse gives
LangChain's parser error, or None, as with any chat model).  ``method="json_schema"`` (what
``ChatOpenAI`` does by default) and ``"json_mode"`` are served as the endpoint serves
``response_format`` (``mas.response_format``): the system message asks for one JSON object with
the schema, the reply starts with ``{`` where no tool is offered, and LangChain's JSON parser
reads it; a miss counts the fault ``response_format_unmet``.  Once its episode is
stopped (past ``runtime.episode_timeout_s`` or ``topology.max_model_calls``) every call raises
``EpisodeStopped``, so a graph that loops forever unwinds.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import Field

from mas.response_format import json_schema_format
from mas.tools import tool_call_text
from mas.topologies.adapters import EpisodeCalls, tool_results_text, tool_schema

EPISODE: ContextVar[EpisodeCalls | None] = ContextVar("mas_episode", default=None)  # set per run by kind: langgraph
BUILDING: ContextVar[list[str] | None] = ContextVar("mas_building", default=None)  # agents named while a graph is built


class NotInEpisodeError(RuntimeError):
    """The model was called outside a mas episode (it has no weights of its own)."""


class MasChatModel(BaseChatModel):
    """The chat model of the mas agent ``agent``; its weights are that agent's policy."""

    agent: str = Field(description="Name of the mas agent (YAML agents[].name) whose policy answers.")

    def model_post_init(self, context: Any) -> None:
        building = BUILDING.get()
        if building is not None:
            building.append(self.agent)

    @property
    def _llm_type(self) -> str:
        return "mas"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"agent": self.agent}

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        """The tools as OpenAI function specs; ``tool_choice`` as ``ChatOpenAI`` takes it (``auto``,
        ``none``, ``any`` or ``required``, ``True`` with one tool, a tool's name, or OpenAI's dict),
        checked here: a choice that asks for a call makes every reply start as one
        (``mas.tools.forced_call_start``)."""
        specs = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=specs, tool_choice=openai_tool_choice(tool_choice, [t["function"]["name"] for t in specs]),
                         **kwargs)

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, method: str = "function_calling",
                               strict: bool | None = None, **kwargs: Any) -> Any:
        """LangChain's structured output: ``function_calling`` (the default) as LangChain's base class
        does it, ``json_schema`` and ``json_mode`` as a JSON ``response_format`` (module docstring).
        ``strict`` is accepted and has no effect: the reply is sampled, not constrained to the schema."""
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        if method not in ("json_schema", "json_mode"):
            raise ValueError(f"method must be 'function_calling', 'json_schema' or 'json_mode'; got {method!r}")
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        if method == "json_mode":
            fmt: dict[str, Any] = {"type": "json_object"}
        else:
            spec = convert_to_json_schema(schema)
            fmt = json_schema_format(spec.get("title") or getattr(schema, "__name__", "response"), spec)
        llm = self.bind(response_format=fmt, ls_structured_output_format={"kwargs": {"method": method}, "schema": schema})
        parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=lambda x: parser.invoke(x["raw"]), parsing_error=lambda _: None)
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")

    def _episode(self) -> EpisodeCalls:
        calls = EPISODE.get()
        if calls is None:
            raise NotInEpisodeError(f"MasChatModel(agent={self.agent!r}) was called outside a mas episode; it answers only "
                                    "while mas runs the graph (a kind: langgraph team in mas train / mas eval)")
        return calls

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        calls = self._episode()
        try:
            on_loop = asyncio.get_running_loop() is calls.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            raise RuntimeError(f"MasChatModel(agent={self.agent!r}).invoke() was called on the event loop (an async node); "
                               "use `await model.ainvoke(...)` there")
        return calls.call_from_thread(self._call(calls, messages, kwargs))

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return await self._call(self._episode(), messages, kwargs)

    async def _call(self, calls: EpisodeCalls, messages: list[BaseMessage], kwargs: dict[str, Any]) -> ChatResult:
        tools = [] if kwargs.get("tool_choice") == "none" else [
            tool_schema(t["function"]["name"], t["function"].get("description", ""), t["function"].get("parameters"))
            for t in kwargs.get("tools") or []]
        results = []  # trailing tool results: this call continues the tool turn that asked for them
        for m in reversed(messages):
            if not isinstance(m, ToolMessage):
                break
            results.append(m.tool_call_id)
        gen = await calls.generate(self.agent, _chat(messages, calls, self.agent), tools, calls.parent_of(results),
                                   tool_choice=kwargs.get("tool_choice"),  # bind_tools' (a forced start meets it)
                                   response_format=kwargs.get("response_format"))  # with_structured_output's JSON methods
        turn = gen.turn
        good = {cid for cid, _, _ in gen.calls}
        message = AIMessage(
            content=gen.content.strip(),
            tool_calls=[tool_call(name=name, args=args, id=cid) for cid, name, args in gen.calls],
            invalid_tool_calls=[invalid_tool_call(name=r["name"], args=None, id=r["id"], error=r["error"])
                                for r in turn.tool_calls if r.get("id") not in good] if tools else [],
            usage_metadata={"input_tokens": len(turn.prompt_ids), "output_tokens": len(turn.completion_ids),
                            "total_tokens": len(turn.prompt_ids) + len(turn.completion_ids)},
            response_metadata={"finish_reason": turn.finish_reason, "agent": self.agent, "turn": turn.index},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def openai_tool_choice(choice: Any, names: list[str]) -> Any:
    """LangChain's ``tool_choice`` in OpenAI's form, checked against the tools ``names``: None or
    ``auto``, ``none``, ``required`` (also ``any``, and ``True`` with one tool), or a named function."""
    if choice is None or (isinstance(choice, str) and choice in ("auto", "none", "required")):
        return choice
    if choice == "any" or (choice is True and len(names) == 1):
        return "required"
    name = choice if isinstance(choice, str) else (choice.get("function") or {}).get("name") \
        if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise ValueError(f"tool_choice must be 'auto', 'none', 'any', 'required', True with one tool, a tool's name or "
                         f"{{'type': 'function', 'function': {{'name': ...}}}}; got {choice!r} for the tools {names}")
    if name not in names:
        raise ValueError(f"tool_choice names {name!r}, which is not among the bound tools {names}")
    return {"type": "function", "function": {"name": name}}


def record_tool_messages(calls: EpisodeCalls, messages: list[Any]) -> None:
    """Put the results of ``ToolMessage``s on the turns whose calls they answer."""
    for m in messages:
        if isinstance(m, ToolMessage):
            calls.record_result(m.tool_call_id, _text(m.content), m.status == "error")


def _author(m: AIMessage) -> str | None:
    """Who wrote an AI message: its ``name``, else the agent mas recorded when it generated it."""
    return m.name or (m.response_metadata or {}).get("agent")


def _chat(messages: list[BaseMessage], calls: EpisodeCalls, agent: str) -> list[dict[str, str]]:
    record_tool_messages(calls, messages)
    out = []
    for m in messages:
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": _text(m.content)})
        elif isinstance(m, HumanMessage):
            out.append({"role": "user", "content": _text(m.content)})
        elif isinstance(m, AIMessage):
            raw = calls.raw_text.get(m.tool_calls[0]["id"]) if m.tool_calls else None
            if raw is None:  # not generated by mas in this episode: its text and calls as the model would write them
                raw = "\n".join(([_text(m.content)] if _text(m.content) else [])
                                + [tool_call_text(c["name"], c["args"]) for c in m.tool_calls])
            author = _author(m)
            if author and author != agent:  # another agent's words: read, not written, by this one
                out.append({"role": "user", "content": f"{author}: {raw}"})
            else:
                out.append({"role": "assistant", "content": raw})
        elif isinstance(m, ToolMessage):
            out.append({"role": "user", "content": tool_results_text([_text(m.content)])})
        elif isinstance(m, ChatMessage):
            out.append({"role": m.role, "content": _text(m.content)})
        else:
            raise TypeError(f"MasChatModel cannot render a {type(m).__name__}")
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(part.get("text", ""))
    return "\n".join(parts)
