"""Registry of topology kinds: each kind is one module that registers itself and owns every fact about itself.

    @register_topology
    class Chain:
        name = "chain"
        config = ChainTopology          # a Section with ``kind: Literal["chain"]``
        def build(self, topo): ...      # -> a Topology (``mas.types``) that runs one episode
        ...                             # and every hook of ``HOOKS``

The config schema's ``topology`` section is ``topology_config_union()``, the discriminated union
of the registered kinds' configs, and every caller that needs a fact about a team's topology
asks its kind (``kind_of(topo)``) instead of branching on its name: which agents it uses, who
may end an episode, what ``mas show`` draws, its config errors, its main agent, its bound on
turns, the scripted teacher of its warm-up.  Adding a topology is one module plus its
registration; ``tests/topologies/test_topology_registry.py`` checks that every kind answers
every hook.

Hooks (``topo``: the kind's own config; ``cfg``: the validated run config, for facts that
read the agents or the env as well).  Each returns plain data, so that the layers above
render it:

* ``build(topo) -> Topology``
* ``agents(topo) -> dict[str, str] | None``: agent -> the topology field that uses it; None
  when the team is code whose agents cannot be read from the config (a factory, a builder)
* ``last_speakers(topo) -> list[str]``: agents that can take an episode's last turn, where the
  topology makes that plain ([] where it does not)
* ``last_speaker_note(topo) -> str | None``: why, where one agent is last by construction
* ``main_agent(topo) -> str | None``: the agent that delegates to the others (M-GRPO's main agent)
* ``parts(topo) -> tuple[str, ...] | None``: the agents that each answer one part of the task,
  in order, for a team of specialists; None otherwise
* ``transcript_order(topo) -> list[str] | None``: the agents in the order they speak where each
  reads every earlier reply (a chain); None where no agent hears a fixed set of others
* ``turn_limit(topo) -> int``: most turns (model calls) one episode can take
* ``refs(topo, agent_names) -> list[Issue]``: agents the topology names must exist (schema time)
* ``errors(cfg) -> list[Issue]``: the topology's structure (a graph's edges, a framework team's
  code); may import the user's code
* ``protocol_errors(cfg) -> list[Issue]``: once the structure is sound, agents whose parsers
  cannot do their job in it
* ``warnings(cfg) -> list[Issue]``: a team that runs, but probably not as meant
* ``drawing(cfg) -> Drawing``: the nodes and edges ``mas show`` draws
* ``teacher(cfg, knobs, demo_env) -> Teacher``: the scripted teacher of the warm-up, ``demo_env()``
  building the env its tasks come from (``NoTeacher`` with
  the reason when there is none for this team)

A kind may also set ``packages``: the top-level modules it runs on beyond mas's own
dependencies (AutoGen's, from an extra); where one is missing, ``mas validate`` says what
installs it and ``mas train`` refuses to start (``mas.config.checks.package_issues``).  None by
default.  And ``reply_needs(cfg) -> [(agent, what, text, effect)]``: texts an agent's reply must
hold whole for the team's protocol (a handoff call, a speaker's name), which ``mas validate``
measures against the agent's reply budget (``mas.training.context_plan``).  For the memory plan
(``mas.learning.memory_plan``): ``heard_tokens(cfg) -> {agent: tokens}``, what an agent's later
turns add to its prompt beyond the context check's bound, ``simultaneous(cfg) -> [agents]``,
agents that ask in one model call of an episode (a debate's round), and ``side_processes(cfg) ->
str | None``, the team's own memory the plan cannot size, in words: the processes it runs beside the
training process (``kind: openai``'s ``processes: N``), or what its framework loads in this one as
it first runs; the plan names it but does not add it to this process's peak.

An ``Issue`` is ``(yaml path, value found, message)``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import Field

from mas.agents.parsers import PARSER_LABELS, parsers_giving

Issue = tuple[tuple, Any, str]
START, END = "START", "END"

HOOKS = ("build", "agents", "last_speakers", "last_speaker_note", "main_agent", "parts", "transcript_order",
         "turn_limit", "refs", "errors", "protocol_errors", "warnings", "drawing", "teacher")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    label: str = ""


@dataclass(frozen=True)
class Drawing:
    """What ``mas show`` draws of a team: nodes in a readable order (START first, END last),
    labelled edges, and the agent each node is (where that can be read).  ``bound``: the turn
    bound in words ("at most 6 turns"), "" for none; ``note``: what a picture of a team defined
    in code cannot show, "" for a team the config describes whole."""

    nodes: list[str]
    edges: list[Edge]
    agent_of: dict[str, str]
    bound: str = ""
    note: str = ""


class UnknownTopologyError(KeyError):
    """An unknown topology kind; the message lists the valid kinds."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


