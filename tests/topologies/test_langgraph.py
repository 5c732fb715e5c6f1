"""kind: langgraph: the user's own LangGraph graph, its chat models mas agents (MasChatModel)."""

from __future__ import annotations

import asyncio
import copy
import math
import random
from typing import Annotated, TypedDict

import pytest
from langchain_core.messages import AnyMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from team_helpers import team_config
from test_engine import scripted_engine

from mas.config.checks import meaning_errors
from mas.config.schema import ConfigError, validate_config
from mas.training.team import build_team
from mas.topologies.langgraph import MasChatModel, NotInEpisodeError
from mas.types import ReplayRequest, Task

TASKS = [Task("t0", "2+3", "5"), Task("t1", "4+4", "8")]


class Draft(TypedDict, total=False):
    question: str
    draft: str
    verdict: str
    answer: str


def two_nodes() -> StateGraph:
    """A solver and a checker; the checker's REJECT sends the task back (a conditional edge).
    The checker is a plain `def` node: LangGraph runs it in a worker thread."""
    solver, checker = MasChatModel(agent="lead"), MasChatModel(agent="checker")

    async def solve(state: Draft) -> dict:
        reply = await solver.ainvoke([("user", state["question"])])
        return {"draft": reply.content, "answer": reply.content}

    def check(state: Draft) -> dict:
        return {"verdict": checker.invoke([("user", f"{state['question']}\nlead: {state['draft']}")]).content}

    g = StateGraph(Draft)
    g.add_node("solve", solve)
    g.add_node("check", check)
    g.add_edge(START, "solve")
    g.add_edge("solve", "check")
    g.add_conditional_edges("check", lambda s: "solve" if "REJECT" in s["verdict"] else END, ["solve", END])
    return g


def coin_graph(checked: bool = False) -> StateGraph:
    """Routes on a random number: not replayable.  ``checked``: a checker speaks after it (a
    second turn, which C3 replays with the first frozen)."""
    models = {"a": MasChatModel(agent="lead"), "b": MasChatModel(agent="helper"), "check": MasChatModel(agent="checker")}

    def node(name):
        async def run(state: Draft) -> dict:
            return {"answer": (await models[name].ainvoke([("user", state["question"])])).content}
        return run

    g = StateGraph(Draft)
    for name in ("a", "b") + (("check",) if checked else ()):
        g.add_node(name, node(name))
    g.add_conditional_edges(START, lambda s: "a" if random.random() < 0.5 else "b", ["a", "b"])
    g.add_edge("a", "check" if checked else END)
    g.add_edge("b", "check" if checked else END)
    if checked:
        g.add_edge("check", END)
    return g


