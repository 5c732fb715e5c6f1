"""Framework teams that never stop, framework features mas cannot run, and the env's tools in
custom code (issue 39, "Teams from the frameworks' documentation").

* An episode past ``runtime.episode_timeout_s`` ends, whatever the team does: its model calls
  raise from then on, so an AutoGen team with no way to stop, or a LangGraph cycle, unwinds.
  Time is the engine's injected clock, moved on by the scripted backend at a chosen call, so
  nothing here depends on the machine's speed.
* ``topology.max_model_calls`` ends a team that never terminates even without a timeout.
* ``mas validate`` refuses, by name, what needs a person.
* Structured output (LangChain's ``with_structured_output``, AutoGen's ``output_content_type``) is
  served: the reply's start is forced (a call of the schema, or ``{``) and the framework parses it.
* A factory agent's YAML ``tools`` (the env's) work without the factory knowing about them.

Each rollout runs in a thread joined with a generous guard: before the fix these episodes
hung forever, and a hang must fail the test rather than the suite.
"""

from __future__ import annotations

import threading
from typing import Annotated, TypedDict

import pytest
from autogen_agentchat.agents import AssistantAgent, UserProxyAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import StructuredMessage
from autogen_agentchat.teams import RoundRobinGroupChat, Swarm
from langchain_core.messages import AnyMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from pydantic import BaseModel
from team_helpers import line_graph, team_config
from test_engine import ManualClock, scripted_engine

from mas.config.checks import meaning_errors
from mas.config.schema import ConfigError, validate_config
from mas.rollout.faults import FAULT_KINDS
from mas.topologies.langgraph import MasChatModel
from mas.types import ReplayRequest, Task

TASKS = [Task("t0", "2+3", "5"), Task("t1", "4+4", "8")]
GUARD_S = 120  # only a hung rollout gets near it
HAND_TO = {"lead": "checker", "checker": "lead"}


# --- teams as the frameworks' documentation writes them --------------------------------------------


def endless_round_robin(clients):
    """No termination condition: AutoGen runs it until something else stops it."""
    return RoundRobinGroupChat([AssistantAgent("lead", clients["lead"], system_message="You solve."),
                                AssistantAgent("checker", clients["checker"], system_message="You check.")])


def swarm(clients):
    """A Swarm that stops only when an agent says TERMINATE; the agents hand off to each other."""
    lead = AssistantAgent("lead", clients["lead"], handoffs=["checker"], system_message="You solve.")
    checker = AssistantAgent("checker", clients["checker"], handoffs=["lead"], system_message="You check.")
    return Swarm([lead, checker], termination_condition=TextMentionTermination("TERMINATE"))


def hand_off(req) -> str:
    """Every agent hands the task on and nobody says TERMINATE, except in task t1 (4+4)."""
    if req.agent == "lead" and "4+4" in req.messages[1]["content"]:
        return "TERMINATE. ANSWER: 8"
    return f'<tool_call>{{"name": "transfer_to_{HAND_TO[req.agent]}", "arguments": {{}}}}</tool_call>'


class Loop(TypedDict, total=False):
    question: str
    answer: str


def endless_graph() -> StateGraph:
    """solve -> check -> solve -> ... with no way out; the checker is a sync node (a worker thread)."""
    solver, checker = MasChatModel(agent="lead"), MasChatModel(agent="checker")

    async def solve(state: Loop) -> dict:
        return {"answer": (await solver.ainvoke([("user", state["question"])])).content}

    def check(state: Loop) -> dict:
        checker.invoke([("user", f"{state['question']}\nlead: {state['answer']}")])
        return {}

    g = StateGraph(Loop)
    g.add_node("solve", solve)
    g.add_node("check", check)
    g.add_edge(START, "solve")
    g.add_edge("solve", "check")
    g.add_edge("check", "solve")
    return g


def autogen_config(factory: str, **topology) -> dict:
    cfg = team_config("m", "chain")
    cfg["topology"] = {"kind": "autogen", "factory": f"test_framework_limits:{factory}", **topology}
    return cfg


def graph_config(builder: str, **topology) -> dict:
    cfg = team_config("m", "chain")
    cfg["topology"] = {"kind": "langgraph", "builder": f"test_framework_limits:{builder}", "recursion_limit": 10_000,
                       "answer_key": "answer", **topology}
    return cfg


