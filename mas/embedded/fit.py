"""Does a team suit the embedded model?  A warning after the first evaluation or step.

The embedded model speaks only the formats it was warm-started on (``formats.py``).  A team
with other prompts or another layout runs, but its agents' replies usually do not parse, so
it scores 0 and learns nothing, quietly.  ``EmbeddedFitCheck`` is a training callback: at the
first held-out evaluation (or, without one, after step 0) it reads each agent's parse rate,
and for every agent on an embedded policy whose replies parsed less than ``PARSE_THRESHOLD``
of the time it warns (terminal and ``warnings.jsonl``, which the report shows) with what the
model was warm-started on and what to do: use a hub model, or those prompts.
"""

from __future__ import annotations

from typing import Any, Callable

from .formats import FORMATS, Format

PARSE_THRESHOLD = 0.5  # a warm-started agent parses > 90% of its turns; a foreign one about 0%



def primary_format(kind: str) -> Format | None:
    """The format whose prompts to suggest for a team of topology ``kind``: the first one warm-started
    in that kind of topology (None: the embedded model never saw one)."""
    return next((f for f in FORMATS.values() if any(t.kind == kind for t in f.topologies)), None)


def embedded_agents(cfg: Any) -> list[Any]:
    """The agent configs of ``cfg`` whose policy is the embedded model."""
    return [a for a in cfg.agents if cfg.policies[a.policy].model == "embedded"]


def article(word: str) -> str:
    """'an' before a vowel sound ("an orchestrator", "an autogen"), else 'a'."""
    return "an" if word[:1].lower() in "aeio" else "a"


def _role_owner(role: str) -> tuple[Format, str] | None:
    for fmt in FORMATS.values():
        for name, spec in fmt.agents.items():
            if spec.role == role:
                return fmt, name
    return None


def _prompts(fmt: Format) -> str:
    return f"{fmt.configs[0]}'s prompts: " + "; ".join(f"{n}: {a.role!r} ({a.parser} parser)" for n, a in fmt.agents.items())


def fit_warnings(cfg: Any, counts: dict[str, tuple[int, int]], when: str) -> list[str]:
    """One message per embedded agent whose turns mostly failed to parse.

    ``counts``: agent -> (turns, turns that did not parse), as measured ``when`` (e.g. "the
    first evaluation").  Agents without turns are not judged.
    """
    kind = cfg.topology.kind
    configs = ", ".join(dict.fromkeys(c for f in FORMATS.values() for c in f.configs))  # a one-agent format repeats its team's
    out = []
    for agent in embedded_agents(cfg):
        turns, failed = counts.get(agent.name, (0, 0))
        if turns == 0 or 1 - failed / turns >= PARSE_THRESHOLD:
            continue
        head = (f"the embedded model parsed {1 - failed / turns:.0%} of {agent.name}'s turns ({agent.parser} parser, "
                f"{kind} topology) in {when}")
        owner = _role_owner(agent.role)
        if owner is not None:
            fmt, name = owner
            spec = fmt.agents[name]
            if spec.parser != agent.parser:
                why = f"its role is {fmt.configs[0]}'s {name} prompt, which was warm-started with the {spec.parser} parser"
            elif kind not in {t.kind for t in fmt.topologies}:
                why = f"its role is {fmt.configs[0]}'s {name} prompt, which was warm-started in {article(fmt.topologies[0].kind)} {fmt.topologies[0].kind} topology"
            else:
                why = (f"its role is {fmt.configs[0]}'s {name} prompt; the rest of the team differs from that config, or "
                       f"sampling.max_new_tokens is below the {spec.max_new_tokens} it needs")
            out.append(f"{head}; {why}; use a hub model, or the team of {fmt.configs[0]}")
            continue
        suggestion = primary_format(kind)
        hint = _prompts(suggestion) if suggestion else f"the prompts of those configs"
        out.append(f"{head}; it was warm-started only on the teams of {configs}, and this role is none of theirs; "
                   f"use a hub model (policies.{agent.policy}.model), or these prompts: {hint}")
    return out


class EmbeddedFitCheck:
    """Training callback: runs ``fit_warnings`` once, at the first evaluation or after step 0."""

    def __init__(self, cfg: Any, warn: Callable[..., None]):
        self.cfg = cfg
        self.warn = warn  # RunLogger.warn(message, kind, step)
        self.done = False

    def _check(self, agents: dict[str, dict], when: str, step: int | None) -> None:
        if self.done:
            return
        self.done = True
        counts = {name: (int(m["turns"]), int(m["parse_failures"])) for name, m in agents.items()}
        for message in fit_warnings(self.cfg, counts, when):
            self.warn(message, kind="embedded_format", step=step)

    def on_eval(self, name: str, metrics: dict) -> None:
        if name == "before":
            self._check(metrics.get("agents", {}), "the held-out evaluation before training", None)

    def on_step_end(self, step: int, metrics: dict, groups: list, credit: Any) -> None:
        if step == 0:
            self._check(metrics["agents"], "training step 0", step)


def fit_checks(cfg: Any, warn: Callable[..., None]) -> list[EmbeddedFitCheck]:
    """The callbacks a run on ``cfg`` needs: one check if any agent uses the embedded model."""
    return [EmbeddedFitCheck(cfg, warn)] if embedded_agents(cfg) else []
