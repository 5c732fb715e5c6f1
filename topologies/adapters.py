"""What the AutoGen and LangGraph adapters share: one episode's model calls from a framework.

A framework team calls its models through a mas client (an AutoGen ``ChatCompletionClient``,
a LangChain chat model).  Each client call becomes ``EpisodeContext.call`` of the agent it is
bound to, so it is batched with every other episode's calls, recorded as a Turn of that
agent, and replayed, masked or removed when a credit method asks; nothing here samples.

The rules, the same for both frameworks:

* Prompt.  The framework's messages, converted to chat messages by the adapter.  With no
  system message, the agent's YAML ``role`` is the system message.  Consecutive user
  messages are joined into one (several agents speaking in a row read as one transcript), and
  empty messages are left out, so an agent removed by an intervention is not seen.
* Tools.  The framework runs the tools (an AutoGen ``FunctionTool``, a LangGraph
  ``ToolNode``); the model writes calls in the format of ``mas.tools``,
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.  Tools the agent's role does not
  describe already (the env's tools do) are described in the system message.  A generation
  with calls is a tool turn (label ``tool``); its calls and, once the framework ran them, their
  observations and validity are recorded on it (``tool_valid`` as for env tools).  Call ids
  are ``call_<turn>_<k>``, the same in a replay, so a replayed transcript renders the same.
* The env's tools.  An agent's YAML ``tools`` (the env's, e.g. ``search``) that its framework
  code does not give it run inside mas, as in the built-in topologies: ``ctx.call`` runs them
  in the engine's sandbox, records each round as a turn and calls the agent again with the
  results; the framework sees the final reply.  The agent is told about them (the role's tool
  description is added to a system message of its own).  A generation that calls a tool of
  the framework's goes to the framework as is (it runs only its own tools).
* The cap.  ``max_calls`` (``topology.max_model_calls``) bounds the model calls of one episode:
  the next one stops the episode (``EpisodeContext.stop``, fault ``model_call_limit``), so a team
  that never terminates ends.  Left out, it is derived from the team's own termination where its
  kind can read one (``TeamBound``: an AutoGen team's message count or turn bound times the calls
  one message may take, a LangGraph ``recursion_limit`` times the calls one super-step may make),
  never below ``DEFAULT_MAX_MODEL_CALLS``; else it is that default.  The stop's message says what
  was seen (the calls per agent, the messages so far) and, where a termination is known, that it
  had not been reached; only a team with no readable termination is said to perhaps never end.
  After a stop, by the cap or by the episode's timeout, every call raises ``EpisodeStopped`` and
  the framework's loop unwinds.
* Errors.  The first exception of ``ctx.call`` (a ``ReplayDivergence``, a backend failure, an
  ``EpisodeStopped``) is kept and re-raised by the topology, whatever the framework wraps it in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mas.response_format import reply_start, unmet_response_format, with_format
from mas.tools import (CLOSE, OPEN, TOOL_VALID_KEY, ToolCall, has_tool_call, parse_tool_calls, tool_call_text, tools_prompt,
                       unmet_tool_choice)
from mas.types import TOOL_LABEL, EpisodeContext
from mas.types import Turn

# the cap on a framework team's model calls (``EpisodeCalls``): a team that never terminates still ends
DEFAULT_MAX_MODEL_CALLS = 64
MAX_MODEL_CALLS_HELP = ("Model calls one episode may make (each call of a mas client; tool rounds mas runs inside a call "
                        "are bounded by the agent's max_tool_calls); the next call ends the episode as failed (fault "
                        "model_call_limit), so a team that never terminates ends. Raise it for teams that need more calls.")


def derived_cap_help(source: str) -> str:
    """``MAX_MODEL_CALLS_HELP`` for a kind whose default is derived from the team's ``source`` of termination."""
    return (f"{MAX_MODEL_CALLS_HELP} None (the default): derived from {source}, at least "
            f"{DEFAULT_MAX_MODEL_CALLS}; {DEFAULT_MAX_MODEL_CALLS} where mas cannot read one.")


@dataclass(frozen=True)
class TeamBound:
    """The most model calls a framework team's own termination lets one episode make, as its kind reads it."""

    calls: int
    termination: str  # the termination in words: "max 25 messages", "recursion_limit 12"
    how: str  # how ``calls`` follows from it: "25 messages x (3 selector tries + 1 call per message)"