ENDLESS = {
    "round_robin": autogen_config("endless_round_robin"),
    "swarm": autogen_config("swarm"),
    "langgraph": graph_config("endless_graph"),
}


def guarded_rollout(engine, tasks):
    out: dict = {}

    def run():
        try:
            out["groups"] = engine.rollout(tasks, 1, seed=0)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=GUARD_S)  # a guard against a hang, not a speed assertion
    assert not worker.is_alive(), "the rollout hung on an episode that never ends"
    assert "error" not in out, out.get("error")
    return [g.episodes[0] for g in out["groups"]]


def capped(cfg: dict, cap: int) -> dict:
    return {**cfg, "topology": {**cfg["topology"], "max_model_calls": cap}}


# --- 1. the episode timeout ends a team that never stops ----------------------------------------------


@pytest.mark.parametrize("team", sorted(ENDLESS))
def test_a_team_that_never_stops_ends_at_the_episode_timeout_with_a_counted_fault(team, tiny_tokenizer):
    clock = ManualClock()
    served = []

    def respond(req):
        served.append(req.agent)
        if len(served) == 5:  # the deadline passes while the fifth call is generated
            clock.advance(20.0)
        return hand_off(req) if team == "swarm" else "ANSWER: 4"

    engine, backend = scripted_engine(capped(ENDLESS[team], 10_000), respond, tiny_tokenizer)
    engine.episode_timeout, engine.sleep = 20.0, clock.sleep
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "error" and ep.error.startswith("timeout: episode exceeded 20.0s (runtime.episode_timeout_s)")
    assert ep.reward == 0.0 and 5 <= len(ep.turns) <= 6  # a call already on its way may be served; later ones are refused
    faults, messages = engine.take_faults()
    assert faults["episode_timeout"] == 1 and sum(faults.values()) == 1, faults  # not an agent or backend error
    assert "task 't0'" in messages["episode_timeout"]


def test_after_a_timeout_the_run_goes_on_and_the_next_rollout_is_unaffected(tiny_tokenizer):
    clock = ManualClock()

    def respond(req):
        if "4+4" not in req.messages[1]["content"] and req.agent == "checker":
            clock.advance(5.0)  # only task t0's episode loops; t1's ends at once
        return hand_off(req)

    engine, _ = scripted_engine(capped(ENDLESS["swarm"], 10_000), respond, tiny_tokenizer)
    engine.episode_timeout, engine.sleep = 5.0, clock.sleep
    first = guarded_rollout(engine, TASKS)
    assert [ep.status for ep in first] == ["error", "ok"] and first[1].answer == "8"
    assert engine.take_faults()[0]["episode_timeout"] == 1
    again = guarded_rollout(engine, TASKS[1:])
    assert again[0].status == "ok" and engine.take_faults()[0]["episode_timeout"] == 0


# --- 2. the cap on model calls -----------------------------------------------------------------------


@pytest.mark.parametrize("team", sorted(ENDLESS))
def test_max_model_calls_ends_a_team_that_never_stops_without_a_timeout(team, tiny_tokenizer):
    engine, backend = scripted_engine(capped(ENDLESS[team], 5), hand_off if team == "swarm" else lambda req: "ANSWER: 4",
                                      tiny_tokenizer)
    episodes = guarded_rollout(engine, TASKS)
    looped = episodes[0]
    assert looped.status == "error" and looped.error.startswith("model call limit: the team made 5 model calls")
    assert "topology.max_model_calls" in looped.error and looped.info["failure"] == "model_call_limit"
    assert len(looped.turns) == 5  # five calls answered, the sixth refused before it reached the backend
    faults, _ = engine.take_faults()
    if team == "swarm":  # task t1's lead says TERMINATE at once: that episode is not touched by the cap
        assert episodes[1].status == "ok" and faults["model_call_limit"] == 1 and backend.requests == 6
    else:
        assert faults["model_call_limit"] == 2 and backend.requests == 10
    assert sum(faults.values()) == faults["model_call_limit"]


