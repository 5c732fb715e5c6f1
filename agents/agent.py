"""An Agent: a name, a role prompt, sampling parameters, an output parser and the policy it uses.

Agents hold no weights.  Several agents may name the same policy and differ only by role.
An agent with tools gets their signatures and the tool-call format appended to its role
prompt (``agents.tools.tools_prompt``), so the prompt always matches what the parser reads;
``tools_prompt: false`` leaves the role as written (it then has to say how to call them).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Callable

from mas.agents.parsers import PARSERS, Parsed
from mas.tools import ToolSpec, tools_prompt
from mas.config.schema import AgentConfig, SamplingConfig


@dataclass(frozen=True)
class Agent:
    name: str
    policy: str
    role: str  # the system prompt, placeholders already filled
    sampling: SamplingConfig
    parse: Callable[[str], Parsed]
    tools: tuple[str, ...] = ()  # names of the env tools it may call
    max_tool_calls: int = 0  # tool calls per invocation (0 without tools)

    def messages(self, user: str, history: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
        """System role prompt, then any earlier exchange, then the new user message."""
        return [{"role": "system", "content": self.role}, *(history or []), {"role": "user", "content": user}]


def build_agent(cfg: AgentConfig, team: str, tools: Mapping[str, ToolSpec] | None = None) -> Agent:
    """``tools``: the env's tools by name; the agent's ``cfg.tools`` must all be among them."""
    role = cfg.role.replace("{name}", cfg.name).replace("{team}", team)
    if cfg.tools:
        missing = [t for t in cfg.tools if t not in (tools or {})]
        if missing:
            raise ValueError(f"agent {cfg.name!r}: the env offers no tool(s) {missing}; valid: {sorted(tools or {})}")
        if cfg.tools_prompt:
            role = f"{role}\n\n{tools_prompt([tools[t] for t in cfg.tools], cfg.max_tool_calls)}"
    return Agent(name=cfg.name, policy=cfg.policy, role=role, sampling=cfg.sampling, parse=PARSERS[cfg.parser],
                 tools=tuple(cfg.tools), max_tool_calls=cfg.max_tool_calls if cfg.tools else 0)


def build_agents(agents: tuple[AgentConfig, ...], team: str, tools: Mapping[str, ToolSpec] | None = None) -> dict[str, Agent]:
    return {a.name: build_agent(a, team, tools) for a in agents}
