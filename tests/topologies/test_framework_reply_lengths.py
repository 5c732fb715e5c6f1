"""Reply budgets against what a framework team's own protocol needs (issue 54): a swarm agent's
handoff is a ``transfer_to_<agent>`` tool call (58-65 of the embedded model's tokens) and a
selector's reply is a participant's name (up to 15 tokens for the docs' 'data_analyst_agent').
``mas validate`` measured reply budgets against the env's tool calls only, so a config that cut
every handoff or every selection passed silently; now it names the agent, its budget, the
tokens needed and the setting that fixes it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal, TypedDict

from team_helpers import line_graph

from mas.config.schema import validate_config
from mas.tools import tool_call_text
from mas.training.context_plan import context_issues, reply_issues

ARITH = {"name": "synthetic_math", "num_ops": 1, "seed": 0}


class CharTokenizer:
    """One token per character: the lengths can be written down by hand."""

    def encode(self, text, add_special_tokens=False):
        return list(text)


def team(agents: dict[str, int], topology: dict) -> dict:
    """A team on the embedded model; ``agents``: name -> max_new_tokens."""
    return {
        "team": {"name": "replies"},
        "policies": {"p": {"kind": "full", "model": "embedded"}},
        "agents": [{"name": n, "policy": "p", "role": f"You are {n}.", "parser": "raw" if n == "selector" else "answer",
                    "sampling": {"max_new_tokens": budget}} for n, budget in agents.items()],
        "topology": topology, "env": ARITH, "credit": {"method": "grpo"},
    }


SWARM = {"kind": "autogen", "team": "swarm", "handoffs": {"lead": ["checker"], "checker": ["lead"]},
         "termination": {"text": "TERMINATE", "max_messages": 8}}


def test_a_swarm_budget_under_its_handoff_call_is_named_with_the_tokens_it_needs():
    call = tool_call_text("transfer_to_checker", {})
    assert call == '<tool_call>{"name": "transfer_to_checker", "arguments": {}}</tool_call>'
    cfg = validate_config(team({"lead": 32, "checker": 96}, SWARM))
    (line,) = reply_issues(cfg, lambda policy: CharTokenizer())
    assert line.startswith(f"agents.lead.sampling.max_new_tokens=32 cannot hold its handoff call 'transfer_to_checker', "
                           f"which takes {len(call)} tokens of policy 'p': every such reply is cut before it ends")
    assert "the swarm never moves on" in line and f"agents.lead.sampling.max_new_tokens={len(call)} or more" in line


def test_mas_validate_measures_handoffs_and_selections_in_the_embedded_models_tokens():
    swarm = validate_config(team({"lead": 32, "checker": 96}, SWARM))
    lines = [x for x in context_issues(swarm) if "cannot hold its handoff" in x]
    assert lines == [line for line in lines if line.startswith("agents.lead.")] and len(lines) == 1
    assert "cannot hold its handoff call 'transfer_to_checker', which takes 58 tokens of policy 'p'" in lines[0]
    assert not [x for x in context_issues(validate_config(team({"lead": 96, "checker": 96}, SWARM))) if "cannot hold" in x]

    selector = {"kind": "autogen", "team": "selector", "selector": "selector", "termination": {"max_messages": 6}}
    cfg = validate_config(team({"selector": 8, "planner": 24, "web_search_agent": 24}, selector))
    (line,) = [x for x in context_issues(cfg) if "cannot hold" in x]
    assert line.startswith("agents.selector.sampling.max_new_tokens=8 cannot hold the name of participant "
                           "'web_search_agent', which takes 14 tokens of policy 'p'")
    assert "keeps the previous speaker" in line


def test_a_factory_teams_handoffs_and_selector_are_read_from_the_team_it_builds():
    swarm = team({"lead": 16, "checker": 16}, {"kind": "autogen", "factory": "test_framework_limits:swarm"})
    lines = reply_issues(validate_config(swarm), lambda policy: CharTokenizer())
    assert [x.split(" cannot hold ")[0] for x in lines] == ["agents.lead.sampling.max_new_tokens=16",
                                                          "agents.checker.sampling.max_new_tokens=16"]
    assert "its handoff call 'transfer_to_lead'" in lines[1]

    names = {"selector": 6, "planning_agent": 64, "web_search_agent": 64, "data_analyst_agent": 64}
    docs = team(names, {"kind": "autogen", "factory": "test_model_call_cap:web_search_team"})
    (line,) = reply_issues(validate_config(docs), lambda policy: CharTokenizer())
    assert line.startswith("agents.selector.sampling.max_new_tokens=6 cannot hold the name of participant "
                           f"'data_analyst_agent', which takes {len('data_analyst_agent')} tokens")


def test_kinds_without_a_framework_protocol_need_nothing():
    chain = validate_config(team({"a": 4, "b": 4}, {"kind": "chain", "sequence": ["a", "b"]}))
    assert reply_issues(chain, lambda policy: CharTokenizer()) == []
    cfg = SimpleNamespace(topology=chain.topology)
    assert reply_issues(cfg, lambda policy: None) == []


# --- a LangGraph graph's bound tools: with_structured_output's schema, bind_tools ----------------------------


class Route(TypedDict):
    """Who goes next."""

    next: Literal["calculator", "FINISH"]


class Question(TypedDict, total=False):
    question: str
    answer: str


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def routed_graph():
    """A router whose choice is structured output and a checker bound to a tool, both built with the graph."""
    from mas.topologies.langgraph import MasChatModel

    router = MasChatModel(agent="lead").with_structured_output(Route)
    checker = MasChatModel(agent="checker").bind_tools([multiply])

    async def route(state: Question) -> dict:
        return {"answer": (await router.ainvoke(state["question"]))["next"]}

    async def check(state: Question) -> dict:
        return {"answer": (await checker.ainvoke(state["question"])).content}

    return line_graph(Question, route=route, check=check)


def test_a_graphs_structured_output_and_bound_tools_need_room_for_their_calls():
    from mas.topologies.langgraph import load_graph, node_agents

    graph = {"kind": "langgraph", "builder": "test_framework_reply_lengths:routed_graph"}
    rest = '{"next": "calculator"}}</tool_call>'  # after the forced start, with the longest allowed value
    call = tool_call_text("multiply", {"a": 0, "b": 0})  # not forced: the whole call, the shortest arguments
    (line,) = reply_issues(validate_config(team({"lead": 16, "checker": len(call)}, graph)), lambda p: CharTokenizer())
    assert line.startswith(f"agents.lead.sampling.max_new_tokens=16 cannot hold a call of its tool 'Route', which takes "
                           f"{len(rest)} tokens of policy 'p'") and "with_structured_output gives None or fails" in line
    (line,) = reply_issues(validate_config(team({"lead": len(rest), "checker": len(call) - 1}, graph)), lambda p: CharTokenizer())
    assert line.startswith(f"agents.checker.sampling.max_new_tokens={len(call) - 1} cannot hold a call of its tool 'multiply'")
    assert node_agents(load_graph(graph["builder"])[0]) == {"route": ["lead"], "check": ["checker"]}  # inside the chain too


def tutorial_graph():
    """routed_graph as LangGraph's supervisor tutorial writes the router: the binding inside the node
    (``llm.with_structured_output(Router).invoke(...)``), the model a module-level name."""
    global LEAD, CHECKER
    from mas.topologies.langgraph import MasChatModel

    LEAD, CHECKER = MasChatModel(agent="lead"), MasChatModel(agent="checker")
    tools = [multiply]

    async def route(state: Question) -> dict:
        return {"answer": (await LEAD.with_structured_output(Route).ainvoke(state["question"]))["next"]}

    async def check(state: Question) -> dict:
        return {"answer": (await CHECKER.bind_tools(tools).ainvoke(state["question"])).content}

    return line_graph(Question, route=route, check=check)


def test_bindings_made_inside_a_node_need_room_too():
    """The tutorial's way of binding (inside the node, each time it runs) is read from the node's code:
    the same two budgets are measured as where the graph's builder binds the models."""
    graph = {"kind": "langgraph", "builder": "test_framework_reply_lengths:tutorial_graph"}
    rest = '{"next": "calculator"}}</tool_call>'
    call = tool_call_text("multiply", {"a": 0, "b": 0})
    lines = reply_issues(validate_config(team({"lead": 16, "checker": len(call) - 1}, graph)), lambda p: CharTokenizer())
    assert [line.split(" cannot hold ")[0] for line in lines] == ["agents.lead.sampling.max_new_tokens=16",
                                                                  f"agents.checker.sampling.max_new_tokens={len(call) - 1}"]
    assert f"a call of its tool 'Route', which takes {len(rest)} tokens" in lines[0]
    assert reply_issues(validate_config(team({"lead": len(rest), "checker": len(call)}, graph)), lambda p: CharTokenizer()) == []