def test_the_default_cap_is_finite_and_documented_with_its_fault_kind(tiny_tokenizer):
    cfg = validate_config(ENDLESS["round_robin"])
    assert cfg.topology.max_model_calls is None  # derived from the team's termination, where there is one
    assert "max_model_calls" in FAULT_KINDS["model_call_limit"]
    engine, backend = scripted_engine(ENDLESS["round_robin"], lambda req: "ANSWER: 4", tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])  # nothing set and no termination to read: the default cap ends it
    assert ep.status == "error" and len(ep.turns) == 64 and backend.requests == 64
    assert "topology.max_model_calls=64 by default" in ep.error and "so it may never end" in ep.error


# --- 3. unsupported framework features: refused by name --------------------------------------------


class Verdict(BaseModel):
    ok: bool


def with_user_proxy(clients):
    """AutoGen's human-in-the-loop example: an assistant and a UserProxyAgent."""
    return RoundRobinGroupChat([AssistantAgent("lead", clients["lead"]), UserProxyAgent("checker")],
                               termination_condition=MaxMessageTermination(4))


def with_structured_output(clients):
    """AutoGen's structured-output example: the team registers the agent's message type."""
    lead = AssistantAgent("lead", clients["lead"], output_content_type=Verdict)
    return RoundRobinGroupChat([lead], termination_condition=MaxMessageTermination(2),
                               custom_message_types=[StructuredMessage[Verdict]])


def ask_graph(ask) -> StateGraph:
    """A solver, then ``ask`` (a sync node) before the end."""
    model = MasChatModel(agent="lead")

    async def solve(state: Loop) -> dict:
        return {"answer": (await model.ainvoke([("user", state["question"])])).content}

    return line_graph(Loop, solve=solve, ask=ask)


def interrupting_graph() -> StateGraph:
    """LangGraph's human-in-the-loop example: a node that asks a person."""

    def ask(state: Loop) -> dict:
        return {"answer": interrupt({"question": "is this right?", "answer": state["answer"]})}

    return ask_graph(ask)


def graph_interrupted_before():
    return ask_graph(lambda state: {}).compile(interrupt_before=["ask"])


def structured_graph():
    MasChatModel(agent="lead").with_structured_output(Verdict)
    return endless_graph()


def ask_a_person(answer: str) -> str:
    """A helper of the user's code between the node and interrupt()."""
    return interrupt({"question": "is this right?", "answer": answer})


def confirm(answer: str) -> str:
    return ask_a_person(answer)  # two calls deep


def helper_interrupt_graph() -> StateGraph:
    """interrupt() reached through helpers, as the LangGraph docs' review tools do."""
    return ask_graph(lambda state: {"answer": confirm(state["answer"])})


LEAD = MasChatModel(agent="lead")


def structured_node_graph() -> StateGraph:
    """The LangGraph supervisor tutorial's pattern: structured output asked for inside the node,
    so building the graph succeeds and every episode would fail."""

    def route(state: Loop) -> dict:
        return {"answer": str(LEAD.with_structured_output(Verdict).invoke(state["question"]).ok)}

    return ask_graph(route)


def choose(question: str) -> bool:
    return LEAD.with_structured_output(Verdict).invoke(question).ok


def structured_helper_graph() -> StateGraph:
    return ask_graph(lambda state: {"answer": str(choose(state["question"]))})


