"""Debate: N debaters answer in parallel for R rounds, then an aggregator or a majority vote.

Round 1: each debater sees the question.  Round r > 1: each also sees the other debaters'
answers from round r-1.  The debaters of one round are called concurrently, with turn
indices fixed by their order in the config, so replays line up.  With no aggregator the
team answer is the most common parsed answer of the last round, equal numbers (18, 18.00, $18)
counting as one answer as the math verifier reads them (``envs/math/verify.py``; ties: the
earliest debater).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from langgraph.graph import END, START, StateGraph

from mas.config.schema import DebateTopology
from mas.envs.math.verify import answer_key
from mas.topologies.base import CompiledTopology, TeamState, ctx_of, routed, visible


def _round_prompt(question: str, others: list[tuple[str, str]]) -> str:
    if not others:
        return f"Question: {question}"
    lines = "\n".join(f"- {name}: {text}" for name, text in others)
    return f"Question: {question}\nOther answers from the previous round:\n{lines}\nGive your answer."


def build_debate(cfg: DebateTopology) -> CompiledTopology:
    debaters = list(cfg.debaters)

    async def debate_round(state: TeamState, config) -> dict:
        ctx = ctx_of(config)
        r = state["step"]
        prev = [t for t in visible(ctx.episode.turns) if t.agent in debaters and t.parsed.get("round") == r - 1] if r else []
        indices = ctx.reserve(len(debaters))
        calls = []
        for name, idx in zip(debaters, indices):
            others = [(t.agent, t.text.strip()) for t in sorted(prev, key=lambda t: t.index) if t.agent != name]
            calls.append(ctx.call(name, ctx.agents[name].messages(_round_prompt(ctx.task.prompt, others)), index=idx))
        turns = await asyncio.gather(*calls)
        for t in turns:
            t.parsed["round"] = r
        return {"step": r + 1, "last": turns[-1].index}

    async def aggregate(state: TeamState, config) -> dict:
        ctx = ctx_of(config)
        last = sorted((t for t in visible(ctx.episode.turns) if t.parsed.get("round") == cfg.rounds - 1), key=lambda t: t.index)
        if cfg.aggregator is not None:
            lines = "\n".join(f"- {t.agent}: {t.text.strip()}" for t in last)
            msg = f"Question: {ctx.task.prompt}\nDebaters' final answers:\n{lines}\nGive the team's answer."
            turn = await ctx.call(cfg.aggregator, ctx.agents[cfg.aggregator].messages(msg))
            return {"answer": turn.parsed.get("answer"), "last": turn.index}
        votes = [t.parsed["answer"] for t in last if t.parsed.get("answer")]
        if not votes:
            return {"answer": None}
        keys = [answer_key(v) for v in votes]  # "18", "18.00" and "$18" are one vote
        counts = Counter(keys)
        best = max(counts.values())
        return {"answer": next(v for v, k in zip(votes, keys) if counts[k] == best)}

    def next_round(state: TeamState, config) -> str:
        return "round" if state["step"] < cfg.rounds else "aggregate"

    g = StateGraph(TeamState)
    g.add_node("round", routed(debate_round, next_round), destinations=("round", "aggregate"))
    g.add_node("aggregate", aggregate)
    g.add_edge(START, "round")
    g.add_edge("aggregate", END)
    return CompiledTopology(g.compile(), recursion_limit=2 * cfg.rounds + 10)
