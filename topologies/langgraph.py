"""``kind: langgraph``: your own LangGraph graph, its agents trained each with its own policy.

``builder: "pkg.mod:build"`` names a function that returns a ``StateGraph`` (or a compiled
graph).  Its nodes are ordinary LangGraph code; where they called a chat model they call
``MasChatModel(agent="<YAML agent>")`` (``topologies/langchain_model.py``).  mas compiles the
graph once and runs it once per episode with ``ainvoke`` on the engine's event loop: the
state starts as ``{input_key: <task prompt>}`` (``input_as: messages``: a list with one user
message), and the team's answer is ``state[answer_key]`` at the end.  A run that exceeds
``recursion_limit`` super-steps is truncated (no answer).  That limit is the graph's termination:
left out, ``max_model_calls`` is derived from it (``graph_bound``: the limit times the most model
calls one super-step makes, taken as the most agents one node's code names, at least 1, since
LangGraph's supervisor, network and ReAct graphs run one node per step; a graph that fans out to
parallel nodes may make more, and gets a cap set by hand).

Not supported, refused by name: ``interrupt()`` and ``interrupt_before``/``interrupt_after``
(human-in-the-loop: nobody answers during training) at validate where the graph shows them,
and an episode the graph ends at an interrupt anyway is a failed episode (``GraphInterrupted``)
rather than a silent one with no answer.  ``with_structured_output`` on a ``MasChatModel`` works
(a forced call of the schema as a tool: ``topologies/langchain_model.py``).

Replays and interventions re-run the graph with the engine's script (recorded turns reused,
agents masked or removed).  Routing that depends only on the state the nodes built from the
messages replays faithfully; routing on anything else (a random number, the clock) gets the
engine's ``ReplayDivergence`` at the first frozen turn that differs, naming agent and turn.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Literal

from pydantic import Field

from mas.refs import RefError, import_ref
from mas.topologies.adapters import TeamBound, cap_warnings, derived_cap_help, model_call_cap
from mas.topologies.framework_teaching import framework_teacher, solver_checker_teacher
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.types import EpisodeContext, Outcome, Section

from .langchain_model import BUILDING, EPISODE, MasChatModel, NotInEpisodeError, record_tool_messages

__all__ = ["GraphInterrupted", "LangGraphTopology", "MasChatModel", "NotInEpisodeError", "UserGraph", "build_langgraph",
           "interrupt_errors", "langgraph_errors", "node_models", "reply_needs"]


class LangGraphTopology(Section):
    kind: Literal["langgraph"]
    builder: str = Field(
        description="'package.module:function' returning your LangGraph StateGraph (or a compiled graph); its nodes call "
        "agents through mas.topologies.langgraph.MasChatModel(agent=...)."
    )
    input_key: str = Field("question", description="State key that receives the task's prompt.")
    input_as: Literal["text", "messages"] = Field(
        "text", description="text: the prompt as a string; messages: a list with one user message (for MessagesState graphs)."
    )
    answer_key: str = Field(
        "answer", description="State key holding the team's answer at the end (a string or number; a message or a list of "
        "messages gives the last message's text)."
    )
    recursion_limit: int = Field(25, ge=1, description="LangGraph's bound on super-steps per episode (its default is 25).")
    max_model_calls: int | None = Field(
        None, ge=1, description=derived_cap_help("recursion_limit times the most agents one node's code calls (one node "
                                                 "runs per super-step in a graph without parallel branches)")
    )


class GraphInterrupted(RuntimeError):
    """The graph stopped at ``interrupt()``, waiting for human input that never comes in training."""


def load_graph(ref: str) -> tuple[Any, list[str]]:
    """The compiled graph ``ref`` builds, and the agents its MasChatModels name."""
    from langgraph.graph import StateGraph
    from langgraph.graph.state import CompiledStateGraph

    named: list[str] = []
    token = BUILDING.set(named)
    try:
        graph = import_ref(ref)()
    finally:
        BUILDING.reset(token)
    if isinstance(graph, StateGraph):
        graph = graph.compile()
    if not isinstance(graph, CompiledStateGraph):
        raise RefError(f"the builder returned a {type(graph).__name__}, not a LangGraph StateGraph")
    return graph, named


def langgraph_errors(cfg: Any, names: list[str]) -> list[tuple[tuple, Any, str]]:
    """The builder must build a graph whose chat models name YAML agents and whose state has the keys."""
    try:
        graph, named = load_graph(cfg.builder)
    except RefError as e:
        return [(("topology", "builder"), cfg.builder, str(e))]
    except Exception as e:  # noqa: BLE001 - the user's builder raised
        return [(("topology", "builder"), cfg.builder, f"the builder raised {type(e).__name__}: {e}")]
    errs = [(("topology", "builder"), cfg.builder, f"its MasChatModel names agent {a!r}, which is not in agents; valid: {names}")
            for a in dict.fromkeys(named) if a not in names]
    keys = state_keys(graph)
    for field in ("input_key", "answer_key"):
        if getattr(cfg, field) not in keys:
            errs.append((("topology", field), getattr(cfg, field), f"not a key of the graph's state; valid: {keys}"))
    errs += [(("topology", "builder"), cfg.builder, problem)
             for problem in interrupt_errors(graph)]
    return errs


HUMAN = ("waits for human input, and nobody answers during training (mas does not support human-in-the-loop "
         "graphs): remove it, or route on the state instead")


def interrupt_errors(graph: Any, where: str = "") -> list[str]:
    """Interrupts a compiled graph shows (its subgraphs included): nodes compiled with
    ``interrupt_before``/``interrupt_after``, and node functions that reach ``langgraph.types.interrupt``,
    in their own code or through the helper functions of the user's code they call (``_reached``).
    A node that reaches it another way (a method, a callback) is caught when it runs (``GraphInterrupted``)."""
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.types import interrupt

    out = []
    for when in ("before", "after"):
        nodes = getattr(graph, f"interrupt_{when}_nodes", None)
        if nodes:
            out.append(f"{where}the graph is compiled with interrupt_{when}={nodes if nodes == '*' else list(nodes)}, which {HUMAN}")
    for name, spec in graph.builder.nodes.items():
        runnable = spec.runnable
        if isinstance(runnable, CompiledStateGraph):
            out += interrupt_errors(runnable, f"{where}subgraph {name!r}: ")
            continue
        for fn, via in _reached(runnable):
            if any(obj is interrupt for obj in _referenced(fn)):
                out.append(f"{where}node {name!r} calls interrupt(){via}, which {HUMAN}")
                break
    return out


def _node_functions(runnable: Any) -> list[Any]:
    """The Python functions behind a node's runnable (its sync and async versions)."""
    import functools

    fns = []
    for fn in (getattr(runnable, "func", None), getattr(runnable, "afunc", None)):
        while isinstance(fn, functools.partial):
            fn = fn.func
        if callable(fn):
            fns.append(inspect.unwrap(fn))
    return [fn for fn in fns if getattr(fn, "__code__", None) is not None]


