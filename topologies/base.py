"""Shared pieces of the topologies: graph state, context access and message formatting.

Every topology compiles to a LangGraph ``StateGraph`` whose nodes are async functions
``node(state, config)``.  The per-episode ``EpisodeContext`` travels in
``config["configurable"]["ctx"]``, so one compiled graph serves every episode.

A node that chooses its successor returns a LangGraph ``Command`` (its state update and
where to go, ``routed``) instead of leaving the choice to a conditional edge: LangGraph runs
a conditional edge's function as one more traced runnable per turn, and that step was a
sizeable part of the framework's per-turn cost.  The graph, its supersteps and its drawing
(the node's ``destinations``) stay the same.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypedDict

from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from mas.types import EpisodeContext, Outcome
from mas.types import Turn


class TeamState(TypedDict, total=False):
    answer: str | None  # the team's current answer
    truncated: bool  # a turn bound ended the episode
    last: int | None  # index of the latest turn
    step: int  # topology-specific counter (round, loop, position)
    visits: int  # turns taken so far (graph topology)
    history: list[dict[str, str]]  # orchestrator's own multi-turn exchange
    pending: dict[str, Any] | None  # orchestrator's delegation awaiting a specialist
    node: str  # graph topology: the key of the edge the last node took (its conditional-edge map)
    parts: list[str]  # chain with parts: each part's answer so far, in sequence order ('?' for none)


def ctx_of(config: dict) -> EpisodeContext:
    return config["configurable"]["ctx"]


Node = Callable[[TeamState, dict], Awaitable[dict]]


def routed(node: Node, route: Callable[[TeamState, dict], str]) -> Callable[[TeamState, dict], Awaitable[Command]]:
    """``node``, followed by ``route`` on the state as the node leaves it, as one LangGraph node.

    ``route(state, config)`` names the next node (or END) exactly as a conditional edge after
    ``node`` would: it sees the state with the node's update applied (every TeamState key is a
    plain last-value channel, so that is ``{**state, **update}``).  Register the result with
    ``add_node(name, routed(...), destinations=...)`` so that drawings show the same edges.
    """

    async def run(state: TeamState, config) -> Command:
        update = await node(state, config)
        return Command(update=update, goto=route({**state, **update}, config))

    return run


def visible(turns: list[Turn]) -> list[Turn]:
    """Turns other agents can read: removed turns leave no message."""
    return [t for t in turns if t.finish_reason != "removed"]


def shown(turn: Turn) -> str:
    """What the team reads of a turn: its text, then the results of its tool calls (if any)."""
    results = "".join(f"\n<tool_response>\n{obs}\n</tool_response>" for obs in turn.observations)
    return turn.text.strip() + results


def transcript(turns: list[Turn]) -> str:
    """``agent: text`` lines of the turns visible to the team, in turn order (tool results included)."""
    return "\n".join(f"{t.agent}: {shown(t)}" for t in visible(sorted(turns, key=lambda t: t.index)))


def latest_answer(turns: list[Turn]) -> str | None:
    """The most recent parsed answer in the episode (verdict-only turns keep the previous one)."""
    for t in sorted(turns, key=lambda t: t.index, reverse=True):
        if t.finish_reason != "removed" and t.parsed.get("answer"):
            return t.parsed["answer"]
    return None


class CompiledTopology:
    """Runs a compiled StateGraph for one episode and reads the outcome from its final state."""

    def __init__(self, graph: CompiledStateGraph, recursion_limit: int, initial: dict[str, Any] | None = None):
        self.graph = graph
        self.recursion_limit = recursion_limit
        self.initial = {"answer": None, "truncated": False, "last": None, "step": 0, "visits": 0,
                        "history": [], "pending": None, **(initial or {})}

    async def run(self, ctx: EpisodeContext) -> Outcome:
        state = await self.graph.ainvoke(
            dict(self.initial),
            config={"configurable": {"ctx": ctx}, "recursion_limit": self.recursion_limit},
        )
        return Outcome(answer=state.get("answer"), truncated=bool(state.get("truncated")))
