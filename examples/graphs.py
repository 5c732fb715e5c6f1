"""An ordinary LangGraph graph, made trainable by mas (configs/langgraph_custom.yaml).

A solver answers; a checker reads the answer and says ACCEPT or REJECT; a REJECT sends the
task back to the solver once.  The only mas-specific lines are the chat models: where the
graph had ``ChatOpenAI(model=...)`` it has ``MasChatModel(agent=...)``, one per YAML agent.
Routing reads only the state the nodes wrote from the messages, so replays are faithful.
"""

from __future__ import annotations

import re
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from mas.topologies.langgraph import MasChatModel


class State(TypedDict, total=False):
    question: str  # the task's prompt (topology.input_key)
    draft: str  # the solver's latest reply
    verdict: str  # the checker's latest reply
    answer: str  # the team's answer (topology.answer_key)
    tries: int  # solver turns so far


def _answer(text: str) -> str:
    m = re.search(r"ANSWER\s*:\s*(\S+)", text)
    return m.group(1) if m else text.strip()


def build() -> StateGraph:
    solver = MasChatModel(agent="solver")
    checker = MasChatModel(agent="checker")

    async def solve(state: State) -> dict:
        reply = await solver.ainvoke([("user", state["question"])])
        return {"draft": reply.content, "answer": _answer(reply.content), "tries": state.get("tries", 0) + 1}

    async def check(state: State) -> dict:
        reply = await checker.ainvoke([("user", f"{state['question']} = {state['answer']}?")])
        return {"verdict": reply.content}

    def route(state: State) -> str:
        return "solve" if "REJECT" in state["verdict"].upper() and state["tries"] < 2 else END

    graph = StateGraph(State)
    graph.add_node("solve", solve)
    graph.add_node("check", check)
    graph.add_edge(START, "solve")
    graph.add_edge("solve", "check")
    graph.add_conditional_edges("check", route, ["solve", END])
    return graph
