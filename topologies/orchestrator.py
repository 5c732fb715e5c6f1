"""Orchestrator + specialists.

The orchestrator reads the task and either delegates with ``CALL <specialist>: <subtask>``
or finishes with ``ANSWER: <answer>``.  A called specialist sees only its subtask; its reply
comes back to the orchestrator as ``<specialist>: <reply>`` in a multi-turn exchange.  An
unparsable reply or an unknown specialist gets a one-line correction instead.  At most
``max_turns`` agent turns are taken; an episode that reaches the bound without an answer is
truncated (answer None).
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph

from mas.config.schema import OrchestratorTopology
from mas.topologies.base import CompiledTopology, TeamState, ctx_of, routed


def build_orchestrator(cfg: OrchestratorTopology) -> CompiledTopology:
    specialists = list(cfg.specialists)
    by_lower = {s.lower(): s for s in specialists}  # models often capitalise names: CALL Adder: ...

    async def orchestrate(state: TeamState, config) -> dict:
        ctx = ctx_of(config)
        if ctx.num_turns >= cfg.max_turns:
            return {"truncated": True, "pending": None}
        history = list(state["history"])
        user = f"Task: {ctx.task.prompt}" if not history else history.pop()["content"]
        agent = ctx.agents[cfg.orchestrator]
        turn = await ctx.call(cfg.orchestrator, agent.messages(user, history), parent=None)
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": turn.text.strip()}]
        p = turn.parsed
        if "call" in p and p["call"].lower() in by_lower:
            callee = by_lower[p["call"].lower()]
            return {"history": history, "last": turn.index, "pending": {"agent": callee, "subtask": p["subtask"], "parent": turn.index}}
        if "answer" in p and turn.valid:
            return {"history": history, "last": turn.index, "answer": p["answer"], "pending": None}
        hint = (f"Unknown agent {p['call']!r}; you can call {', '.join(specialists)}." if "call" in p
                else f"Reply with CALL <agent>: <subtask> (agents: {', '.join(specialists)}) or ANSWER: <answer>.")
        return {"history": history + [{"role": "user", "content": hint}], "last": turn.index, "pending": None}

    async def specialist(state: TeamState, config) -> dict:
        ctx = ctx_of(config)
        job = state["pending"]
        if ctx.num_turns >= cfg.max_turns:
            return {"truncated": True, "pending": None}
        agent = ctx.agents[job["agent"]]
        turn = await ctx.call(job["agent"], agent.messages(job["subtask"]), parent=job["parent"])
        reply = turn.text.strip() if turn.finish_reason != "removed" else "(no reply)"
        return {"history": state["history"] + [{"role": "user", "content": f"{job['agent']}: {reply}"}],
                "last": turn.index, "pending": None}

    def after_orchestrator(state: TeamState, config) -> str:
        if state.get("truncated") or state.get("answer") is not None:
            return END
        return "specialist" if state.get("pending") else "orchestrator"

    def after_specialist(state: TeamState, config) -> str:
        return END if state.get("truncated") else "orchestrator"

    g = StateGraph(TeamState)
    g.add_node("orchestrator", routed(orchestrate, after_orchestrator), destinations=("orchestrator", "specialist", END))
    g.add_node("specialist", routed(specialist, after_specialist), destinations=("orchestrator", END))
    g.add_edge(START, "orchestrator")
    return CompiledTopology(g.compile(), recursion_limit=4 * cfg.max_turns + 10)
