"""A LangGraph multi-agent network, the way the LangGraph tutorial builds one, made trainable by
mas (examples/langgraph_network.yaml).

The tutorial's network: two ReAct agents (``create_react_agent``), each with its own tools and a
system prompt that says it works with a colleague, pass the work back and forth with
``Command(goto=...)`` until one of them writes FINAL ANSWER, which ends the graph.  Here the
task is an arithmetic expression: a calculator with the ``examples.calculator.calculate`` tool,
and a checker that works the result out again.

What differs from the tutorial's code:
* the chat models: ``MasChatModel(agent=...)``, one per YAML agent, where the tutorial shares one
  ``ChatOpenAI(...)``;
* only each agent's report goes into the shared messages, with its name in the text: the
  tutorial passes on all of an agent's messages (its tool calls too) and names the last one with
  the message's ``name``.  A mas policy sees text through its chat template, which shows neither
  the ``name`` nor whose tool call an earlier AI message was (each would read as its own);
* the one prompt change: the agents are asked for the result as ``ANSWER: <number>``, the env's
  format.  The node that sees FINAL ANSWER puts the latest ``ANSWER: n`` into the state's
  ``answer`` (``topology.answer_key``): that is the team's answer.
"""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command

from examples.calculator import calculate
from mas.agents.parsers import parse_answer
from mas.topologies.langgraph import MasChatModel

STOP = "FINAL ANSWER"


def system_prompt(own_part: str) -> str:
    """The prompt both agents share, with each one's own part at the end."""
    return ("You are an assistant working on the task together with another assistant. Do the part you can with "
            "the tools you have; if you cannot finish it, the other assistant carries on where you stopped. "
            f"When you or the other assistant have the final result, give it as ANSWER: <number> and prefix your reply "
            f"with {STOP} so that the team knows to stop.\n{own_part}")


class State(MessagesState):
    answer: str  # the team's answer (topology.answer_key), set by the node that ends the graph


def build() -> StateGraph:
    calculator = create_react_agent(
        MasChatModel(agent="calculator"), tools=[tool(calculate)],
        prompt=system_prompt("You do the arithmetic with the calculate tool. You work with a checker."))
    checker = create_react_agent(
        MasChatModel(agent="checker"), tools=[],
        prompt=system_prompt("You check the calculator's result by working it out again. You work with a calculator."))

    def agent_node(name: str, agent, colleague: str):
        async def node(state: State) -> Command[Literal["calculator", "checker", "__end__"]]:
            result = await agent.ainvoke({"messages": state["messages"]})
            report = str(result["messages"][-1].content)
            update = {"messages": [HumanMessage(content=f"{name}: {report}", name=name)]}
            if STOP in report:
                update["answer"] = parse_answer(report)[0].get("answer", "")
                return Command(update=update, goto=END)
            return Command(update=update, goto=colleague)
        return node

    graph = StateGraph(State)
    graph.add_node("calculator", agent_node("calculator", calculator, "checker"))
    graph.add_node("checker", agent_node("checker", checker, "calculator"))
    graph.add_edge(START, "calculator")
    return graph
