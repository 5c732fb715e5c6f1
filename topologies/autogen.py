"""``kind: autogen``: an AutoGen AgentChat team whose agents are trained, each with its own policy.

Two ways to define the team:

* ``team: round_robin | selector | swarm`` builds ``RoundRobinGroupChat``, ``SelectorGroupChat``
  or ``Swarm`` from the YAML agents: each participant is an ``AssistantAgent`` named after the
  agent, with its role as system message, its env tools as AutoGen tools (run by AutoGen through
  the engine's sandbox, ``max_tool_iterations = max_tool_calls``, reflecting on the results)
  and, in a swarm, its ``handoffs``.  A selector team's speaker selection is the model call of the ``selector``
  agent, a YAML agent like any other (its policy decides whether it trains).  The team stops on
  ``termination`` (a text mention by a participant, a message count, or either).
* ``factory: "pkg.mod:build"`` calls your function with one model client per agent name
  (``{"solver": MasModelClient, ...}``) and runs the team it returns: your team code, changed
  only where it created its model clients.  An agent's YAML ``tools`` (the env's) need nothing
  in that code: mas runs them inside the agent's model call (``topologies/adapters.py``).
  Refused by name at validate (and, should a factory build one only later, when an episode
  builds it): a ``UserProxyAgent`` (it waits for a person; ``unsupported_parts``).  Structured
  output (``output_content_type``) is served by the client (``topologies/autogen_client.py``).

An episode ends, whatever the team's termination, at ``topology.max_model_calls`` model calls
and at ``runtime.episode_timeout_s``: from then on every call of its clients raises the engine's
``EpisodeStopped``, and AutoGen, which waits for its agents when it stops, unwinds.  Left out, the
cap is derived from the team's own termination (``team_bound``, read from the team as it is built,
a factory's included): its message count (a ``MaxMessageTermination``, alone or in ``|``/``&``) or
``max_turns``, times the model calls one message may take (a selector's tries, plus the most an
agent may make: 1, or its tool iterations and reflection).  The docs' selector team of 25
messages with 3 selector tries takes up to 25 x (3 + 1) = 100 calls, past the default of 64.
``mas validate`` warns where a cap set in the config is below that bound.

Per episode a fresh team is built around fresh clients (AgentChat teams are stateful), run on
the engine's event loop with the task's prompt as its task, and read: the team's answer is
the most recent answer in its chat messages, each read by the parser of the agent that sent
it (a verifier's ACCEPT keeps the solver's answer, as in the built-in topologies).  With a
text mention configured, an episode that stopped without it is truncated.

Replays and interventions (C3, SHARP, CCPO) re-run the team with the engine's script: frozen
turns come back as recorded, masked agents say ``[masked]``, removed ones nothing.  That needs
the team's control flow to depend only on the messages: AutoGen's round robin, selector (its
selection is a recorded model call) and swarm (handoffs are recorded tool calls) all do, and
so do tools that return the same result for the same arguments.  A team that does not gets
the engine's ``ReplayDivergence`` naming the agent and turn.
"""

from __future__ import annotations

import keyword
import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from mas.refs import RefError, import_ref
from mas.topologies.adapters import TeamBound, cap_warnings, derived_cap_help, model_call_cap
from mas.topologies.framework_teaching import SelectorTeacher, framework_teacher
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.topologies.teaching import NoTeacher, specialists_by_op
from mas.types import EpisodeContext, Outcome, Section

# AutoGen logs through "autogen_agentchat" without a handler of its own, so with logging left
# unconfigured Python's last-resort handler prints its warnings to stderr: a selector turn that
# names no speaker printed "Model failed to select a speaker ..." once per episode, between the
# progress lines.  That turn is already counted, as the selector's parse failure.  A NullHandler
# ends the printing; a program that configures logging still receives the records.  The same
# for AutoGen's runtime ("autogen_core"): an agent whose model call raised (an episode stopped at
# its timeout or its cap on model calls, a replay that diverged) printed a traceback per agent,
# though the error is the episode's, recorded and counted there.
logging.getLogger("autogen_agentchat").addHandler(logging.NullHandler())
logging.getLogger("autogen_core").addHandler(logging.NullHandler())

