"""Orchestrator + specialists.

The orchestrator reads the task and either delegates with ``CALL <specialist>: <subtask>``
or finishes with ``ANSWER: <answer>``.  A called specialist sees only its subtask; its reply
comes back to the orchestrator as ``<specialist>: <reply>`` in a multi-turn exchange.  An
unparsable reply or an unknown specialist gets a one-line correction instead.  At most
``max_turns`` agent turns are taken; an episode that reaches the bound without an answer is
truncated (answer None).
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.graph import END, START, StateGraph
from pydantic import Field

from mas.topologies.base import CompiledTopology, TeamState, ctx_of, routed
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.topologies.teaching import NoTeacher, OrchestratorTeacher, renamed, specialists_by_op
from mas.types import Section


class OrchestratorTopology(Section):
    kind: Literal["orchestrator"]
    orchestrator: str = Field(description="Agent that delegates and gives the final answer.")
    specialists: tuple[str, ...] = Field(min_length=1, description="Agents the orchestrator may call by name.")
    max_turns: int = Field(6, ge=1, description="Upper bound on agent turns per episode (all agents).")


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


@register_topology
class Orchestrator:
    name = "orchestrator"
    config = OrchestratorTopology
    build = staticmethod(build_orchestrator)

    def agents(self, topo: OrchestratorTopology) -> dict[str, str]:
        used = {topo.orchestrator: "orchestrator"}
        used.update({s: "specialists" for s in topo.specialists if s not in used})
        return used

    def last_speakers(self, topo: OrchestratorTopology) -> list[str]:
        return [topo.orchestrator]

    def last_speaker_note(self, topo: OrchestratorTopology) -> str | None:
        return None

    def main_agent(self, topo: OrchestratorTopology) -> str | None:
        return topo.orchestrator

    def parts(self, topo: OrchestratorTopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: OrchestratorTopology) -> list[str] | None:
        return None

    def turn_limit(self, topo: OrchestratorTopology) -> int:
        return topo.max_turns

    def refs(self, topo: OrchestratorTopology, names: list[str]) -> list[Issue]:
        errs = registry.unknown_agent_refs(names, ("orchestrator", topo.orchestrator))
        if topo.orchestrator in topo.specialists:
            errs.append((("topology", "specialists"), list(topo.specialists), "the orchestrator cannot be its own specialist"))
        return errs + registry.unknown_agent_refs(names, ("specialists", topo.specialists))

    def errors(self, cfg: Any) -> list[Issue]:
        return []

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        return registry.parser_needs(cfg, cfg.topology.orchestrator, "call", "is topology.orchestrator and must delegate "
                                     "with CALL <agent>: <subtask> (without it no specialist is ever called)")

    def warnings(self, cfg: Any) -> list[Issue]:
        return []

    def drawing(self, cfg: Any) -> Drawing:
        t = cfg.topology
        o = t.orchestrator
        edges = [Edge(registry.START, o)]
        for s in t.specialists:
            edges += [Edge(o, s, "CALL"), Edge(s, o, "reply")]
        edges.append(Edge(o, registry.END, "ANSWER"))
        nodes = [registry.START, o, *t.specialists, registry.END]
        return Drawing(nodes, edges, {n: n for n in nodes[1:-1]}, bound=f"at most {t.max_turns} turns")

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        if cfg.env.name != "synthetic_math":
            raise NoTeacher(f"topology {self.name!r} on env {cfg.env.name!r}")
        t = cfg.topology
        teacher = OrchestratorTeacher(p_direct=float(knobs.get("p_direct", 0.6)), specialist_for=specialists_by_op(t.specialists))
        return renamed(teacher, {t.orchestrator: "orchestrator"})