def coin_then_check() -> StateGraph:
    return coin_graph(checked=True)


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def react_graph() -> StateGraph:
    """The usual tool loop: a model with bound tools, LangGraph's ToolNode, tools_condition."""
    model = MasChatModel(agent="lead").bind_tools([multiply])

    async def agent(state: Chat) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(Chat)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([multiply]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g


def forced_graph() -> StateGraph:
    """One node whose model must call a tool (LangChain's tool_choice='any'); the answer is the call's arguments."""
    model = MasChatModel(agent="lead").bind_tools([multiply], tool_choice="any")

    async def agent(state: Chat) -> dict:
        reply = await model.ainvoke(state["messages"])
        return {"messages": [reply.model_copy(update={"content": str(reply.tool_calls[0]["args"])})]}

    g = StateGraph(Chat)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g


def unknown_agent_graph() -> StateGraph:
    MasChatModel(agent="ghost")
    return two_nodes()


class Shared(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    answer: str


def shared_messages() -> StateGraph:
    """A lead and a checker on one message list (as LangGraph's supervisor and network graphs):
    the checker's context holds the lead's AI message, and the lead's second call holds both."""
    lead, checker = MasChatModel(agent="lead"), MasChatModel(agent="checker")

    async def solve(state: Shared) -> dict:
        reply = await lead.ainvoke(state["messages"])
        return {"messages": [reply], "answer": reply.content}

    async def check(state: Shared) -> dict:
        return {"messages": [await checker.ainvoke(state["messages"])]}

    g = StateGraph(Shared)
    g.add_node("solve", solve)
    g.add_node("check", check)
    g.add_edge(START, "solve")
    g.add_edge("solve", "check")
    g.add_conditional_edges("check", lambda s: "solve" if "REJECT" in s["messages"][-1].content else END, ["solve", END])
    return g


def graph_config(builder: str, model: str = "m", **topology) -> dict:
    cfg = team_config(model, "chain")
    cfg["topology"] = {"kind": "langgraph", "builder": f"test_langgraph:{builder}", **topology}
    return cfg


def verdicts(*replies):
    it = iter(replies)
    return lambda req: "ANSWER: 5" if req.agent == "lead" else next(it)


def test_the_graph_runs_with_its_models_as_agents_and_its_state_answer(tiny_tokenizer):
    engine, backend = scripted_engine(graph_config("two_nodes"), verdicts("REJECT", "ACCEPT"), tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert [t.agent for t in ep.turns] == ["lead", "checker", "lead", "checker"]
    assert [t.parent for t in ep.turns] == [None, 0, 1, 2]
    assert ep.turns[0].messages == [{"role": "system", "content": "You are the lead."}, {"role": "user", "content": "2+3"}]
    assert ep.turns[1].messages[-1]["content"] == "2+3\nlead: ANSWER: 5"
    assert ep.answer == "ANSWER: 5"


def test_another_agents_ai_message_is_read_as_its_words_not_written_as_the_models_own(tiny_tokenizer):
    cfg = graph_config("shared_messages")
    cfg["topology"].update(input_key="messages", input_as="messages")
    engine, _ = scripted_engine(cfg, verdicts("REJECT", "ACCEPT"), tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert [t.agent for t in ep.turns] == ["lead", "checker", "lead", "checker"]
    assert ep.turns[1].messages[1:] == [{"role": "user", "content": "2+3\nlead: ANSWER: 5"}]  # consecutive user messages join
    assert ep.turns[2].messages[1:] == [{"role": "user", "content": "2+3"}, {"role": "assistant", "content": "ANSWER: 5"},
                                        {"role": "user", "content": "checker: REJECT"}]


def test_sync_and_async_nodes_of_many_episodes_batch_the_same_in_every_run(tiny_model_dir):
    """36 episodes, more than asyncio's default thread pool has threads (at most 32): every
    episode's sync checker holds a worker thread until the batch of all 36 is served."""
    team = build_team(validate_config(graph_config("two_nodes", str(tiny_model_dir))))
    sizes: list[int] = []
    generate = team.backend.generate_batch
    team.backend.generate_batch = lambda reqs, seed=None: (sizes.append(len(reqs)), generate(reqs, seed))[1]
    runs = []
    for _ in range(3):
        sizes.clear()
        groups = team.engine.rollout(TASKS, 18, seed=2)
        runs.append(([[t.completion_ids for t in ep.turns] for g in groups for ep in g.episodes], list(sizes)))
    assert all(r == runs[0] for r in runs)
    assert runs[0][1][:2] == [36, 36]  # the solvers of all episodes, then their checkers (worker threads)


def test_bind_tools_and_a_tool_node_record_the_call_and_its_result(tiny_tokenizer):
    def respond(req):
        if "<tool_response>" in req.messages[-1]["content"]:
            return "ANSWER: 6"
        return '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'

    engine, _ = scripted_engine(graph_config("react_graph", input_key="messages", input_as="messages", answer_key="messages"),
                                respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    call, reply = ep.turns
    assert call.tool_calls[0]["name"] == "multiply" and call.tool_calls[0]["valid"] and call.observations == ["6"]
    assert "multiply(a: int, b: int): Multiply two integers." in call.messages[0]["content"]
    assert reply.parent == call.index and ep.answer == "ANSWER: 6"


def test_a_tool_choice_that_asks_for_a_call_forces_its_start(tiny_tokenizer):
    from mas.topologies.langchain_model import openai_tool_choice

    starts = []

    def respond(req):
        starts.append(req.prefix)
        return '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'

    engine, _ = scripted_engine(graph_config("forced_graph", input_key="messages", input_as="messages", answer_key="messages"),
                                respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert starts == ['<tool_call>{"name": "multiply", "arguments": '] and ep.answer == "{'a': 2, 'b': 3}"
    [turn] = ep.turns
    start = tiny_tokenizer(starts[0], add_special_tokens=False)["input_ids"]
    assert turn.prompt_ids[-len(start):] == start and turn.text.startswith(starts[0])
    assert [openai_tool_choice(c, ["add", "mul"]) for c in (None, "auto", "none", "any", "required", "mul")] == [
        None, "auto", "none", "required", "required", {"type": "function", "function": {"name": "mul"}}]
    assert openai_tool_choice(True, ["add"]) == "required"
    with pytest.raises(ValueError, match="not among the bound tools"):
        openai_tool_choice("div", ["add", "mul"])
    with pytest.raises(ValueError, match="tool_choice must be"):
        openai_tool_choice(True, ["add", "mul"])  # True names the one tool: with two, which?


def test_a_graph_routing_on_a_random_number_gets_replay_divergence_naming_the_agent(tiny_tokenizer):
    engine, _ = scripted_engine(graph_config("coin_graph"), lambda req: "ANSWER: 5", tiny_tokenizer)
    random.seed(0)
    episodes = engine.rollout(TASKS[:1], 8, seed=0)[0].episodes
    out = engine.execute([ReplayRequest(f"r{i}", ep, freeze_upto=1) for i, ep in enumerate(episodes)], seed=0)
    errors = [out[f"r{i}"][0].error for i in range(8) if out[f"r{i}"][0].status == "error"]
    assert errors, "a coin flip diverges on some replay"
    for e in errors:
        assert e.startswith("ReplayDivergence: turn 0: the team asked for agent") and ("'lead'" in e or "'helper'" in e)


def test_the_model_outside_an_episode_and_invoke_in_an_async_node_say_what_to_do():
    with pytest.raises(NotInEpisodeError, match="outside a mas episode"):
        MasChatModel(agent="lead").invoke("hi")
    with pytest.raises(NotInEpisodeError):
        asyncio.run(MasChatModel(agent="lead").ainvoke("hi"))


@pytest.mark.parametrize("builder,extra,path,needle", [
    ("nothing_here", {}, "topology.builder", "has no attribute 'nothing_here'"),
    ("unknown_agent_graph", {}, "topology.builder", "names agent 'ghost', which is not in agents"),
    ("two_nodes", {"answer_key": "result"}, "topology.answer_key", "not a key of the graph's state"),
    ("two_nodes", {"input_key": "query"}, "topology.input_key", "not a key of the graph's state"),
])
def test_langgraph_config_errors_name_the_yaml_path(builder, extra, path, needle):
    with pytest.raises(ConfigError) as info:
        validate_config(graph_config(builder, **extra), check=meaning_errors)
    assert any(line.startswith(path + ":") and needle in line for line in info.value.lines), info.value.lines


def test_the_builder_graph_trains_two_steps_with_c3_and_its_replay_tree_runs(tiny_model_dir, tmp_path):
    from mas.training.trainer import train

    cfg = graph_config("two_nodes", str(tiny_model_dir), recursion_limit=8)
    cfg["policies"]["judge"]["kind"] = "full"
    cfg["credit"] = {"method": "c3", "fanout": [2, 3]}
    cfg["trainer"] = {**cfg["trainer"], "steps": 2, "group_size": 2}
    team = build_team(validate_config(cfg))
    team.engine.score = lambda ep: float(sum(t.completion_ids[0] for t in ep.turns if t.completion_ids) % 2)  # every turn counts
    before = {n: copy.deepcopy(p.model.state_dict()) for n, p in team.policies.items()}
    seen = []

    class Record:
        def on_step_end(self, step, metrics, groups, credit):
            seen.append((metrics, credit.breakdown, groups))

    train(team, tmp_path / "run", callbacks=[Record()])
    assert len(seen) == 2
    for metrics, breakdown, groups in seen:
        episodes = [ep for g in groups for ep in g.episodes]
        assert len(episodes) == 4 and all(len(ep.turns) >= 2 for ep in episodes)
        # the tree: each of the B*G = 4 episodes replayed from its turn 1 (the checker), fanout[1] - 1 = 2 times
        assert metrics["credit_cost"]["replays"] == 4 and metrics["credit_cost"]["extra_generations"] >= 8
        assert int(breakdown["replays"]) == 8 and int(breakdown["replay_failures"]) == 0
        assert set(breakdown["tree_depth"].tolist()) == {0, 1}
        for name in ("main", "judge"):
            assert math.isfinite(metrics["policies"][name]["loss"])
    assert team.engine.stats["replay_episodes"] == 2 * 8
    for name, p in team.policies.items():
        assert any(not v.equal(before[name][k]) for k, v in p.model.state_dict().items()), name


def test_training_a_divergent_graph_warns_with_the_agent_and_turn(tiny_model_dir, tmp_path):
    """Not silent: the failed replays are counted per step and the run's warnings name agent and turn."""
    import json

    from mas.training.trainer import train

    cfg = graph_config("coin_then_check", str(tiny_model_dir))
    cfg["credit"] = {"method": "c3", "fanout": [2, 4]}
    cfg["trainer"] = {**cfg["trainer"], "steps": 1, "batch_size": 2, "group_size": 2}
    team = build_team(validate_config(cfg))
    random.seed(0)
    rows = []
    train(team, tmp_path / "run", callbacks=[type("R", (), {"on_step_end": lambda self, s, m, g, c: rows.append((m, c))})()])
    metrics, credit = rows[0]
    diverged = metrics["credit_cost"]["replay_divergences"]
    assert diverged > 0 and int(credit.breakdown["replay_failures"]) == diverged
    warnings = [json.loads(line) for line in (tmp_path / "run" / "warnings.jsonl").read_text().splitlines()]
    assert [w["kind"] for w in warnings] == ["replay_divergence"] and warnings[0]["step"] == 0
    assert f"{diverged} re-run(s) of the team diverged" in warnings[0]["message"]
    assert "ReplayDivergence: turn 0: the team asked for agent" in warnings[0]["message"]
