"""Chain: a fixed sequence of agents, e.g. solver -> verifier -> reviser.

Each agent sees the task and every earlier message of the episode.  With ``loop_to``, a
REJECT verdict from ``verdict_from`` (default: the last agent of the sequence), read when
the sequence has run through, sends the episode back to ``loop_to`` (at most ``max_loops``
times), as in the Dr. MAS solver/verifier orchestra; e.g. solver -> verifier -> reviser
with ``verdict_from: verifier, loop_to: solver``.  The team answer
is the most recent parsed answer (a verifier's ACCEPT keeps the solver's answer).

With ``parts`` (a team of specialists, e.g. ``team_relay``), the k-th agent's whole user
message is ``Task: <part k>`` (``task.meta["parts"][k]``): it sees no other agent's message.
The team answer is every agent's answer in sequence order, one word each (an answer's first
word; ``?`` for an agent that gave none), joined by spaces.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph.graph import END, START, StateGraph
from pydantic import Field, model_validator

from mas.topologies.base import CompiledTopology, TeamState, ctx_of, latest_answer, routed, transcript
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.topologies.task_teaching import ResearchTeacher, SolutionChainTeacher, gsm8k_solutions, hotpotqa_facts
from mas.topologies.teaching import ChainTeacher, FactsTeacher, NoTeacher, RelayTeacher, SaboteurTeacher
from mas.types import Section, Task, Turn


class ChainTopology(Section):
    kind: Literal["chain"]
    sequence: tuple[str, ...] = Field(min_length=1, description="Agents in order, e.g. [solver, verifier, reviser].")
    loop_to: str | None = Field(
        None, description="After the sequence, if verdict_from said REJECT, go back to this agent (Dr. MAS solver/verifier loop)."
    )
    verdict_from: str | None = Field(
        None, description="Agent whose latest verdict decides the loop; None = the last agent of the sequence."
    )
    max_loops: int = Field(1, ge=0, description="How many times the loop may be taken.")
    parts: bool = Field(
        False,
        description="Each agent of the sequence gets its own part of the task (task.meta['parts'][k] for the k-th "
        "agent) as its whole user message 'Task: <part>', sees no other agent's message, and the team's answer is "
        "every agent's answer in order, space-separated (a missing answer written as '?'). The env must give as "
        "many parts as the sequence has agents (team_relay: env.size); no loop_to.",
    )

    @model_validator(mode="after")
    def _parts_do_not_loop(self) -> "ChainTopology":
        if self.parts and self.loop_to is not None:
            raise ValueError(f"topology.loop_to ({self.loop_to!r}) cannot be used with topology.parts: true: each agent "
                             "answers its own part once; remove loop_to, or set parts: false")
        return self


def task_part(task: Task, pos: int, agents: int) -> str:
    """Part ``pos`` of a task for a ``parts`` chain of ``agents`` agents; a task without exactly
    that many parts is an error that says so (the config check catches envs that declare theirs)."""
    parts = task.meta.get("parts")
    if not isinstance(parts, list) or len(parts) != agents:
        found = f"{len(parts)} parts" if isinstance(parts, list) else "no meta['parts']"
        raise ValueError(f"topology.parts: task {task.task_id!r} has {found}, but topology.sequence has {agents} agents; "
                         "a parts chain needs an env that splits every task into one part per agent (e.g. team_relay "
                         "with env.size equal to the number of agents)")
    return str(parts[pos])


def part_answer(turn: Turn) -> str:
    """What a turn adds to a parts chain's answer: its answer's first word, or '?' (no answer, or masked)."""
    words = (turn.parsed.get("answer") or "").split()  # masked and removed turns parse to nothing
    return words[0] if words else "?"


def build_chain(cfg: ChainTopology) -> CompiledTopology:
    seq = list(cfg.sequence)

    def make_node(pos: int, name: str):
        async def node(state: TeamState, config) -> dict:
            ctx = ctx_of(config)
            if cfg.parts:  # no earlier message is shown, so none caused this turn: no parent
                user, parent = f"Task: {task_part(ctx.task, pos, len(seq))}", None
            else:
                before = transcript(ctx.episode.turns)
                user, parent = f"Task: {ctx.task.prompt}" + (f"\n{before}" if before else ""), state.get("last")
            turn = await ctx.call(name, ctx.agents[name].messages(user), parent=parent)
            step = state["step"] + (1 if pos == len(seq) - 1 else 0)
            if cfg.parts:
                answers = [*state["parts"], part_answer(turn)]
                return {"last": turn.index, "parts": answers, "answer": " ".join(answers), "step": step}
            return {"last": turn.index, "answer": latest_answer(ctx.episode.turns), "step": step}
        return node

    names = [f"{i}_{a}" for i, a in enumerate(seq)]
    judge = cfg.verdict_from or seq[-1]
    target = names[seq.index(cfg.loop_to)] if cfg.loop_to is not None else None

    def after_last(state: TeamState, config) -> str:
        verdict = next(t for t in reversed(ctx_of(config).episode.turns) if t.agent == judge).parsed.get("verdict")
        loops_done = state["step"] - 1
        return target if verdict == "reject" and loops_done < cfg.max_loops else END

    g = StateGraph(TeamState)
    for i, (node_name, agent) in enumerate(zip(names, seq)):
        if i == len(seq) - 1 and target is not None:
            g.add_node(node_name, routed(make_node(i, agent), after_last), destinations=(target, END))
        else:
            g.add_node(node_name, make_node(i, agent))
    g.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        g.add_edge(a, b)
    if target is None:
        g.add_edge(names[-1], END)
    return CompiledTopology(g.compile(), recursion_limit=len(seq) * (cfg.max_loops + 1) + 10, initial={"parts": []})


def _parts_errors(topo: ChainTopology, env: Any) -> list[Issue]:
    """A ``parts`` chain needs one part per agent: an env that declares its parts per task
    (``num_parts`` on its config: team_relay's ``size``, team_conjunctive's 2) must match."""
    parts = getattr(env, "num_parts", None)  # envs whose tasks are not split into parts declare none
    if parts is None or parts == len(topo.sequence):
        return []
    n, sized = len(topo.sequence), "size" in type(env).model_fields
    source, fix = ("env.size", f"set env.size to {n} or list {parts} agents") if sized else (f"env {env.name!r}", f"list {parts} agents")
    return [(("topology", "sequence"), list(topo.sequence),
             f"topology.parts gives each of these {n} agents one part of the task, but {source} gives {parts} parts "
             f"per task; {fix}")]


@register_topology
class Chain:
    name = "chain"
    config = ChainTopology
    build = staticmethod(build_chain)

    def agents(self, topo: ChainTopology) -> dict[str, str]:
        return dict.fromkeys(topo.sequence, "sequence")

    def last_speakers(self, topo: ChainTopology) -> list[str]:
        return [topo.sequence[-1]]

    def last_speaker_note(self, topo: ChainTopology) -> str | None:
        return None

    def main_agent(self, topo: ChainTopology) -> str | None:
        return None

    def parts(self, topo: ChainTopology) -> tuple[str, ...] | None:
        return topo.sequence if topo.parts else None

    def transcript_order(self, topo: ChainTopology) -> list[str] | None:
        return list(topo.sequence)

    def turn_limit(self, topo: ChainTopology) -> int:  # the sequence, plus each loop back from loop_to to the end
        loop = len(topo.sequence) - topo.sequence.index(topo.loop_to) if topo.loop_to else 0
        return len(topo.sequence) + topo.max_loops * loop

    def refs(self, topo: ChainTopology, names: list[str]) -> list[Issue]:
        errs = registry.unknown_agent_refs(names, ("sequence", topo.sequence))
        for field in ("loop_to", "verdict_from"):
            value = getattr(topo, field)
            if value is not None and value not in topo.sequence:
                errs.append((("topology", field), value, f"not in sequence; valid: {list(topo.sequence)}"))
        return errs

    def errors(self, cfg: Any) -> list[Issue]:
        return []

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        topo = cfg.topology
        if topo.loop_to is not None:
            judge = topo.verdict_from or topo.sequence[-1]
            where = "topology.verdict_from" if topo.verdict_from else "the last agent of topology.sequence"
            return registry.parser_needs(cfg, judge, "reject", f"decides the loop back to topology.loop_to ({where}), so "
                                         "topology.loop_to is never taken unless it says REJECT")
        if topo.parts:
            return _parts_errors(topo, cfg.env)
        return []

    def warnings(self, cfg: Any) -> list[Issue]:
        topo = cfg.topology
        if topo.verdict_from is not None and topo.loop_to is None:
            return [(("topology", "verdict_from"), topo.verdict_from, "has no effect without topology.loop_to")]
        return []

    def drawing(self, cfg: Any) -> Drawing:
        t = cfg.topology
        seq = list(t.sequence)
        edges = [Edge(registry.START, seq[0])] + [Edge(a, b) for a, b in zip(seq, seq[1:])]
        if t.loop_to and t.max_loops:
            judge = t.verdict_from or seq[-1]
            edges.append(Edge(seq[-1], t.loop_to, f"{judge} said REJECT (≤{t.max_loops}×)"))
            edges.append(Edge(seq[-1], registry.END, "ACCEPT / no loops left"))
        else:
            edges.append(Edge(seq[-1], registry.END))
        return Drawing([registry.START, *dict.fromkeys(seq), registry.END], edges, {a: a for a in seq})

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        """Two-agent chains on arithmetic, GSM8K, HotpotQA, the two-hop facts and the saboteur task,
        and parts chains on the team tasks; each teacher keeps a documented weakness for RL to fix."""
        top, env = cfg.topology, cfg.env.name
        p_direct = float(knobs.get("p_direct", 0.6))
        pair = len(top.sequence) == 2
        if env == "synthetic_math" and pair:
            return ChainTeacher(p_direct=p_direct, p_slip=float(knobs.get("p_slip", 0.3)),
                                p_lazy=float(knobs.get("p_lazy", 0.8)), solver=top.sequence[0])
        if env in ("team_conjunctive", "team_relay", "team_fork") and top.parts:
            return RelayTeacher(p_direct=float(knobs.get("p_direct", 0.2)))  # each specialist sees only its own part
        if env == "team_saboteur" and pair:
            return SaboteurTeacher(p_direct=p_direct, p_overrule=float(knobs.get("p_overrule", 0.6)), reviewer=top.sequence[1])
        if env == "gsm8k" and pair:
            return SolutionChainTeacher(solutions=gsm8k_solutions(cfg.env), p_direct=p_direct,
                                        p_slip=float(knobs.get("p_slip", 0.3)), p_lazy=float(knobs.get("p_lazy", 0.8)),
                                        solver=top.sequence[0], verifier=top.sequence[1])
        if env in ("hotpotqa", "facts") and pair:
            researcher = cfg.agent(top.sequence[0])
            if not {"search", "read"} <= set(researcher.tools):
                raise NoTeacher(f"the first agent of the chain, {researcher.name!r}, needs the tools search and read")
            if env == "hotpotqa":
                return ResearchTeacher(questions=hotpotqa_facts(cfg.env), researcher=researcher.name, p_direct=p_direct)
            return FactsTeacher(researcher=researcher.name, p_direct=p_direct, p_detour=float(knobs.get("p_detour", 0.3)))
        raise NoTeacher(f"topology {self.name!r} on env {env!r}")
