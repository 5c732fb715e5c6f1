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

from typing import Any, Literal

from langgraph.graph import END, START, StateGraph
from pydantic import Field

from mas.envs.math.verify import answer_key
from mas.topologies.base import CompiledTopology, TeamState, ctx_of, routed, visible
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.topologies.teaching import DebateTeacher, NoTeacher
from mas.types import Section


class DebateTopology(Section):
    kind: Literal["debate"]
    debaters: tuple[str, ...] = Field(min_length=2, description="Agents that answer in parallel each round.")
    rounds: int = Field(2, ge=1, description="Rounds; from round 2 each debater sees the others' previous answers.")
    aggregator: str | None = Field(None, description="Agent that reads the last round and answers; None = majority vote.")


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


@register_topology
class Debate:
    name = "debate"
    config = DebateTopology
    build = staticmethod(build_debate)

    def agents(self, topo: DebateTopology) -> dict[str, str]:
        used = dict.fromkeys(topo.debaters, "debaters")
        if topo.aggregator is not None:
            used.setdefault(topo.aggregator, "aggregator")
        return used

    def last_speakers(self, topo: DebateTopology) -> list[str]:
        return [topo.aggregator or topo.debaters[-1]]

    def last_speaker_note(self, topo: DebateTopology) -> str | None:
        if topo.aggregator is not None:
            return None
        return f"in this debate (majority vote) debater {topo.debaters[-1]!r} speaks last in every episode"

    def main_agent(self, topo: DebateTopology) -> str | None:
        return None

    def parts(self, topo: DebateTopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: DebateTopology) -> list[str] | None:
        return None

    def turn_limit(self, topo: DebateTopology) -> int:
        return topo.rounds * len(topo.debaters) + (1 if topo.aggregator else 0)

    def refs(self, topo: DebateTopology, names: list[str]) -> list[Issue]:
        return registry.unknown_agent_refs(names, ("debaters", topo.debaters), ("aggregator", topo.aggregator))

    def errors(self, cfg: Any) -> list[Issue]:
        return []

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        return []

    def warnings(self, cfg: Any) -> list[Issue]:
        return []

    def drawing(self, cfg: Any) -> Drawing:
        t = cfg.topology
        edges = [Edge(registry.START, d) for d in t.debaters]
        if t.rounds > 1:
            later = "round 2" if t.rounds == 2 else f"rounds 2..{t.rounds}"
            edges += [Edge(d, d, f"{later}: reads the others") for d in t.debaters]
        final = t.aggregator or "majority vote"
        edges += [Edge(d, final, f"round {t.rounds} answers") for d in t.debaters]
        edges.append(Edge(final, registry.END, "ANSWER"))
        agent_of = {d: d for d in t.debaters}
        if t.aggregator:
            agent_of[t.aggregator] = t.aggregator
        return Drawing([registry.START, *t.debaters, final, registry.END], edges, agent_of)

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        if cfg.env.name != "synthetic_math":
            raise NoTeacher(f"topology {self.name!r} on env {cfg.env.name!r}")
        return DebateTeacher(p_direct=float(knobs.get("p_direct", 0.6)), judge=cfg.topology.aggregator or "")

    # optional hooks (mas.learning.memory_plan): what the plan of a run's memory needs of the kind

    LINE_TOKENS = 8  # a round's prompt: the name and marks around each earlier answer it shows
    FRAME_TOKENS = 16  # ... and the lines around them ("Other answers from the previous round:", ...)

    def heard_tokens(self, cfg: Any) -> dict[str, int]:
        """Tokens a debater's later rounds add to its prompt: the other debaters' previous answers
        (the context check's bound counts no agent of a non-chain topology as hearing another)."""
        t = cfg.topology
        if t.rounds < 2:
            return {}
        replies = {d: cfg.agent(d).sampling.max_new_tokens for d in t.debaters}
        return {d: self.FRAME_TOKENS + sum(n + self.LINE_TOKENS for o, n in replies.items() if o != d) for d in t.debaters}

    def simultaneous(self, cfg: Any) -> list[tuple[str, ...]]:
        """Agents that ask in the same model call of an episode: a round's debaters."""
        return [tuple(cfg.topology.debaters)]
