"""A topology kind written the way a user writes one: this one file, registered by an entry point.

``kind: pair``: ``first`` answers the task, then ``second`` reads the task and that reply and
gives the team's answer.  It runs against the episode-context protocol alone (``mas.types``):
no LangGraph graph, no module of mas's engine.  ``tests/topologies/test_new_kind.py``
installs it as a plugin and trains, shows and validates a team with it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mas.topologies import Drawing, Edge, register_topology
from mas.topologies.registry import END, START, parser_needs, unknown_agent_refs
from mas.topologies.teaching import NoTeacher
from mas.types import EpisodeContext, Outcome, Section


class PairTopology(Section):
    kind: Literal["pair"]
    first: str = Field(description="Agent that answers the task first.")
    second: str = Field(description="Agent that reads the first answer and gives the team's answer.")


class PairTeam:
    def __init__(self, topo: PairTopology):
        self.topo = topo

    async def run(self, ctx: EpisodeContext) -> Outcome:
        first = await ctx.call(self.topo.first, ctx.agents[self.topo.first].messages(f"Task: {ctx.task.prompt}"))
        user = f"Task: {ctx.task.prompt}\n{self.topo.first}: {first.text.strip()}"
        second = await ctx.call(self.topo.second, ctx.agents[self.topo.second].messages(user), parent=first.index)
        answer = second.parsed.get("answer") or first.parsed.get("answer")
        return Outcome(answer=answer)


@register_topology
class Pair:
    name = "pair"
    config = PairTopology

    def build(self, topo: PairTopology) -> PairTeam:
        return PairTeam(topo)

    def agents(self, topo: PairTopology) -> dict[str, str]:
        return {topo.first: "first", topo.second: "second"}

    def last_speakers(self, topo: PairTopology) -> list[str]:
        return [topo.second]

    def last_speaker_note(self, topo: PairTopology) -> str | None:
        return None

    def main_agent(self, topo: PairTopology) -> str | None:
        return None

    def parts(self, topo: PairTopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: PairTopology) -> list[str] | None:
        return [topo.first, topo.second]

    def turn_limit(self, topo: PairTopology) -> int:
        return 2

    def refs(self, topo: PairTopology, names: list[str]) -> list:
        errs = unknown_agent_refs(names, ("first", topo.first), ("second", topo.second))
        if topo.first == topo.second:
            errs.append((("topology", "second"), topo.second, "the second agent must differ from the first"))
        return errs

    def errors(self, cfg: Any) -> list:
        return []

    def protocol_errors(self, cfg: Any) -> list:
        return parser_needs(cfg, cfg.topology.second, "answer", "gives the team's answer (topology.second)")

    def warnings(self, cfg: Any) -> list:
        return []

    def drawing(self, cfg: Any) -> Drawing:
        t = cfg.topology
        edges = [Edge(START, t.first, "task"), Edge(t.first, t.second, "reply"), Edge(t.second, END, "ANSWER")]
        return Drawing([START, t.first, t.second, END], edges, {t.first: t.first, t.second: t.second})

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        raise NoTeacher("a pair team has no scripted teacher")