class AutogenTermination(Section):
    text: str | None = Field(
        None, description="End when a team agent's message contains this text (AutoGen TextMentionTermination)."
    )
    max_messages: int | None = Field(
        None, ge=1, description="End after this many messages, the task message included (AutoGen MaxMessageTermination)."
    )

    @model_validator(mode="after")
    def _some_condition(self) -> "AutogenTermination":
        if self.text is None and self.max_messages is None:
            raise ValueError("give text, max_messages or both (either one ends the team), or the team may never stop")
        return self


class AutogenTopology(Section):
    kind: Literal["autogen"]
    team: Literal["round_robin", "selector", "swarm"] | None = Field(
        None, description="Build an AgentChat team from the YAML agents: RoundRobinGroupChat, SelectorGroupChat or Swarm "
        "(each agent an AssistantAgent with its role as system message and its tools). Exactly one of team and factory."
    )
    factory: str | None = Field(
        None, description="'package.module:function' that receives one model client per agent name (a dict) and returns "
        "an AgentChat team: your own team code, with mas's clients where it created its model clients."
    )
    participants: tuple[str, ...] = Field(
        (), description="team only: the agents of the team, in speaking order for round_robin (the first speaks first); "
        "() = every agent except the selector."
    )
    selector: str | None = Field(
        None, description="team: selector only: the agent whose model picks the next speaker (its policy says whether it "
        "trains); it is not a participant."
    )
    selector_prompt: str | None = Field(
        None, description="team: selector only: AutoGen's selector prompt with {roles}, {participants} and {history}; "
        "None = AutoGen's default."
    )
    allow_repeated_speaker: bool = Field(False, description="team: selector only: may the same agent speak twice in a row.")
    handoffs: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="team: swarm only: the agents each agent may hand off to (a transfer_to_<name> "
        "tool call); the first participant speaks first."
    )
    termination: AutogenTermination | None = Field(
        None, description="team only (a factory's team has its own): when the team stops, by a text mention or a message count."
    )
    max_turns: int | None = Field(None, ge=1, description="team only: AutoGen's bound on agent turns per episode; None = none.")
    max_model_calls: int | None = Field(
        None, ge=1, description=derived_cap_help("the team's termination (its message count or max_turns, times the calls "
                                                 "one message may take: a selector's tries, an agent's tool iterations)")
    )


# What an AutoGen team runs on: the `autogen` extra (checked before training: mas.config.checks.package_issues)
PACKAGES = ("autogen_agentchat", "autogen_core")

YAML_ONLY = ("participants", "selector", "selector_prompt", "allow_repeated_speaker", "handoffs", "termination", "max_turns")


class ClientMap(dict):
    """The factory's argument: agent name -> its model client; a missing name lists the valid ones."""

    def __missing__(self, key: str) -> Any:
        raise KeyError(f"no mas agent {key!r}; the team's agents are {sorted(self)} (add it to the YAML agents)")


# ---------------------------------------------------------------------------------------------
# config checks (mas.config.schema calls these; each error is (yaml path, value, message))
# ---------------------------------------------------------------------------------------------


def participants_of(cfg: Any, names: list[str]) -> list[str]:
    return list(cfg.participants) or [n for n in names if n != cfg.selector]


