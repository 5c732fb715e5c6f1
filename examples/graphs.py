"""An ordinary LangGraph graph, made trainable by mas (configs/langgraph_custom.yaml).

A solver answers; a checker reads the answer and says ACCEPT or REJECT; a REJECT sends the
task back to the solver once.  The only mas-specific lines are the chat models: where the
graph had ``ChatOpenAI(model=...)`` it has ``MasChatModel(agent=...)``, one per YAML agent.
Routing reads only the state the nodes wrote from the messages, so replays are faithful.

``build`` speaks the embedded model's terse format; ``build_smol`` (configs/smol_langgraph.yaml)
is the same graph for a real instruct model: the answer and the verdict are read with mas's
parsers (which accept ``**ANSWER:** 7.``, ``Answer: 7`` and the like), the checker is told what
it checks, and a rejected solver sees its first answer and the checker's reply.
"""

from __future__ import annotations

import re
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from mas.agents.parsers import parse_answer, parse_verdict
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


def solve_check_graph(solve, check, route) -> StateGraph:
    """START -> solve -> check, then back to solve or END as ``route`` says."""
    graph = StateGraph(State)
    graph.add_node("solve", solve)
    graph.add_node("check", check)
    graph.add_edge(START, "solve")
    graph.add_edge("solve", "check")
    graph.add_conditional_edges("check", route, ["solve", END])
    return graph


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

    return solve_check_graph(solve, check, route)


def build_smol() -> StateGraph:
    solver = MasChatModel(agent="solver")
    checker = MasChatModel(agent="checker")

    async def solve(state: State) -> dict:
        messages = [("user", state["question"])]
        if state.get("verdict"):  # a second try: its first answer and the checker's reply
            messages += [("assistant", state["draft"]), ("user", f"The checker said: {state['verdict']}\nSolve it again.")]
        reply = await solver.ainvoke(messages)
        parsed, _ = parse_answer(reply.content)
        return {"draft": reply.content, "answer": parsed.get("answer", ""), "tries": state.get("tries", 0) + 1}

    async def check(state: State) -> dict:
        reply = await checker.ainvoke([("user", f"Task: {state['question']}\nProposed answer: {state['answer'] or '(none)'}")])
        return {"verdict": reply.content}

    def route(state: State) -> str:
        rejected = parse_verdict(state["verdict"])[0].get("verdict") == "reject"
        return "solve" if rejected and state["tries"] < 2 else END

    return solve_check_graph(solve, check, route)
