"""A LangGraph supervisor built from scratch, the way the LangGraph multi-agent tutorial builds
one, made trainable by mas (examples/langgraph_supervisor.yaml).

The tutorial's graph: a supervisor node asks its model which worker acts next (or FINISH) and
routes there with ``Command(goto=...)``; each worker is a prebuilt ReAct agent
(``create_react_agent``) with its own tools, whose last message goes back into the shared
messages under the worker's name before control returns to the supervisor.  Here the workers
are a calculator (its tool: ``examples.calculator.calculate``) and a checker.

What differs from the tutorial's code:
* the chat models: ``MasChatModel(agent=...)``, one per YAML agent, where the tutorial has one
  ``ChatOpenAI(...)`` for all;
* the supervisor's choice is structured output, as in the tutorial (``with_structured_output(Router)``):
  a ``MasChatModel`` forces the reply to start as a call of ``Router``, and the policy writes its
  arguments;
* a worker's report carries its name in the text too (``calculator: ...``): the tutorial sets
  the message's ``name``, which a chat template does not show to the model;
* the one prompt change: the workers are asked for ``ANSWER: <number>``, the env's format.
  When the supervisor finishes it puts the latest ``ANSWER: n`` of the workers' reports into
  the state's ``answer`` (``topology.answer_key``): that is the team's answer.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command

from examples.calculator import calculate
from mas.agents.parsers import parse_answer
from mas.topologies.langgraph import MasChatModel

WORKERS = ("calculator", "checker")
OPTIONS = (*WORKERS, "FINISH")

SUPERVISOR = (f"You are a supervisor. You manage a conversation between these workers: {', '.join(WORKERS)}. "
              "Given the user's request, reply with the worker who should act next. Each worker does a task and "
              "reports its result. When the request is done, reply with FINISH.")


class Router(TypedDict):
    """Worker to route to next. If no workers needed, route to FINISH."""

    next: Literal["calculator", "checker", "FINISH"]  # OPTIONS


class State(MessagesState):
    next: str  # where the supervisor sent the work last
    answer: str  # the team's answer (topology.answer_key), set when the supervisor finishes


def latest_answer(messages) -> str:
    for m in reversed(messages):
        parsed, _ = parse_answer(str(m.content))
        if parsed.get("answer"):
            return parsed["answer"]
    return ""


def build() -> StateGraph:
    supervisor_model = MasChatModel(agent="supervisor").with_structured_output(Router)
    calculator = create_react_agent(
        MasChatModel(agent="calculator"), tools=[tool(calculate)],
        prompt="You are the calculator. Work out the arithmetic with the calculate tool. Give the result as ANSWER: <number>.")
    checker = create_react_agent(
        MasChatModel(agent="checker"), tools=[],
        prompt="You are the checker. Check the result the others found by working it out again. "
               "Give the result as ANSWER: <number>.")

    async def supervisor(state: State) -> Command[Literal["calculator", "checker", "__end__"]]:
        response = await supervisor_model.ainvoke([{"role": "system", "content": SUPERVISOR}, *state["messages"]])
        goto = response["next"]
        if goto == "FINISH":
            return Command(goto=END, update={"next": goto, "answer": latest_answer(state["messages"])})
        return Command(goto=goto, update={"next": goto})

    def worker(name: str, agent):
        async def node(state: State) -> Command[Literal["supervisor"]]:
            result = await agent.ainvoke({"messages": state["messages"]})
            report = str(result["messages"][-1].content)
            return Command(update={"messages": [HumanMessage(content=f"{name}: {report}", name=name)]}, goto="supervisor")
        return node

    graph = StateGraph(State)
    graph.add_edge(START, "supervisor")
    graph.add_node("supervisor", supervisor)
    graph.add_node("calculator", worker("calculator", calculator))
    graph.add_node("checker", worker("checker", checker))
    return graph