def autogen_errors(cfg: Any, names: list[str]) -> list[tuple[tuple, Any, str]]:
    errs: list[tuple[tuple, Any, str]] = []
    if (cfg.team is None) == (cfg.factory is None):
        return [(("topology",), {"team": cfg.team, "factory": cfg.factory},
                 "give exactly one of team (round_robin, selector, swarm: built from the YAML agents) and factory")]
    if cfg.factory is not None:
        errs += [(("topology", f), getattr(cfg, f), "only for team: (a factory's team defines its own)")
                 for f in YAML_ONLY if getattr(cfg, f) not in (None, (), {}, False)]
        if not _autogen_installed():  # the missing extra is this machine's problem (package_issues says what installs
            return errs  # it); the factory is checked where AutoGen is installed
        return errs + _factory_errors(cfg.factory, names)
    for i, n in enumerate(cfg.participants):
        if n not in names:
            errs.append((("topology", "participants", i), n, f"unknown agent; valid: {names}"))
        elif cfg.participants.index(n) != i:
            errs.append((("topology", "participants", i), n, "listed twice"))
    if cfg.team == "selector":
        if cfg.selector is None:
            errs.append((("topology", "selector"), None, f"team: selector needs the agent that picks the speaker; valid: {names}"))
        elif cfg.selector not in names:
            errs.append((("topology", "selector"), cfg.selector, f"unknown agent; valid: {names}"))
        elif cfg.selector in cfg.participants:
            errs.append((("topology", "selector"), cfg.selector, "the selector picks speakers; it cannot be a participant"))
    else:
        for f in ("selector", "selector_prompt"):
            if getattr(cfg, f) is not None:
                errs.append((("topology", f), getattr(cfg, f), f"only for team: selector (this team is {cfg.team})"))
        if cfg.allow_repeated_speaker:
            errs.append((("topology", "allow_repeated_speaker"), True, f"only for team: selector (this team is {cfg.team})"))
    members = participants_of(cfg, names)
    if cfg.handoffs and cfg.team != "swarm":
        errs.append((("topology", "handoffs"), dict(cfg.handoffs), f"only for team: swarm (this team is {cfg.team})"))
    for source, targets in cfg.handoffs.items():
        if source not in members:
            errs.append((("topology", "handoffs", source), source, f"not a participant; valid: {members}"))
        for j, t in enumerate(targets):
            if t not in members or t == source:
                errs.append((("topology", "handoffs", source, j), t, f"not another participant; valid: {members}"))
    if cfg.termination is None:
        errs.append((("topology", "termination"), None, "a YAML team needs a termination: {text: ..., max_messages: ...}"))
    if not members:
        errs.append((("topology", "participants"), [], "the team has no participants"))
    for n in members + ([cfg.selector] if cfg.selector else []):
        if n in names and (not n.isidentifier() or keyword.iskeyword(n)):
            errs.append((("agents", names.index(n), "name"), n, "AutoGen agent names must be Python identifiers (no '-')"))
    return errs


def _autogen_installed() -> bool:
    import importlib.util
    import sys

    def found(module: str) -> bool:
        if module in sys.modules:  # imported already (or blocked with None)
            return sys.modules[module] is not None
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    return all(found(m) for m in PACKAGES)


def _factory_errors(ref: str, names: list[str]) -> list[tuple[tuple, Any, str]]:
    """The factory must import and build a team from unbound clients (no model is called)."""
    try:
        team = make_team(import_ref(ref), ClientMap({n: _client(None, n) for n in names}))
    except RefError as e:
        return [(("topology", "factory"), ref, str(e))]
    except Exception as e:  # noqa: BLE001 - the user's factory raised while building
        return [(("topology", "factory"), ref, f"the factory raised {type(e).__name__}: {e}")]
    if not hasattr(team, "run_stream"):
        return [(("topology", "factory"), ref, f"the factory returned a {type(team).__name__}, not an AgentChat team "
                 "(RoundRobinGroupChat, SelectorGroupChat, Swarm, an agent, ...: anything with run_stream)")]
    return [(("topology", "factory"), ref, problem) for problem in unsupported_parts(team)]


def unsupported_parts(team: Any) -> list[str]:
    """What mas cannot run in an AgentChat team, by agent name (the team, its nested teams and
    wrapped agents are searched): a ``UserProxyAgent`` waits for a person to type, and nobody
    answers during training."""
    from autogen_agentchat.agents import UserProxyAgent

    problems: list[str] = []
    seen: set[int] = set()

    def walk(obj: Any) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        name = getattr(obj, "name", type(obj).__name__)
        if isinstance(obj, UserProxyAgent):
            problems.append(f"agent {name!r} is a UserProxyAgent, which waits for human input; nobody answers during "
                            "training (mas does not support human-in-the-loop agents): leave it out of the team")
        for child in getattr(obj, "_participants", None) or ():  # a team's agents
            walk(child)
        walk(getattr(obj, "_team", None))  # a SocietyOfMindAgent's inner team
        walk(getattr(obj, "_wrapped_agent", None))  # a MessageFilterAgent's agent

    walk(team)
    return problems


def make_team(factory: Any, clients: Mapping[str, Any]) -> Any:
    return factory(clients)


# ---------------------------------------------------------------------------------------------
# what an agent's reply must hold for the team to work (mas validate measures it in its tokens)
# ---------------------------------------------------------------------------------------------

HANDOFF_EFFECT = "its call is cut before </tool_call>, so the handoff fails and the swarm never moves on"
JSON_EFFECT = "its JSON object is cut before it closes, so AutoGen's parse of it fails the episode"
SELECTOR_EFFECT = "AutoGen finds no whole name in it and, after its tries, keeps the previous speaker"


