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

from langgraph.graph import END, START, StateGraph

from mas.config.schema import ChainTopology
from mas.topologies.base import CompiledTopology, TeamState, ctx_of, latest_answer, routed, transcript
from mas.types import Task, Turn


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