def _user_function(obj: Any) -> Any:
    """``obj`` as a plain function of the user's code (a bound method's function), else None:
    mas's own functions and the installed libraries' are not followed."""
    import sysconfig

    fn = getattr(obj, "__func__", obj)
    if not inspect.isfunction(fn):
        return None
    module, file = getattr(fn, "__module__", "") or "", fn.__code__.co_filename
    if module.split(".")[0] == "mas" or "site-packages" in file or "dist-packages" in file:
        return None
    if file.startswith(sysconfig.get_paths()["stdlib"]):
        return None
    return fn


def _reached(runnable: Any, depth: int = 6) -> list[tuple[Any, str]]:
    """The node's own functions, then the user-code functions they call, transitively (up to
    ``depth`` calls deep), each with how it is reached ("" or " through helper 'f'")."""
    seen: set[int] = set()
    out: list[tuple[Any, str]] = []
    frontier = [(fn, "") for fn in _node_functions(runnable)]
    for _ in range(depth + 1):
        nxt = []
        for fn, via in frontier:
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            out.append((fn, via))
            for obj in _referenced(fn):
                helper = _user_function(obj)
                if helper is not None and id(helper) not in seen:
                    nxt.append((helper, via or f" through helper {helper.__name__!r}"))
        frontier = nxt
    return out


def _names(fn: Any) -> set[str]:
    """The global and attribute names a function's code (its nested functions' included) uses."""
    names, codes = set(), [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if inspect.iscode(c)]
    return names


