"""A generator and an evaluator in a loop, written with LangGraph and ``langchain_openai.ChatOpenAI``
as LangGraph's "workflows and agents" guide writes its evaluator-optimizer workflow.

One node generates an answer (taking the evaluator's feedback into account on a second try), the
other grades it; a conditional edge ends the graph when the grade is good and sends it back to the
generator otherwise.

What differs from the docs (examples/README.md): each node has its own ``ChatOpenAI`` whose
``model`` is the YAML agent's name, with ``base_url`` and ``api_key`` from mas (``max_retries=0``: a
retried request would be a second turn); the prompts ask for ``ANSWER: <number>``, the env's
answer format.  Two more, where a mas policy differs from a hosted model:
- the grade is read from the evaluator's text (``ACCEPT`` or ``REJECT``), where the guide uses
  ``with_structured_output``: the endpoint serves it (``response_format``), but the warm-up's
  framework teacher writes no JSON, so it could not show the evaluator a graded reply;
- the loop stops after ``MAX_ATTEMPTS`` answers, so an untrained evaluator that never accepts
  ends the episode instead of running into LangGraph's recursion limit.

Trained with mas: ``configs/openai_langgraph_evaluator.yaml`` (``kind: openai``).
"""

from __future__ import annotations

from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

MAX_ATTEMPTS = 2


class State(TypedDict, total=False):
    task: str
    answer: str
    feedback: str
    grade: str
    attempts: int


def build_workflow(base_url: str, api_key: str):
    generator = ChatOpenAI(model="generator", base_url=base_url, api_key=api_key, max_retries=0)
    evaluator = ChatOpenAI(model="evaluator", base_url=base_url, api_key=api_key, max_retries=0)

    def llm_call_generator(state: State):
        """The generator answers, with the evaluator's feedback if there is any."""
        if state.get("feedback"):
            msg = generator.invoke(f"Solve {state['task']} but take into account the feedback: {state['feedback']}\n"
                                   "Reply with ANSWER: <number>.")
        else:
            msg = generator.invoke(f"Solve {state['task']}. Reply with ANSWER: <number>.")
        return {"answer": msg.content, "attempts": state.get("attempts", 0) + 1}

    def llm_call_evaluator(state: State):
        """The evaluator grades the answer: ACCEPT, or REJECT with feedback."""
        msg = evaluator.invoke(f"Grade the answer to {state['task']}.\ngenerator: {state['answer']}\n"
                               "Reply with ACCEPT if it is right, else REJECT and what to fix.")
        return {"grade": "accept" if "ACCEPT" in msg.content else "reject", "feedback": msg.content}

    def route_answer(state: State):
        """Back to the generator with the feedback, or end."""
        if state["grade"] == "accept" or state["attempts"] >= MAX_ATTEMPTS:
            return "Accepted"
        return "Rejected + Feedback"

    builder = StateGraph(State)
    builder.add_node("llm_call_generator", llm_call_generator)
    builder.add_node("llm_call_evaluator", llm_call_evaluator)
    builder.add_edge(START, "llm_call_generator")
    builder.add_edge("llm_call_generator", "llm_call_evaluator")
    builder.add_conditional_edges("llm_call_evaluator", route_answer,
                                  {"Accepted": END, "Rejected + Feedback": "llm_call_generator"})
    return builder.compile()


def run_team(task: str, base_url: str, api_key: str) -> str:
    workflow = build_workflow(base_url, api_key)
    state = workflow.invoke({"task": task})
    return state["answer"]