def handoff_name(target: str) -> str:
    """The tool name AutoGen gives a handoff to ``target`` (``Handoff``'s default)."""
    return f"transfer_to_{target}".lower()


def reply_needs(cfg: Any) -> list[tuple[str, str, str, str]]:
    """``(agent, what, text, effect)``: each text one of the agent's replies must hold whole for the
    team to work, as the agent's model writes it: a swarm agent's handoff (a ``transfer_to_<agent>``
    tool call in the ``<tool_call>`` format its mas client reads) and a selector's reply (a
    participant's name).  A YAML team's from its config; a factory's from the team it builds with
    clients that cannot answer ([] where it does not build: the ``errors`` hook says why)."""
    from mas.tools import tool_call_text

    t, names = cfg.topology, cfg.agent_names
    if t.factory is None:
        needs = [(src, f"its handoff call {handoff_name(dst)!r}", tool_call_text(handoff_name(dst), {}), HANDOFF_EFFECT)
                 for src, targets in t.handoffs.items() for dst in targets]
        if t.team == "selector" and t.selector is not None:
            needs += [(t.selector, f"the name of participant {m!r}", m, SELECTOR_EFFECT) for m in participants_of(t, names)]
        return needs
    if not _autogen_installed():
        return []
    try:
        team = make_team(import_ref(t.factory), ClientMap({n: _client(None, n) for n in names}))
    except Exception:  # noqa: BLE001 - a factory that does not build: its errors are the `errors` hook's
        return []
    return _team_needs(team)


def _team_needs(team: Any) -> list[tuple[str, str, str, str]]:
    """``reply_needs`` of a built team: its agents' handoffs, their structured output (the shortest
    object the model's schema allows, less the ``{`` a reply without tools is forced to start with)
    and its selector's names (nested teams too)."""
    from autogen_agentchat.teams import SelectorGroupChat

    from mas.response_format import json_schema_format, shortest_reply
    from mas.tools import tool_call_text
    from mas.topologies.autogen_client import MasModelClient

    needs: list[tuple[str, str, str, str]] = []
    seen: set[int] = set()

    def walk(obj: Any) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        client = getattr(obj, "_model_client", None)
        if isinstance(client, MasModelClient):
            if isinstance(obj, SelectorGroupChat):
                needs.extend((client.agent, f"the name of participant {n!r}", n, SELECTOR_EFFECT)
                             for n in getattr(obj, "_participant_names", None) or ())
            for name in getattr(obj, "_handoffs", None) or {}:
                needs.append((client.agent, f"its handoff call {name!r}", tool_call_text(name, {}), HANDOFF_EFFECT))
            model = getattr(obj, "_output_content_type", None)
            schema = getattr(model, "model_json_schema", None)
            if callable(schema):  # the format its client serves (autogen_client._json_format), with or without tools
                tools_offered = bool(getattr(obj, "_tools", None) or getattr(obj, "_handoffs", None))
                text = shortest_reply(json_schema_format(model.__name__, schema()), tools_offered)
                needs.append((client.agent, f"its structured output {model.__name__}", text, JSON_EFFECT))
        for child in getattr(obj, "_participants", None) or ():
            walk(child)
        walk(getattr(obj, "_team", None))  # a SocietyOfMindAgent's inner team

    walk(team)
    return needs


# ---------------------------------------------------------------------------------------------
# how many model calls the team's termination allows (the derived topology.max_model_calls)
# ---------------------------------------------------------------------------------------------

SELECTOR_TRIES = 3  # AutoGen's default max_selector_attempts, which a YAML selector team keeps


def message_bound(limits: list[tuple[int, str, str]], tries: int, per_message: int) -> TeamBound | None:
    """The bound of a team whose messages are limited by ``limits`` ((count, unit, the limit in
    words)): the smallest limit times the calls one message may take (``tries`` selector calls
    before it, ``per_message`` of its speaker)."""
    if not limits:
        return None
    count, unit, termination = min(limits)
    calls = f"{per_message} call{'s' if per_message != 1 else ''} per message"
    how = f"{count} {unit} x " + (f"({tries} selector tries + {calls})" if tries else calls)
    return TeamBound(count * (tries + per_message), termination, how)