def _referenced(fn: Any) -> list[Any]:
    """The objects a function closes over or names as globals (its nested functions' names included),
    and the attributes it names of the modules among them (``types.interrupt``)."""
    names = _names(fn)
    cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
    found = cells + [fn.__globals__[n] for n in sorted(names) if n in fn.__globals__]
    modules = [obj for obj in found if inspect.ismodule(obj)]
    return found + [vars(m)[n] for m in modules for n in sorted(names) if n in vars(m)]  # no lazy attribute is loaded


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def state_keys(graph: Any) -> list[str]:
    """The keys of a compiled graph's state (the channels of its state schema)."""
    out = graph.output_channels
    return [out] if isinstance(out, str) else list(out)


def node_agents(graph: Any) -> dict[str, list[str]]:
    """The agents each node of a compiled graph calls, as far as its code shows: the
    MasChatModels (bound or not, alone or in a dict) its function closes over or names as
    globals.  For drawing only (``mas show``); a node that finds its model another way is
    listed without agents."""
    return {name: list(dict.fromkeys(model.agent for model, _ in bound)) for name, bound in node_models(graph).items()}


def node_models(graph: Any) -> dict[str, list[tuple[MasChatModel, dict[str, Any]]]]:
    """Each node's ``MasChatModel``s, as far as its function's code shows (what it closes over or
    names as globals), each with the arguments it is bound with (``bind_tools``' ``tools`` and
    ``tool_choice``; ``{}`` for the bare model): alone, in a dict, or inside a chain
    (``with_structured_output``'s model and parser)."""
    from langchain_core.runnables import RunnableBinding, RunnableParallel, RunnableSequence

    def models(obj: Any, kwargs: dict[str, Any], depth: int = 0) -> list[tuple[MasChatModel, dict[str, Any]]]:
        if depth > 8:
            return []
        if isinstance(obj, RunnableBinding):
            return models(obj.bound, {**obj.kwargs, **kwargs}, depth + 1)
        if isinstance(obj, MasChatModel):
            return [(obj, kwargs)]
        if isinstance(obj, RunnableSequence):
            return [m for step in obj.steps for m in models(step, kwargs, depth + 1)]
        if isinstance(obj, RunnableParallel):
            return [m for step in obj.steps__.values() for m in models(step, kwargs, depth + 1)]
        if isinstance(obj, dict):
            return [m for v in obj.values() for m in models(v, kwargs, depth + 1)]
        return []

    out: dict[str, list[tuple[MasChatModel, dict[str, Any]]]] = {}
    for name, spec in graph.builder.nodes.items():
        found: list[tuple[MasChatModel, dict[str, Any]]] = []
        runnable = spec.runnable
        for fn in (getattr(runnable, "func", None), getattr(runnable, "afunc", None)):
            fn = inspect.unwrap(fn) if callable(fn) else None
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c) and c.cell_contents is not None]
            found += [m for obj in cells + [fn.__globals__.get(n) for n in code.co_names] for m in models(obj, {})]
            found += [m for obj in bound_in_code(fn) for m in models(obj, {})]
        out[name] = found
    return out


_BINDS = ("with_structured_output", "bind_tools")


