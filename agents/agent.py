"""An Agent: a name, a role prompt, sampling parameters, an output parser and the policy it uses.

Agents hold no weights.  Several agents may name the same policy and differ only by role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mas.agents.parsers import PARSERS, Parsed
from mas.config import AgentConfig, SamplingConfig


@dataclass(frozen=True)
class Agent:
    name: str
    policy: str
    role: str  # the system prompt, placeholders already filled
    sampling: SamplingConfig
    parse: Callable[[str], Parsed]

    def messages(self, user: str, history: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
        """System role prompt, then any earlier exchange, then the new user message."""
        return [{"role": "system", "content": self.role}, *(history or []), {"role": "user", "content": user}]


def build_agent(cfg: AgentConfig, team: str) -> Agent:
    role = cfg.role.replace("{name}", cfg.name).replace("{team}", team)
    return Agent(name=cfg.name, policy=cfg.policy, role=role, sampling=cfg.sampling, parse=PARSERS[cfg.parser])


def build_agents(agents: tuple[AgentConfig, ...], team: str) -> dict[str, Agent]:
    return {a.name: build_agent(a, team) for a in agents}
