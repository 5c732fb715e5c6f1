"""A generator and an evaluator in a loop, written with LangGraph and ``langchain_openai.ChatOpenAI``
as LangGraph's "workflows and agents" guide writes its evaluator-optimizer workflow.

One node generates an answer (taking the evaluator's feedback into account on a second try), the
other grades it; a conditional edge ends the graph when the grade is good and sends it back to the
generator otherwise.

What differs from the docs (examples/README.md): each node has its own ``ChatOpenAI`` whose
``model`` is the YAML agent's name, with ``base_url`` and ``api_key`` from mas (``max_retries=0``: a
retried request would be a second turn); the generator's prompts ask for ``ANSWER: <number>``, the
env's answer format, and the grade is ``correct`` or ``incorrect`` (the guide's ``funny`` or ``not
funny``).  The evaluator's grade is structured output, as in the guide (``with_structured_output``:
the endpoint serves its ``response_format``, the reply forced to start as JSON).  One more, where a
mas policy differs from a hosted model: the loop stops after ``MAX_ATTEMPTS`` answers, so an
untrained evaluator that never grades an answer correct ends the episode instead of running into
LangGraph's recursion limit.

Trained with mas: ``configs/openai_langgraph_evaluator.yaml`` (``kind: openai``).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, Field

MAX_ATTEMPTS = 2


class State(TypedDict, total=False):
    task: str
    answer: str
    feedback: str
    correct_or_not: str
    attempts: int


class Feedback(BaseModel):
    """The evaluator's grade: structured output."""

    grade: Literal["correct", "incorrect"] = Field(description="Decide if the answer is correct or not.")
    feedback: str = Field(description="If the answer is not correct, say how to fix it.")


def build_workflow(base_url: str, api_key: str):
    llm = ChatOpenAI(model="generator", base_url=base_url, api_key=api_key, max_retries=0)
    evaluator = ChatOpenAI(model="evaluator", base_url=base_url, api_key=api_key,
                           max_retries=0).with_structured_output(Feedback)

    def llm_call_generator(state: State):
        """The generator answers, with the evaluator's feedback if there is any."""
        if state.get("feedback"):
            msg = llm.invoke(f"Solve {state['task']} but take into account the feedback: {state['feedback']}\n"
                             "Reply with ANSWER: <number>.")
        else:
            msg = llm.invoke(f"Solve {state['task']}. Reply with ANSWER: <number>.")
        return {"answer": msg.content, "attempts": state.get("attempts", 0) + 1}

    def llm_call_evaluator(state: State):
        """The evaluator grades the answer."""
        grade = evaluator.invoke(f"Grade the answer to {state['task']}.\ngenerator: {state['answer']}")
        return {"correct_or_not": grade.grade, "feedback": grade.feedback}

    def route_answer(state: State):
        """Back to the generator with the feedback, or end."""
        if state["correct_or_not"] == "correct" or state["attempts"] >= MAX_ATTEMPTS:
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