def yaml_bound(t: Any, names: list[str], tool_rounds: Mapping[str, int]) -> TeamBound | None:
    """The bound of a ``team:`` built from the YAML (``tool_rounds``: an agent's max_tool_calls where it
    has tools): an agent with tools makes up to its tool iterations plus its reflection per message."""
    term = t.termination
    limits = ([(term.max_messages, "messages", f"max {term.max_messages} messages")]
              if term is not None and term.max_messages is not None else [])
    limits += [(t.max_turns, "turns", f"max_turns {t.max_turns}")] if t.max_turns else []
    per = max((tool_rounds.get(m, 0) + 1 for m in participants_of(t, names)), default=1)
    return message_bound(limits, SELECTOR_TRIES if t.team == "selector" else 0, per)


def team_bound(team: Any) -> TeamBound | None:
    """The bound of a built AgentChat team, read from its termination condition, its ``max_turns``,
    its selector and its agents (AutoGen's private attributes, as ``autogen_shape`` reads them);
    None where any of them cannot be read (an agent of a kind mas does not know, a nested team)."""
    from autogen_agentchat.teams import SelectorGroupChat

    from mas.topologies.autogen_client import MasModelClient

    messages = _max_messages(getattr(team, "_termination_condition", None))
    limits = [(messages, "messages", f"max {messages} messages")] if messages else []
    turns = getattr(team, "_max_turns", None)
    limits += [(turns, "turns", f"max_turns {turns}")] if isinstance(turns, int) and turns > 0 else []
    per = [_agent_calls(a, MasModelClient) for a in getattr(team, "_participants", None) or ()]
    if not per or None in per:
        return None
    selector = isinstance(team, SelectorGroupChat) and isinstance(getattr(team, "_model_client", None), MasModelClient)
    tries = int(getattr(team, "_max_selector_attempts", SELECTOR_TRIES)) if selector else 0
    return message_bound(limits, tries, max(per))


def _max_messages(cond: Any) -> int | None:
    """The message count a termination condition stops at, where it has one: a
    ``MaxMessageTermination``; the smallest of an ``|``'s, the largest of an ``&`` whose every part has one."""
    from autogen_agentchat.base import AndTerminationCondition, OrTerminationCondition
    from autogen_agentchat.conditions import MaxMessageTermination

    if isinstance(cond, MaxMessageTermination):
        n = getattr(cond, "_max_messages", None)
        return n if isinstance(n, int) else None
    parts = [_max_messages(c) for c in getattr(cond, "_conditions", None) or ()]
    if isinstance(cond, OrTerminationCondition) and any(parts):
        return min(n for n in parts if n)
    if isinstance(cond, AndTerminationCondition) and parts and all(parts):
        return max(parts)  # type: ignore[type-var]
    return None