_REGISTRY: dict[str, Any] = {}


def register_topology(kind: type) -> type:
    """Class decorator: register the topology kind ``kind`` (an instance is kept).  It must name
    itself (``name``), carry its config class (``config``, a pydantic model declaring ``kind:
    Literal[name]``) and define every hook of ``HOOKS``.  Registering a name twice is a ValueError."""
    name = getattr(kind, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"topology kind {kind!r} must set `name` to its kind's name")
    if name in _REGISTRY:
        raise ValueError(f"topology kind {name!r} is already registered (by {type(_REGISTRY[name]).__module__})")
    config = getattr(kind, "config", None)
    field_ = getattr(config, "model_fields", {}).get("kind")
    if field_ is None or typing.get_origin(field_.annotation) is not Literal or typing.get_args(field_.annotation) != (name,):
        raise TypeError(f"topology kind {name!r}: its config {getattr(config, '__name__', config)!r} must be a pydantic "
                        f"model declaring `kind: Literal[{name!r}]`")
    missing = [h for h in HOOKS if not callable(getattr(kind, h, None))]
    if missing:
        raise TypeError(f"topology kind {name!r} does not define {missing} (every kind answers every hook: "
                        f"topologies/registry.py)")
    _REGISTRY[name] = kind()
    return kind


def topology_kinds() -> list[str]:
    """Registered kinds, in registration order (built-ins first)."""
    return list(_REGISTRY)


def get_topology(name: str) -> Any:
    """The registered kind called ``name``; ``UnknownTopologyError`` listing the valid kinds otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTopologyError(f"unknown topology kind {name!r}; valid: {sorted(_REGISTRY)}") from None


def kind_of(topo: Any) -> Any:
    """The kind of a topology config."""
    return get_topology(topo.kind)


def topology_config_union() -> Any:
    """The discriminated union (on ``kind``) of every registered kind's config, for the run config."""
    configs = tuple(k.config for k in _REGISTRY.values())
    return Annotated[Union[configs], Field(discriminator="kind")]  # type: ignore[valid-type]


def topology_config(data: dict[str, Any]) -> Any:
    """A topology config from data (``{"kind": ..., ...}`` as in YAML), validated by its kind's config class."""
    return get_topology(data.get("kind", "")).config.model_validate(data)


# --- helpers the kinds share ---------------------------------------------------------------


def unknown_agent_refs(names: list[str], *fields: tuple[str, Any]) -> list[Issue]:
    """An issue for each agent name a topology field gives that is not an agent of the team:
    ``fields`` are (field, value) with value a name, None (unset) or a sequence of names."""
    errs: list[Issue] = []
    for name, value in fields:
        values = [(None, value)] if value is None or isinstance(value, str) else list(enumerate(value))
        for i, v in values:
            if v is not None and v not in names:
                errs.append((("topology", name) if i is None else ("topology", name, i), v, f"unknown agent; valid: {names}"))
    return errs


def parser_needs(cfg: Any, agent: str, label: str, job: str) -> list[Issue]:
    """An issue when ``agent``'s parser never gives ``label`` (one of ``PARSER_LABELS``), which
    its ``job`` in the topology needs; nothing for an unknown agent (the reference checks say
    so) or a parser whose labels are not known."""
    index = {a.name: i for i, a in enumerate(cfg.agents)}
    if agent not in index:
        return []
    parser = cfg.agents[index[agent]].parser
    labels = PARSER_LABELS.get(parser)
    if labels is None or label in labels:
        return []
    return [(("agents", index[agent], "parser"), parser,
             f"agent {agent!r} {job}, but parser {parser!r} never gives {label.upper()}; valid: {parsers_giving(label)}")]