def test_an_autogen_agents_structured_output_needs_room_for_its_shortest_object():
    rest = '"ok": false}'  # Verdict's shortest object, less the '{' a reply without tools is forced to start with
    cfg = team({"lead": len(rest) - 1}, {"kind": "autogen", "factory": "test_framework_limits:with_structured_output"})
    (line,) = reply_issues(validate_config(cfg), lambda policy: CharTokenizer())
    assert line.startswith(f"agents.lead.sampling.max_new_tokens={len(rest) - 1} cannot hold its structured output "
                           f"Verdict, which takes {len(rest)} tokens") and "AutoGen's parse of it fails" in line
    cfg = team({"lead": len(rest)}, {"kind": "autogen", "factory": "test_framework_limits:with_structured_output"})
    assert reply_issues(validate_config(cfg), lambda policy: CharTokenizer()) == []


def test_the_shortest_object_a_schema_allows():
    from mas.response_format import shortest_object

    schema = {"properties": {"grade": {"enum": ["correct", "incorrect"]}, "n": {"type": "integer"},
                             "note": {"type": "string"}, "extra": {"type": "string"}},
              "required": ["grade", "n", "note"]}
    assert shortest_object(schema) == {"grade": "incorrect", "n": 0, "note": ""}  # the longest allowed value


def json_routed_graph():
    """The router of routed_graph in with_structured_output's json_schema method (ChatOpenAI's default)."""
    from mas.topologies.langgraph import MasChatModel

    router = MasChatModel(agent="lead").with_structured_output(Route, method="json_schema")

    async def route(state: Question) -> dict:
        return {"answer": (await router.ainvoke(state["question"]))["next"]}

    return line_graph(Question, route=route)


def test_a_graphs_json_structured_output_needs_room_for_its_shortest_object():
    graph = {"kind": "langgraph", "builder": "test_framework_reply_lengths:json_routed_graph"}
    rest = '"next": "calculator"}'  # the shortest object, less the forced '{'
    (line,) = reply_issues(validate_config(team({"lead": len(rest) - 1}, graph)), lambda p: CharTokenizer())
    assert line.startswith(f"agents.lead.sampling.max_new_tokens={len(rest) - 1} cannot hold its structured output "
                           f"'Route', which takes {len(rest)} tokens") and "LangChain's parser" in line
    assert reply_issues(validate_config(team({"lead": len(rest)}, graph)), lambda p: CharTokenizer()) == []