def _agent_calls(agent: Any, mas_client: type) -> int | None:
    """Model calls of mas clients one message of ``agent`` may take: 0 for a model that is not
    trained (not a mas client), 1 without tools, else its tool iterations and its reflection."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.tools import StaticWorkbench

    if not isinstance(agent, AssistantAgent):
        return None
    if not isinstance(getattr(agent, "_model_client", None), mas_client):
        return 0
    workbench = [w for w in getattr(agent, "_workbench", None) or ()
                 if not (isinstance(w, StaticWorkbench) and not getattr(w, "_tools", None))]
    if not (getattr(agent, "_tools", None) or getattr(agent, "_handoff_tools", None) or workbench):
        return 1
    return int(getattr(agent, "_max_tool_iterations", 1)) + (1 if getattr(agent, "_reflect_on_tool_use", False) else 0)


def config_bound(cfg: Any) -> TeamBound | None:
    """The bound of the config's team: a YAML team's from its config, a factory's from the team it
    builds with clients that cannot answer (as ``mas validate`` builds it); None where it cannot be read."""
    t = cfg.topology
    if t.factory is None:
        return yaml_bound(t, cfg.agent_names, {a.name: max(1, a.max_tool_calls) for a in cfg.agents if a.tools})
    return _factory_bound(t.factory, cfg.agent_names)


class _AnyClients(dict):
    """A factory's argument where the agents' names are not at hand: an unbound client for any name."""

    def __missing__(self, key: str) -> Any:
        self[key] = _client(None, key)
        return self[key]


def _factory_bound(ref: str, names: list[str] | None) -> TeamBound | None:
    """The bound of the team a factory builds (``names``: the agents; None: whatever names it asks for)."""
    if not _autogen_installed():
        return None
    clients = _AnyClients() if names is None else ClientMap({n: _client(None, n) for n in names})
    try:
        return team_bound(make_team(import_ref(ref), clients))
    except Exception:  # noqa: BLE001 - a factory that does not build: its errors are the `errors` hook's
        return None


def _client(calls: Any, agent: str) -> Any:
    from mas.topologies.autogen_client import MasModelClient  # autogen is imported only for autogen teams

    return MasModelClient(calls, agent)


# ---------------------------------------------------------------------------------------------
# the topology
# ---------------------------------------------------------------------------------------------


def env_tool(spec: Any, ctx: EpisodeContext) -> Any:
    """An env tool (``mas.tools.ToolSpec``) as an AutoGen tool: same arguments, same checks,
    same observation; an invalid call raises, so AutoGen reports it as an error result.  It runs
    as the engine runs env tools: in the episode's tool runner (the sandbox), in a worker thread,
    with the batcher told (a batch waits for it, so batches do not depend on the tool's speed)."""
    import asyncio

    from autogen_core.tools import BaseTool
    from pydantic import BaseModel, create_model

    from mas.tools import ToolCall, run_tool_call

    types = {"str": str, "int": int}
    fields = {p.name: (types[p.type], ... if p.required else p.default) for p in spec.params}
    args_model = create_model(f"{spec.name}_args", **fields)

    class Result(BaseModel):
        observation: str

    class EnvTool(BaseTool):  # type: ignore[type-arg]
        def __init__(self) -> None:
            super().__init__(args_model, Result, spec.name, spec.description)

        async def run(self, args: BaseModel, cancellation_token: Any) -> Result:
            ctx.batcher.tool_started(ctx.key)
            try:
                record, observation = await asyncio.to_thread(
                    run_tool_call, ToolCall(spec.name, args.model_dump()), {spec.name: spec}, ctx.tool_runner)
            finally:
                ctx.batcher.tool_finished(ctx.key)
            if "fault" in record:
                ctx.faults.add(record["fault"], f"tool {spec.name!r} (an AutoGen agent's): {record['error']}")
            if not record["valid"]:
                raise ValueError(observation)
            return Result(observation=observation)

        def return_value_as_string(self, value: Any) -> str:
            return value.observation if isinstance(value, Result) else str(value)

    return EnvTool()


class AutogenTeam:
    """Runs one AgentChat team per episode and reads its outcome."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.factory = import_ref(cfg.factory) if cfg.factory else None

    def build(self, ctx: EpisodeContext, calls: Any) -> Any:
        clients = ClientMap({name: _client(calls, name) for name in ctx.agents})
        if self.factory is not None:
            return make_team(self.factory, clients)
        return self._yaml_team(ctx, clients)

    def _yaml_team(self, ctx: EpisodeContext, clients: Mapping[str, Any]) -> Any:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
        from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat, Swarm

        cfg = self.cfg
        members = participants_of(cfg, list(ctx.agents))
        agents = []
        for name in members:
            a = ctx.agents[name]
            tools = [env_tool(ctx.tools[t], ctx) for t in a.tools]
            agents.append(AssistantAgent(
                name, clients[name], tools=tools or None, handoffs=list(cfg.handoffs.get(name, ())) or None,
                description=a.role, system_message=a.role, reflect_on_tool_use=bool(tools) or None,
                max_tool_iterations=a.max_tool_calls if tools else 1))
        term = cfg.termination
        conditions = ([TextMentionTermination(term.text, sources=members)] if term.text is not None else []) + (
            [MaxMessageTermination(term.max_messages)] if term.max_messages is not None else [])
        stop = conditions[0] if len(conditions) == 1 else conditions[0] | conditions[1]
        if cfg.team == "round_robin":
            return RoundRobinGroupChat(agents, termination_condition=stop, max_turns=cfg.max_turns)
        if cfg.team == "swarm":
            return Swarm(agents, termination_condition=stop, max_turns=cfg.max_turns)
        extra = {"selector_prompt": cfg.selector_prompt} if cfg.selector_prompt is not None else {}
        return SelectorGroupChat(agents, clients[cfg.selector], termination_condition=stop, max_turns=cfg.max_turns,
                                 allow_repeated_speaker=cfg.allow_repeated_speaker, **extra)

    async def run(self, ctx: EpisodeContext) -> Outcome:
        from autogen_agentchat.base import TaskResult
        from autogen_agentchat.messages import BaseChatMessage, ThoughtEvent, ToolCallExecutionEvent

        from mas.topologies.adapters import EpisodeCalls

        explicit = self.cfg.max_model_calls
        calls = EpisodeCalls(ctx, explicit, explicit=explicit is not None)
        team = self.build(ctx, calls)
        problems = unsupported_parts(team)  # refused at validate; a factory may build differently per episode
        if problems:
            raise NotImplementedError("; ".join(problems))
        calls.bound = team_bound(team)  # read from the team as built: a factory's may differ per episode
        calls.max_calls = model_call_cap(explicit, calls.bound)
        said: list[tuple[str, str]] = []  # (source, text) of the team's chat messages, in order
        messages = [0]  # chat messages so far, the task's included (as a MaxMessageTermination counts them)
        calls.seen = lambda: f"after {messages[0]} messages (the task's included)"
        try:
            async for item in team.run_stream(task=ctx.task.prompt):
                messages[0] += isinstance(item, BaseChatMessage)
                if isinstance(item, ToolCallExecutionEvent):
                    for r in item.content:
                        calls.record_result(r.call_id, r.content, bool(r.is_error))
                elif isinstance(item, (BaseChatMessage, ThoughtEvent)) and item.source in ctx.agents:
                    said.append((item.source, item.to_text()))  # a thought: the text beside tool calls
                elif isinstance(item, TaskResult):
                    break
        except Exception as exc:  # noqa: BLE001 - AutoGen wraps the engine's errors; raise the original
            calls.rethrow(exc)
        calls.rethrow()
        return Outcome(answer=self._answer(ctx, said), truncated=self._truncated(said))

    @staticmethod
    def _answer(ctx: EpisodeContext, said: list[tuple[str, str]]) -> str | None:
        for source, text in reversed(said):
            parsed, _ = ctx.agents[source].parse(text)
            if parsed.get("answer"):
                return parsed["answer"]
        return None

    def _truncated(self, said: list[tuple[str, str]]) -> bool:
        term = self.cfg.termination
        return term is not None and term.text is not None and not any(term.text in text for _, text in said)


def build_autogen(cfg: Any) -> AutogenTeam:
    return AutogenTeam(cfg)


def autogen_shape(topology: Any, agents: list[str]) -> tuple[str | None, list[tuple[str, tuple[str, ...] | None]]]:
    """An AutoGen team's selector agent (None: none) and its text terminations ``(text, sources or None)``.

    A YAML team says them in its config.  A factory's team is built once, with clients that
    cannot answer (as ``mas validate`` does), and read: the selector's mas client and the
    ``TextMentionTermination``s of its termination condition (``|``/``&`` combinations walked).
    These are AutoGen's private attributes; where they are missing the teacher finds nothing
    there and goes by the words the agents' prompts ask for."""
    if topology.factory is None:
        term = topology.termination
        return topology.selector, ([(term.text, None)] if term is not None and term.text is not None else [])
    from autogen_agentchat.conditions import TextMentionTermination  # autogen is imported only for autogen teams

    team = import_ref(topology.factory)(ClientMap({n: _client(None, n) for n in agents}))
    selector = getattr(getattr(team, "_model_client", None), "agent", None)
    words: list[tuple[str, tuple[str, ...] | None]] = []

    def walk(cond: Any) -> None:
        text = getattr(cond, "_termination_text", None) if isinstance(cond, TextMentionTermination) else None
        if text is None and isinstance(cond, TextMentionTermination):  # an AutoGen that renamed it: its public config
            try:
                text = (cond.dump_component().config or {}).get("text")
            except Exception:  # noqa: BLE001 - unreadable: go by the prompts' words, as documented
                text = None
        if text:
            sources = getattr(cond, "_sources", None)
            words.append((text, tuple(sources) if sources else None))
        for child in getattr(cond, "_conditions", None) or ():
            walk(child)

    walk(getattr(team, "_termination_condition", None))
    return selector if selector in agents else None, words


@register_topology
class Autogen:
    name = "autogen"
    config = AutogenTopology
    packages = PACKAGES
    build = staticmethod(build_autogen)

    def agents(self, topo: AutogenTopology) -> dict[str, str] | None:
        return None  # who speaks is decided by AutoGen (and a factory's code) as the team runs

    def last_speakers(self, topo: AutogenTopology) -> list[str]:
        return []

    def last_speaker_note(self, topo: AutogenTopology) -> str | None:
        return None

    def main_agent(self, topo: AutogenTopology) -> str | None:
        return None

    def parts(self, topo: AutogenTopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: AutogenTopology) -> list[str] | None:
        return None

    def turn_limit(self, topo: AutogenTopology) -> int:
        """The cap as it applies (every turn is a model call, and the cap ends the episode); a YAML
        team's agents' tool iterations are not in ``topo``: the caller multiplies them in."""
        bound = yaml_bound(topo, [], {}) if topo.factory is None else _factory_bound(topo.factory, None)
        return model_call_cap(topo.max_model_calls, bound)

    def refs(self, topo: AutogenTopology, names: list[str]) -> list[Issue]:
        return []  # the participants and the selector are checked with the team (``errors``)

    def errors(self, cfg: Any) -> list[Issue]:
        return autogen_errors(cfg.topology, cfg.agent_names)

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        return []

    def warnings(self, cfg: Any) -> list[Issue]:
        """A cap set below the model calls the team's termination allows: episodes stop short of it."""
        t = cfg.topology
        bound = config_bound(cfg) if t.max_model_calls is not None else None
        return [(("topology", "max_model_calls"), t.max_model_calls, m) for m in cap_warnings(t.max_model_calls, bound)]

    def reply_needs(self, cfg: Any) -> list[tuple[str, str, str, str]]:
        """Texts an agent's reply must hold whole (``reply_needs``); ``mas validate`` measures them
        against the agent's ``max_new_tokens`` in its own tokens (``mas.training.context_plan``)."""
        return reply_needs(cfg)

    def drawing(self, cfg: Any) -> Drawing:
        """A YAML AutoGen team as who may speak after whom; a factory's team as one box (it is code)."""
        t, names = cfg.topology, cfg.agent_names
        start, end = registry.START, registry.END
        bound = f"at most {t.max_turns} turns" if t.max_turns else ""
        if t.factory is not None:  # code: one box, and the agents whose model clients it is given
            box = f"factory {t.factory}"
            edges = [Edge(start, box, "task")] + [Edge(box, a, "model calls") for a in names]
            note = (f"the team is built in code by {t.factory}: who speaks when is decided there and cannot be drawn "
                    f"from the config; mas gives it model clients for {', '.join(names)}")
            return Drawing([start, box, *names, end], edges + [Edge(box, end, "its termination")], {a: a for a in names},
                           bound=bound, note=note)
        members = participants_of(t, names)
        term = t.termination
        stop = " or ".join(([f"'{term.text}' said"] if term.text else [])
                           + ([f"{term.max_messages} messages"] if term.max_messages else [])) if term else ""
        if t.team == "round_robin":
            edges = [Edge(start, members[0])] + [Edge(a, b, "next") for a, b in zip(members, members[1:])]
            edges += [Edge(members[-1], members[0], "next round")] if len(members) > 1 else []
        elif t.team == "selector":
            edges = [Edge(start, t.selector)] + [e for m in members for e in (Edge(t.selector, m, "picks"), Edge(m, t.selector, "said"))]
        else:  # swarm
            edges = [Edge(start, members[0])] + [Edge(a, b, "handoff") for a, bs in t.handoffs.items() for b in bs]
        edges += [Edge(m, end, stop) for m in members]
        nodes = [start, *([t.selector] if t.team == "selector" else []), *members, end]
        return Drawing(nodes, edges, {n: n for n in nodes[1:-1]}, bound=bound)

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        """The selector team on arithmetic with specialists named for their operations: ``SelectorTeacher``;
        any other AutoGen team: the generic framework teacher, which reads each request's messages."""
        t = cfg.topology
        if t.team == "selector" and cfg.env.name == "synthetic_math":
            specialists = t.participants or tuple(a.name for a in cfg.agents if a.name != t.selector)
            try:
                return SelectorTeacher(selector=t.selector or "", specialist_for=specialists_by_op(specialists),
                                       p_misroute=float(knobs.get("p_misroute", 0.4)))
            except NoTeacher:
                pass  # specialists not named for their operations: the generic teacher
        selector, terminations = autogen_shape(t, cfg.agent_names)
        return framework_teacher(cfg, demo_env(), knobs, selector, tuple(terminations))