def model_call_cap(explicit: int | None, bound: TeamBound | None) -> int:
    """``topology.max_model_calls`` as it applies: the value set, else the team's bound (never below
    the default: a bound is read from the framework's internals and may miss a call), else the default."""
    if explicit is not None:
        return explicit
    return DEFAULT_MAX_MODEL_CALLS if bound is None else max(DEFAULT_MAX_MODEL_CALLS, bound.calls)


def cap_warnings(explicit: int | None, bound: TeamBound | None) -> list[str]:
    """``mas validate``'s warning for a cap set below what the team's termination allows."""
    if explicit is None or bound is None or explicit >= bound.calls:
        return []
    return [f"topology.max_model_calls={explicit} is below the ~{bound.calls} model calls the team's termination "
            f"allows ({bound.how}); episodes that run that long stop at the cap and fail (fault model_call_limit) "
            f"before the team terminates: raise it to {bound.calls}, or leave it out to derive it from the termination"]

_JSON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list", "object": "dict"}
_EXAMPLES = {"string": "...", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}


# ---------------------------------------------------------------------------------------------
# prompt text
# ---------------------------------------------------------------------------------------------


def tool_schema(name: str, description: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The one tool description both adapters use: name, description, JSON-schema parameters."""
    return {"name": name, "description": description or "", "parameters": parameters or {"type": "object", "properties": {}}}


def describe_tools(schemas: list[dict[str, Any]]) -> str:
    """Text for the system message: each tool's signature and description, the call format, an example."""
    lines = ["You can call these tools before you reply:"]
    for s in schemas:
        props = s["parameters"].get("properties", {})
        required = set(s["parameters"].get("required", []))
        args = [f"{k}: {_type_text(v)}" + ("" if k in required else " = optional") for k, v in props.items()]
        lines.append(f"- {s['name']}({', '.join(args)})" + (f": {s['description']}" if s["description"] else ""))
    first = schemas[0]
    example = {k: _EXAMPLES.get(v.get("type"), "...") for k, v in first["parameters"].get("properties", {}).items()}
    lines += [
        f'To call a tool, write {OPEN}, one JSON object with "name" and "arguments", then {CLOSE}, e.g.',
        tool_call_text(first["name"], example),
        "Each result comes back inside <tool_response> tags. When you have what you need, reply without a tool call.",
    ]
    return "\n".join(lines)


def _type_text(prop: dict[str, Any]) -> str:
    """A parameter's type as the tool list writes it: its allowed values where it has them (a
    ``Literal``'s JSON-schema ``enum``: ``"yes" | "no"``), else the Python name of its JSON type."""
    values = prop.get("enum")
    if isinstance(values, list) and values:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in values)
    return _JSON_TYPES.get(prop.get("type"), prop.get("type", "any"))


def tool_results_text(results: list[str]) -> str:
    """The user message that hands a round of tool results back (as ``mas.tools`` does)."""
    return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)


def outside_calls(text: str) -> str:
    """The text of a tool message outside its ``<tool_call>`` blocks."""
    out, pos = [], 0
    while (start := text.find(OPEN, pos)) != -1:
        out.append(text[pos:start])
        end = text.find(CLOSE, start)
        pos = len(text) if end == -1 else end + len(CLOSE)
    out.append(text[pos:])
    return "".join(out).strip()