def hosted_structured_graph() -> StateGraph:
    """Structured output of a model that is not an agent's (a hosted judge): not a mas call, left alone."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    judge = FakeListChatModel(responses=["{}"])

    def grade(state: Loop) -> dict:
        judge.with_structured_output(Verdict)
        return {}

    return ask_graph(grade)


def hidden_interrupt_graph() -> StateGraph:
    """The node reaches interrupt() through an attribute lookup that no inspection sees."""
    import langgraph.types

    return ask_graph(lambda state: {"answer": getattr(langgraph.types, "interrupt")("go on?")})


@pytest.mark.parametrize("cfg,needle", [
    (autogen_config("with_user_proxy"), "agent 'checker' is a UserProxyAgent, which waits for human input"),
    (graph_config("interrupting_graph"), "node 'ask' calls interrupt(), which waits for human input"),
    (graph_config("graph_interrupted_before"), "the graph is compiled with interrupt_before=['ask']"),
    (graph_config("helper_interrupt_graph"), "node 'ask' calls interrupt() through helper 'confirm', which waits for human"),
], ids=["user_proxy", "interrupt", "interrupt_before", "interrupt_through_helpers"])
def test_validate_refuses_unsupported_framework_features_by_name(cfg, needle):
    path = "topology.factory" if "factory" in cfg["topology"] else "topology.builder"
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, check=meaning_errors)
    assert any(line.startswith(path + ":") and needle in line for line in info.value.lines), info.value.lines


def test_mas_validate_names_the_user_proxy_agent(tmp_path, capsys):
    import yaml

    from mas.cli import main

    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(autogen_config("with_user_proxy")))
    assert main(["validate", str(path)]) != 0
    err = capsys.readouterr().err
    assert "topology.factory" in err and "agent 'checker' is a UserProxyAgent" in err, err


def test_a_graph_that_ends_at_an_interrupt_is_a_counted_failure_not_a_silent_episode(tiny_tokenizer):
    engine, _ = scripted_engine(graph_config("hidden_interrupt_graph"), lambda req: "ANSWER: 5", tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "error" and ep.error.startswith("GraphInterrupted: the graph stopped at interrupt() ('go on?')")
    assert "after 1 model call(s)" in ep.error and len(ep.turns) == 1
    assert engine.take_faults()[0]["agent_error"] == 1


def test_a_factory_that_slips_past_validate_fails_its_episode_with_the_same_message(tiny_tokenizer):
    engine, backend = scripted_engine(autogen_config("with_user_proxy"), lambda req: "ANSWER: 5", tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])  # scripted_engine does not run mas validate's checks
    assert ep.status == "error" and ep.error.startswith("NotImplementedError:") and "UserProxyAgent" in ep.error
    assert backend.requests == 0 and engine.take_faults()[0]["agent_error"] == 1


# --- 4. structured output: served, its reply's start forced ----------------------------------------


def verdict(ok: str = "true"):
    """The scripted policy: a call of the schema where its start is forced (LangChain's way), a JSON
    object where ``{`` is (AutoGen's), else text."""
    def respond(req) -> str:
        if req.prefix.startswith("<tool_call>"):
            return req.prefix + '{"ok": %s}}</tool_call>' % ok
        if req.prefix == "{":
            return '{"ok": %s}' % ok
        return "ANSWER: 5"
    return respond


@pytest.mark.parametrize("builder", ["structured_graph", "structured_node_graph", "structured_helper_graph",
                                     "hosted_structured_graph"])
def test_a_graph_asking_a_mas_model_for_structured_output_validates(builder):
    validate_config(graph_config(builder), check=meaning_errors)  # no ConfigError


@pytest.mark.parametrize("builder", ["structured_node_graph", "structured_helper_graph"])
def test_with_structured_output_forces_a_call_of_the_schema_and_parses_its_arguments(builder, tiny_tokenizer):
    """The LangGraph supervisor tutorial's pattern (in the node, or in a helper it calls) runs: the
    reply starts as a call of Verdict, the arguments the policy wrote become the object."""
    engine, backend = scripted_engine(graph_config(builder), verdict(), tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "ok", ep.error
    assert ep.answer == "True" and [t.agent for t in ep.turns] == ["lead", "lead"]
    turn = ep.turns[1]
    start = '<tool_call>{"name": "Verdict", "arguments": '
    start_ids = tiny_tokenizer(start, add_special_tokens=False)["input_ids"]
    assert turn.prompt_ids[-len(start_ids):] == start_ids and turn.text.startswith(start)  # trained: what follows
    assert "Verdict" in turn.messages[0]["content"]  # the schema is described as the one tool


def test_output_content_type_asks_for_its_schema_and_forces_a_json_start(tiny_tokenizer):
    engine, _ = scripted_engine(autogen_config("with_structured_output"), verdict(), tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "ok", ep.error
    [turn] = ep.turns
    assert turn.text == '{"ok": true}' and turn.messages[0]["role"] == "system"
    assert 'following this JSON schema (Verdict):\n{"properties": {"ok":' in turn.messages[0]["content"]
    assert turn.prompt_ids[-1:] == tiny_tokenizer("{", add_special_tokens=False)["input_ids"]
    assert engine.take_faults()[0].get("response_format_unmet", 0) == 0


def test_a_reply_that_misses_output_content_type_counts_the_fault_and_fails_as_autogen_does(tiny_tokenizer):
    engine, _ = scripted_engine(autogen_config("with_structured_output"), verdict('"maybe"}, {'), tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "error" and "ValidationError" in ep.error  # AutoGen's own parse of the text
    faults = engine.take_faults()
    assert faults[0]["response_format_unmet"] == 1 and "response_format_unmet" in FAULT_KINDS
    assert faults[1]["response_format_unmet"].startswith("agent 'lead', turn 0: response_format 'json_schema' asked")


# --- 4. the env's tools for a factory's agents and a graph's nodes -----------------------------------


def researcher_team(clients):
    """A user's team: the researcher's tools are the env's (YAML tools: [search, read]), not in this code."""
    researcher = AssistantAgent("researcher", clients["researcher"], system_message="You look things up.")
    answerer = AssistantAgent("answerer", clients["answerer"], system_message="You answer from the notes.")
    return RoundRobinGroupChat([researcher, answerer], termination_condition=MaxMessageTermination(3))


class Notes(TypedDict, total=False):
    question: str
    notes: str
    answer: str


def researcher_graph() -> StateGraph:
    researcher, answerer = MasChatModel(agent="researcher"), MasChatModel(agent="answerer")

    async def research(state: Notes) -> dict:
        return {"notes": (await researcher.ainvoke([("system", "You look things up."), ("user", state["question"])])).content}

    async def answer(state: Notes) -> dict:
        return {"answer": (await answerer.ainvoke([("user", f"{state['question']}\nresearcher: {state['notes']}")])).content}

    g = StateGraph(Notes)
    g.add_node("research", research)
    g.add_node("answer", answer)
    g.add_edge(START, "research")
    g.add_edge("research", "answer")
    g.add_edge("answer", END)
    return g


@pytest.mark.parametrize("topology", [
    {"kind": "autogen", "factory": "test_framework_limits:researcher_team"},
    {"kind": "langgraph", "builder": "test_framework_limits:researcher_graph"},
], ids=["autogen_factory", "langgraph_builder"])
def test_a_custom_code_agent_calls_the_envs_tools_and_a_replay_reuses_their_results(topology, tiny_tokenizer, tmp_path):
    from test_engine_tools import SEARCH, counting, engine_for, research_config

    from mas.envs.research import HotpotQAConfig, HotpotQAEnv

    env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa"))

    def respond(req):
        if req.agent == "researcher":
            return "Shirley Temple." if "<tool_response>" in req.messages[-1]["content"] else SEARCH
        return "ANSWER: Shirley Temple"

    engine = engine_for(research_config(topology), respond, tiny_tokenizer, env)
    ran = counting(engine, tmp_path)
    task = Task("q", "Who was Chief of Protocol?", "Shirley Temple", meta={"answers": ["Shirley Temple"]})
    (ep,) = guarded_rollout(engine, [task])
    assert ep.status == "ok", ep.error
    assert [t.agent for t in ep.turns] == ["researcher", "researcher", "answerer"]
    call, report, _ = ep.turns
    system = call.messages[0]["content"]
    assert system.startswith("You look things up.") and "You can call these tools (at most 3 calls)" in system  # told
    assert call.tool_calls[0]["name"] == "search" and call.tool_calls[0]["valid"] and call.parsed["label"] == "tool"
    assert "Shirley Temple" in call.observations[0] and call.extra_rewards["tool_valid"] == 1.0
    assert report.parent == call.index and report.messages[-2] == {"role": "assistant", "content": SEARCH}
    answer = "Shirley Temple" if topology["kind"] == "autogen" else "ANSWER: Shirley Temple"  # (the graph's state text)
    assert ep.answer == answer and ran == ["search"]  # run once, in the engine's sandbox
    replay = engine.execute([ReplayRequest("r", ep, freeze_upto=3)], seed=1)["r"][0]
    assert replay.status == "ok" and [t.replayed for t in replay.turns] == [True, True, True]
    assert replay.turns[0].observations == call.observations and ran == ["search"]  # not run again


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def mixed_graph() -> StateGraph:
    """A tool loop with a tool of the graph's own (multiply, run by its ToolNode) for an agent
    that also has the env's tools (search, read: run by mas)."""
    model = MasChatModel(agent="researcher").bind_tools([multiply])

    async def agent(state: Chat) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(Chat)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([multiply]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g


def test_env_tools_and_the_graphs_own_tools_each_run_where_they_belong_and_replay(tiny_tokenizer, tmp_path):
    from test_engine_tools import SEARCH, counting, engine_for, research_config

    from mas.envs.research import HotpotQAConfig, HotpotQAEnv

    env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa"))
    times = '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'

    def respond(req):  # (the graph's messages hold no search round: mas ran it inside the call)
        last = req.messages[-1]["content"]
        return "ANSWER: 6" if last.startswith("<tool_response>\n6") else times if "search(" in last else SEARCH

    cfg = research_config({"kind": "langgraph", "builder": "test_framework_limits:mixed_graph", "input_key": "messages",
                           "input_as": "messages", "answer_key": "messages"})
    engine = engine_for(cfg, respond, tiny_tokenizer, env)
    ran = counting(engine, tmp_path)
    (ep,) = guarded_rollout(engine, [Task("q", "2*3?", "6", meta={"answers": ["6"]})])
    assert ep.status == "ok", ep.error
    search, product, reply = ep.turns
    assert search.tool_calls[0]["name"] == "search" and search.tool_calls[0]["valid"] and ran == ["search"]  # by mas
    assert product.parent == search.index and product.tool_calls[0]["id"] == "call_1_0"  # by the graph's ToolNode
    assert product.observations == ["6"] and product.tool_calls[0]["valid"]
    assert reply.parent == product.index and reply.text == "ANSWER: 6"
    system = search.messages[0]["content"]
    assert "multiply(a: int, b: int)" in system and "You can call these tools (at most 3 calls)" in system
    n = engine.backend.requests
    replay = engine.execute([ReplayRequest("r", ep, freeze_upto=3)], seed=1)["r"][0]
    assert replay.status == "ok" and [t.replayed for t in replay.turns] == [True, True, True]
    assert engine.backend.requests == n and ran == ["search"]  # nothing generated or run again


def test_autogens_json_output_becomes_a_response_format():
    from mas.topologies.autogen_client import _json_format

    assert _json_format("lead", None) is None and _json_format("lead", False) is None
    assert _json_format("lead", True) == {"type": "json_object"}
    fmt = _json_format("lead", Verdict)
    assert fmt["type"] == "json_schema" and fmt["name"] == "Verdict" and fmt["schema"]["required"] == ["ok"]
    with pytest.raises(ValueError, match="json_output must be True, False, None or a pydantic model class; got 'yes'"):
        _json_format("lead", "yes")


def json_structured_graph() -> StateGraph:
    """with_structured_output(method="json_schema"), ChatOpenAI's default, on a MasChatModel (and
    json_mode with include_raw, which gives the raw message beside the parsed dict)."""
    as_json = MasChatModel(agent="lead").with_structured_output(Verdict, method="json_schema")
    raw = MasChatModel(agent="checker").with_structured_output(None, method="json_mode", include_raw=True)

    async def grade(state: Loop) -> dict:
        verdict = await as_json.ainvoke(state["question"])
        both = await raw.ainvoke(state["question"])
        return {"answer": f"{verdict.ok} {both['parsed']['ok']} {both['raw'].content}"}

    g = StateGraph(Loop)
    g.add_node("grade", grade)
    g.add_edge(START, "grade")
    g.add_edge("grade", END)
    return g


def test_with_structured_output_in_json_schema_or_json_mode_forces_a_json_start_and_parses_it(tiny_tokenizer):
    engine, _ = scripted_engine(graph_config("json_structured_graph"), verdict(), tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "ok", ep.error
    assert ep.answer == 'True True {"ok": true}'
    schema_turn, mode_turn = ep.turns
    assert 'following this JSON schema (Verdict):\n{"title": "Verdict"' in schema_turn.messages[0]["content"]
    assert '"required": ["ok"]' in schema_turn.messages[0]["content"]
    assert mode_turn.messages[0]["content"].endswith("Reply with one JSON object and nothing else.")
    assert all(t.prompt_ids[-1:] == tiny_tokenizer("{", add_special_tokens=False)["input_ids"] for t in ep.turns)
    engine, _ = scripted_engine(graph_config("json_structured_graph"), verdict('"maybe"}, {'), tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "error" and "OutputParserException" in ep.error  # LangChain's parse of the reply
    assert engine.take_faults()[0]["response_format_unmet"] == 1
    with pytest.raises(ValueError, match="method must be 'function_calling', 'json_schema' or 'json_mode'"):
        MasChatModel(agent="lead").with_structured_output(Verdict, method="xml")