def bound_in_code(fn: Any) -> list[Any]:
    """What a node's code binds a ``MasChatModel`` to as it runs (``model.with_structured_output(Router)``
    or ``model.bind_tools([tool])`` inside the node, as LangGraph's supervisor tutorial writes it),
    bound here the same way: where the model is a name the function sees (a global or a closure
    variable) and every argument such a name or a literal.  Binding builds a runnable; nothing is
    called."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source (a lambda in a REPL, a C function)
        return []
    scope = {**fn.__globals__, **{n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())
                                  if _filled(c)}}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _BINDS
                and isinstance(node.func.value, ast.Name) and isinstance(scope.get(node.func.value.id), MasChatModel)):
            continue
        try:
            args = [_literal(a, scope) for a in node.args]
            kwargs = {k.arg: _literal(k.value, scope) for k in node.keywords if k.arg is not None}
            out.append(getattr(scope[node.func.value.id], node.func.attr)(*args, **kwargs))
        except Exception:  # noqa: BLE001 - an argument computed as it runs, or a binding that fails: not readable here
            continue
    return out


def _literal(node: ast.AST, scope: dict[str, Any]) -> Any:
    """The value of a call's argument that is a literal or a name in ``scope`` (lists and tuples of them)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in scope:
        return scope[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [_literal(e, scope) for e in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    raise ValueError(f"not a literal or a name the node sees: {ast.dump(node)}")


CALL_EFFECT = ("its call is cut before </tool_call>, so LangChain reads no call: with_structured_output gives None or "
               "fails, and a ToolNode gets nothing to run")
JSON_EFFECT = "its JSON object is cut before it closes, so LangChain's parser of with_structured_output fails the episode"


def reply_needs(cfg: Any) -> list[tuple[str, str, str, str]]:
    """``(agent, what, text, effect)``: each text one of an agent's replies must hold whole for the
    graph to work, as far as the graph's code shows it: a call of each tool a node's
    ``MasChatModel`` is bound with (``bind_tools``, ``with_structured_output``'s schema), with the
    shortest arguments the schema allows (its required fields; a field with allowed values at its
    longest), less the start a ``tool_choice`` forces (that is in the prompt, not the reply); and
    the shortest JSON object of a ``response_format`` it is bound with (``with_structured_output``
    in ``json_schema`` or ``json_mode``), less the forced ``{``."""
    from mas.response_format import shortest_object, shortest_reply
    from mas.tools import forced_call_start, tool_call_text

    try:
        graph = load_graph(cfg.topology.builder)[0]
    except Exception:  # noqa: BLE001 - a builder that fails: the `errors` hook says why
        return []
    needs = []
    for bound in node_models(graph).values():
        for model, kwargs in bound:
            tools = [t.get("function", t) for t in kwargs.get("tools") or [] if isinstance(t, dict)]
            names = [t.get("name") for t in tools]
            start = forced_call_start(kwargs.get("tool_choice"), names) if kwargs.get("tool_choice") != "none" else None
            for tool in tools if start is not None else []:
                text = tool_call_text(tool["name"], shortest_object(tool.get("parameters") or {}))
                forced = start if text.startswith(start) else ""
                needs.append((model.agent, f"a call of its tool {tool['name']!r}", text[len(forced):], CALL_EFFECT))
            fmt = kwargs.get("response_format")
            if isinstance(fmt, dict):
                text = shortest_reply(fmt, bool(tools) and kwargs.get("tool_choice") != "none")
                what = f"its structured output {fmt['name']!r}" if fmt.get("name") else "a JSON object"
                needs.append((model.agent, what, text, JSON_EFFECT))
    return needs





def graph_bound(recursion_limit: int, graph: Any) -> TeamBound:
    """The model calls a compiled graph's ``recursion_limit`` allows: the limit times the most
    agents one node's code names (``node_agents``; at least 1)."""
    per = max((len(a) for a in node_agents(graph).values()), default=0) or 1
    calls = f"{per} model call{'s' if per != 1 else ''} per step"
    return TeamBound(recursion_limit * per, f"recursion_limit {recursion_limit} super-steps",
                     f"{recursion_limit} super-steps x {calls}, the most one node's code names")


def read_answer(value: Any) -> str | None:
    """The answer in a state value: a string or number, or the text of the (last) message."""
    from langchain_core.messages import BaseMessage

    from .langchain_model import _text

    if isinstance(value, list) and value and isinstance(value[-1], BaseMessage):
        value = value[-1]
    if isinstance(value, BaseMessage):
        value = _text(value.content)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value).strip()


class UserGraph:
    """Runs the user's compiled graph once per episode."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.graph, self.agents = load_graph(cfg.builder)
        self.bound = graph_bound(cfg.recursion_limit, self.graph)

    def initial_state(self, ctx: EpisodeContext) -> dict[str, Any]:
        prompt = ctx.task.prompt
        return {self.cfg.input_key: [{"role": "user", "content": prompt}] if self.cfg.input_as == "messages" else prompt}

    async def run(self, ctx: EpisodeContext) -> Outcome:
        from langgraph.errors import GraphRecursionError

        from .adapters import EpisodeCalls

        explicit = self.cfg.max_model_calls
        calls = EpisodeCalls(ctx, model_call_cap(explicit, self.bound), self.bound, explicit=explicit is not None)
        token = EPISODE.set(calls)  # the graph's tasks and worker threads inherit it
        config = {"recursion_limit": self.cfg.recursion_limit,
                  "configurable": {"ctx": ctx, "thread_id": f"mas-episode-{ctx.key}"}}
        try:
            state = await self.graph.ainvoke(self.initial_state(ctx), config=config)
        except GraphRecursionError:
            calls.rethrow()
            return Outcome(answer=None, truncated=True)
        except Exception as exc:  # noqa: BLE001 - raise the engine's own error, not a wrapper
            calls.rethrow(exc)
        finally:
            EPISODE.reset(token)
            calls.cancel_pending()
        calls.rethrow()
        if state.get("__interrupt__"):  # LangGraph returns the state at an interrupt() as if the graph had ended
            said = "; ".join(repr(getattr(i, "value", i)) for i in state["__interrupt__"])
            raise GraphInterrupted(f"the graph stopped at interrupt() ({said}) after {calls.made} model call(s); "
                                   f"interrupt() {HUMAN}")
        for value in state.values():  # results of tool calls no model call read afterwards
            if isinstance(value, list):
                record_tool_messages(calls, value)
        return Outcome(answer=read_answer(state.get(self.cfg.answer_key)))


def _bound_of(topo: LangGraphTopology) -> TeamBound | None:
    """``graph_bound`` of the graph the config's builder builds; None where it does not build (the
    ``errors`` hook says why)."""
    try:
        return graph_bound(topo.recursion_limit, load_graph(topo.builder)[0])
    except Exception:  # noqa: BLE001 - the user's builder: its errors are reported by `errors`
        return None


def build_langgraph(cfg: Any) -> UserGraph:
    return UserGraph(cfg)


@register_topology
class LangGraph:
    name = "langgraph"
    config = LangGraphTopology
    build = staticmethod(build_langgraph)

    def agents(self, topo: LangGraphTopology) -> dict[str, str] | None:
        return None  # the graph's code decides which agents its nodes call

    def last_speakers(self, topo: LangGraphTopology) -> list[str]:
        return []

    def last_speaker_note(self, topo: LangGraphTopology) -> str | None:
        return None

    def main_agent(self, topo: LangGraphTopology) -> str | None:
        return None

    def parts(self, topo: LangGraphTopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: LangGraphTopology) -> list[str] | None:
        return None

    def turn_limit(self, topo: LangGraphTopology) -> int:
        """The cap as it applies (every turn is a model call, and the cap ends the episode)."""
        return model_call_cap(topo.max_model_calls, _bound_of(topo))

    def refs(self, topo: LangGraphTopology, names: list[str]) -> list[Issue]:
        return []  # the agents the graph's models name are checked with the graph (``errors``)

    def errors(self, cfg: Any) -> list[Issue]:
        return langgraph_errors(cfg.topology, cfg.agent_names)

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        return []

    def warnings(self, cfg: Any) -> list[Issue]:
        """A cap set below the model calls the graph's recursion_limit allows: episodes stop short of it."""
        t = cfg.topology
        bound = _bound_of(t) if t.max_model_calls is not None else None
        return [(("topology", "max_model_calls"), t.max_model_calls, m) for m in cap_warnings(t.max_model_calls, bound)]

    def reply_needs(self, cfg: Any) -> list[tuple[str, str, str, str]]:
        """Texts an agent's reply must hold whole (``reply_needs``); ``mas validate`` measures them
        against the agent's ``max_new_tokens`` in its own tokens (``mas.training.context_plan``)."""
        return reply_needs(cfg)

    def drawing(self, cfg: Any) -> Drawing:
        """The user's compiled graph as LangGraph sees it: its nodes and (labelled) edges, each node
        with the agent its code calls where that can be read from it (``node_agents``)."""
        t = cfg.topology
        graph = load_graph(t.builder)[0]
        drawn = graph.get_graph()
        name = {"__start__": registry.START, "__end__": registry.END}
        nodes = [registry.START] + [name.get(n, n) for n in drawn.nodes if n not in name] + [registry.END]
        edges = [Edge(name.get(e.source, e.source), name.get(e.target, e.target),
                      str(e.data) if e.data else "conditional" if e.conditional else "") for e in drawn.edges]
        agent_of = {n: agents[0] for n, agents in node_agents(graph).items() if len(agents) == 1}
        note = (f"nodes and edges of the graph {t.builder} builds, each with the agent its code calls where that can "
                f"be read from the code (MasChatModel for {', '.join(cfg.agent_names)}); answer from "
                f"state['{t.answer_key}']")
        return Drawing(nodes, edges, agent_of, note=note)

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        """A solver/checker graph on arithmetic (two agents, one answering and one giving verdicts):
        ``FrameworkChainTeacher``; any other graph: the generic framework teacher."""
        return solver_checker_teacher(cfg, knobs) or framework_teacher(cfg, demo_env(), knobs)
