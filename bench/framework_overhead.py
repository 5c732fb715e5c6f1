"""Framework overhead: the same solver -> checker team as a built-in chain, an AutoGen round robin
and a user LangGraph graph.

All three run the same scripted agents (``ScriptedBackend``: no model, so only the framework
code is timed) on the same tasks, B x G episodes per rollout, and produce the same turns.  The
numbers are wall seconds per rollout, measured side by side in one process, and each
framework's ratio to the built-in chain: the cost of running AutoGen's agent runtime or the
user's graph (plus the adapters) around every model call.

    python bench/framework_overhead.py [--episodes 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TypedDict

REPO = Path(__file__).parents[1]


class State(TypedDict, total=False):
    question: str
    draft: str
    answer: str


def graph():
    """The chain as a user's LangGraph graph: solver, then checker."""
    from langgraph.graph import END, START, StateGraph

    from mas.topologies.langgraph import MasChatModel

    solver, checker = MasChatModel(agent="solver"), MasChatModel(agent="checker")

    async def solve(state: State) -> dict:
        reply = await solver.ainvoke([("user", f"Task: {state['question']}")])
        return {"draft": reply.content, "answer": reply.content}

    async def check(state: State) -> dict:
        await checker.ainvoke([("user", f"Task: {state['question']}\nsolver: {state['draft']}")])
        return {}

    g = StateGraph(State)
    g.add_node("solve", solve)
    g.add_node("check", check)
    g.add_edge(START, "solve")
    g.add_edge("solve", "check")
    g.add_edge("check", END)
    return g


TOPOLOGIES = {
    "chain (built-in)": {"kind": "chain", "sequence": ["solver", "checker"]},
    "autogen round_robin": {"kind": "autogen", "team": "round_robin", "termination": {"max_messages": 3}},
    "langgraph builder": {"kind": "langgraph", "builder": "framework_overhead:graph"},
}


def engine_for(topology: dict):
    from mas.agents.agent import build_agents
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.config.schema import validate_config
    from mas.rollout.engine import Engine
    from mas.models.tiny import train_tokenizer
    from mas.topologies import build_topology

    cfg = validate_config({
        "team": {"name": "bench"},
        "policies": {"p": {"model": "none"}},
        "agents": [{"name": "solver", "policy": "p", "role": "You solve.", "parser": "answer"},
                   {"name": "checker", "policy": "p", "role": "You check.", "parser": "verdict"}],
        "topology": topology,
        "env": {"name": "synthetic_math"},
        "credit": {"method": "grpo"},
    })
    tok = train_tokenizer(["You solve. You check. Task: 3+4 ANSWER: 7 ACCEPT solver"] * 10, vocab_size=300)
    backend = ScriptedBackend(lambda req: "ANSWER: 7" if req.agent == "solver" else "ACCEPT", {"p": tok})
    return Engine(build_topology(cfg.topology), build_agents(cfg.agents, "bench"), {"p": tok}, {"p": False}, backend,
                  lambda ep: 1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64, help="episodes per rollout (B tasks x 8)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))  # this module's graph() for the langgraph builder
    from mas.types import Task

    tasks = [Task(f"t{i}", f"{i % 9}+{i % 7}", "0") for i in range(max(1, args.episodes // 8))]
    engines = {name: engine_for(topo) for name, topo in TOPOLOGIES.items()}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):  # interleaved, so load changes hit every framework alike
        for name, engine in engines.items():
            t0 = time.perf_counter()
            groups = engine.rollout(tasks, 8, seed=0)
            times[name].append(time.perf_counter() - t0)
            assert all(len(ep.turns) == 2 and ep.status == "ok" for g in groups for ep in g.episodes), name
    base = statistics.median(times["chain (built-in)"])
    n = len(tasks) * 8
    print(f"{n} episodes per rollout (2 scripted turns each), median of {args.repeats} rollouts")
    print(f"{'team':<22} {'s / rollout':>12} {'ms / episode':>13} {'vs chain':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<22} {med:>12.3f} {1000 * med / n:>13.2f} {med / base:>8.2f}x")


if __name__ == "__main__":
    main()