def finish_messages(messages: list[dict[str, str]], role: str) -> list[dict[str, str]]:
    """The role as system message if there is none; empty messages dropped; consecutive user
    messages joined (a transcript of several speakers reads as one message)."""
    out: list[dict[str, str]] = []
    for m in messages:
        if not m["content"].strip():
            continue
        if out and m["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + m["content"]}
        else:
            out.append(dict(m))
    if not any(m["role"] == "system" for m in out):
        out.insert(0, {"role": "system", "content": role})
    return out


# ---------------------------------------------------------------------------------------------
# one episode's calls
# ---------------------------------------------------------------------------------------------


@dataclass
class Generation:
    """A turn as a framework sees it: its text and the tool calls to run."""

    turn: Turn
    calls: list[tuple[str, str, dict[str, Any]]]  # (call id, name, arguments) of well-formed calls
    content: str  # the text outside the calls (the whole text without calls)


class EpisodeCalls:
    """The model calls of one episode of a framework team (shared by all its clients)."""

    def __init__(self, ctx: EpisodeContext, max_calls: int | None = None, bound: TeamBound | None = None,
                 explicit: bool = True):
        """``max_calls``: the cap (None: none); ``bound``: what the team's termination allows, where its
        kind read one; ``explicit``: the cap was set in the config (else derived or the default)."""
        self.ctx = ctx
        self.max_calls = max_calls  # model calls allowed in the episode (topology.max_model_calls); None: no cap
        self.bound = bound
        self.explicit = explicit
        self.made = 0  # model calls asked for so far
        self.by_agent: dict[str, int] = {}  # ... per agent, in the order they first called
        self.seen: Callable[[], str] | None = None  # the team's progress in words ("after 9 messages"), set by its kind
        self.loop = asyncio.get_running_loop()  # the engine's loop: calls from worker threads are run here
        self.pending: set[concurrent.futures.Future] = set()  # such calls not finished yet
        self.error: BaseException | None = None
        self._calls: dict[str, tuple[Turn, int]] = {}  # call id -> (its turn, position in turn.tool_calls)
        self.raw_text: dict[str, str] = {}  # call id -> the full text of the generation that made it

    @property
    def agents(self) -> list[str]:
        return list(self.ctx.agents)

    def parent_of(self, call_ids: list[str]) -> int | None:
        """The turn a call continues: the tool turn whose results it reads, else the latest turn."""
        for cid in call_ids:
            if cid in self._calls:
                return self._calls[cid][0].index
        return max((t.index for t in self.ctx.episode.turns), default=None)

    async def generate(self, agent: str, messages: list[dict[str, str]], tools: list[dict[str, Any]],
                       parent: int | None, template_tools: list[dict[str, Any]] | None = None,
                       tool_choice: Any = None, response_format: dict[str, Any] | None = None,
                       **options: Any) -> Generation:
        """One generation of ``agent`` through ``ctx.call``: the framework runs the calls of its own
        ``tools``; env tools it does not have are run here, each round one more turn.
        ``template_tools``: the framework's tools as OpenAI function specs, rendered by the agent's
        chat template (``ctx.call(tools=...)``) instead of described in the system message;
        ``tool_choice`` (OpenAI's form) and ``response_format`` (``mas.response_format``): what the
        reply must be, met by forcing its start (``reply_start``); a reply that still misses it stands
        and counts the fault ``tool_choice_unmet`` or ``response_format_unmet``;
        ``options``: the other per-call settings of ``ctx.call`` (sampling, stop)."""
        a = self.ctx.agents.get(agent)
        if a is None:
            raise KeyError(f"no agent {agent!r} in this team; valid: {sorted(self.ctx.agents)}")
        if self.max_calls is not None and self.made >= self.max_calls:
            self.ctx.stop(self.cap_message(agent), "model_call_limit")
        self.made += 1
        self.by_agent[agent] = self.by_agent.get(agent, 0) + 1
        framework = frozenset(t["name"] for t in tools)
        ours = [n for n in a.tools if n not in framework]  # env tools the framework does not run: run here
        undescribed = [t for t in tools if t["name"] not in a.tools] if template_tools is None else []  # env tools: in the role
        messages = with_format(finish_messages(messages, a.role), response_format)  # its instruction ends the role
        options["prefix"] = reply_start(tool_choice, [t["name"] for t in tools], response_format)
        sys_at = next(i for i, m in enumerate(messages) if m["role"] == "system")
        extra = [describe_tools(undescribed)] if undescribed else []
        if a.tools:  # a system message of the team's own replaces the role: keep the role's tool description
            told = tools_prompt([self.ctx.tools[n] for n in a.tools], a.max_tool_calls)
            if told in a.role and told not in messages[sys_at]["content"]:
                extra.insert(0, told)
        if extra:
            messages[sys_at] = {"role": "system", "content": "\n\n".join([messages[sys_at]["content"], *extra])}
        try:
            if template_tools is not None:
                options["tools"] = template_tools
            turn = await self.ctx.call(agent, messages, parent=parent, run_tools=bool(ours), framework_tools=framework,
                                       fit_positions=True, **options)  # code renders these prompts: fitted at run time
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise
        if not tools or turn.finish_reason in ("masked", "removed") or not has_tool_call(turn.text):
            gen = Generation(turn, [], turn.text)
        elif ours and not any(c.name in framework for c in parse_tool_calls(turn.text)):
            gen = Generation(turn, [], turn.text)  # env calls only, past the agent's budget: the reply stands
        else:
            gen = Generation(turn, self._record_calls(turn, parse_tool_calls(turn.text)), outside_calls(turn.text))
        if turn.finish_reason not in ("masked", "removed"):  # a reply that misses what was asked stands; counted
            for kind, unmet in (("tool_choice_unmet", unmet_tool_choice(tool_choice, [name for _, name, _ in gen.calls])),
                                ("response_format_unmet", None if gen.calls else unmet_response_format(response_format,
                                                                                                       gen.content))):
                if unmet is not None:
                    self.ctx.faults.add(kind, f"agent {agent!r}, turn {turn.index}: {unmet}")
        return gen

    def cap_message(self, agent: str) -> str:
        """Why the episode stopped at the cap, worded by what was seen: the calls per agent, the
        team's progress, and its termination where one is known (not reached, or the call would
        not have come); only without a known termination may the team never end."""
        counts = ", ".join(f"{a} {n}" for a, n in self.by_agent.items())
        source = ("" if self.explicit else " derived from the team's termination" if self.bound is not None
                  and self.max_calls == self.bound.calls else " by default")
        progress = self.seen() if self.seen is not None else ""
        head = (f"model call limit: the team made {self.made} model calls in this episode ({counts}) and agent "
                f"{agent!r} asked for one more: stopped at the cap of topology.max_model_calls={self.max_calls}{source}"
                + (f" {progress}" if progress else ""))
        if self.bound is not None:
            return (f"{head}; the team's termination ({self.bound.termination}) had not been reached: raise "
                    f"topology.max_model_calls (the termination allows ~{self.bound.calls} calls: {self.bound.how})")
        return (f"{head}; mas reads no termination from this team (a message count, a turn or step bound), so it "
                "may never end: give it one (e.g. AutoGen's MaxMessageTermination), or raise topology.max_model_calls "
                "if it needs more calls")

    def _record_calls(self, turn: Turn, parsed: list[ToolCall]) -> list[tuple[str, str, dict[str, Any]]]:
        """Record the turn's calls (observations come later); the well-formed ones go to the framework."""
        turn.tool_calls, turn.observations, calls = [], [], []
        for k, c in enumerate(parsed):
            cid = f"call_{turn.index}_{k}"
            turn.tool_calls.append({"id": cid, "name": c.name, "arguments": c.arguments, "valid": False, "error": c.error})
            turn.observations.append(f"error: {c.error}" if c.error else "")
            if c.error is None:
                self._calls[cid] = (turn, k)
                self.raw_text[cid] = turn.text
                calls.append((cid, c.name, c.arguments or {}))
        turn.extra_rewards[TOOL_VALID_KEY] = 0.0
        if calls:  # the agent is called again with the results: a tool turn, as in the engine
            turn.parsed = {"label": TOOL_LABEL, "tool_calls": len(parsed)}
            turn.valid = False  # until every call ran without error
        return calls

    def record_result(self, call_id: str, content: str, is_error: bool) -> None:
        """The framework ran a call: its observation and validity go on the turn that made it."""
        if call_id not in self._calls:
            return
        turn, k = self._calls[call_id]
        rec = turn.tool_calls[k]
        rec["valid"], rec["error"] = not is_error, (content if is_error else None)
        turn.observations[k] = content
        valid = [r["valid"] for r in turn.tool_calls]
        turn.extra_rewards[TOOL_VALID_KEY] = sum(valid) / len(valid)
        turn.valid = all(valid)

    def call_from_thread(self, coro: Any) -> Any:
        """Run ``coro`` (a ``generate``) on the engine's loop from a worker thread and wait for it."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self.pending.add(fut)
        try:
            return fut.result()
        finally:
            self.pending.discard(fut)

    def cancel_pending(self) -> None:
        """At the end of the episode: a thread still waiting for a call is released (its call cancelled)."""
        for fut in list(self.pending):
            fut.cancel()

    def rethrow(self, exc: BaseException | None = None) -> None:
        """Raise the engine's own error if a call failed (frameworks wrap it in their own)."""
        if self.error is not None:
            raise self.error
        if exc is not None:
            raise exc
