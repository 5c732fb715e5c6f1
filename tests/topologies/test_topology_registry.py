"""The topology registry: every kind answers every hook, the schema's union is the registry's,
and no module outside ``topologies/`` branches on a topology kind."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

import mas.topologies as topologies
from mas.config.schema import validate_config
from mas.envs import build_env
from mas.topologies import registry
from mas.topologies.registry import HOOKS, Drawing, UnknownTopologyError, get_topology, register_topology, topology_kinds
from mas.topologies.teaching import NoTeacher
from mas.types import Section

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ["orchestrator", "debate", "chain", "graph", "autogen", "langgraph", "openai"]

ARITH = {"name": "synthetic_math", "num_ops": 2, "max_operand": 9, "seed": 0}
TEAMS = {  # one small team of each kind that can be read without user code
    "orchestrator": ({"kind": "orchestrator", "orchestrator": "o", "specialists": ["adder", "subtractor"]},
                     {"o": "orchestrator", "adder": "answer", "subtractor": "answer"}),
    "debate": ({"kind": "debate", "debaters": ["a", "b"], "rounds": 2}, {"a": "answer", "b": "answer"}),
    "chain": ({"kind": "chain", "sequence": ["s", "v"], "loop_to": "s"}, {"s": "answer", "v": "verdict"}),
    "graph": ({"kind": "graph", "entry": "n1", "nodes": [{"name": "n1", "agent": "s"}, {"name": "n2", "agent": "v"}],
               "edges": [{"from": "n1", "to": "n2"}, {"from": "n2", "to": "END"}]}, {"s": "answer", "v": "verdict"}),
    "autogen": ({"kind": "autogen", "team": "round_robin", "termination": {"max_messages": 4}}, {"a": "answer", "b": "answer"}),
    "openai": ({"kind": "openai", "entry": "examples.openai_team:run_team"}, {"solver": "answer", "checker": "verdict"}),
}


def run_config(kind: str):
    topo, parsers = TEAMS[kind]
    return validate_config({
        "team": {"name": kind},
        "policies": {"p": {"kind": "frozen", "model": "embedded"}},
        "agents": [{"name": n, "policy": "p", "role": f"You are {n}.", "parser": parser} for n, parser in parsers.items()],
        "topology": topo, "env": ARITH, "credit": {"method": "grpo"},
    })


def test_builtins_are_registered_in_order():
    assert topology_kinds()[: len(BUILTIN)] == BUILTIN
    assert topologies.build_topology is not None and get_topology("chain").name == "chain"


@pytest.mark.parametrize("name", topology_kinds())
def test_every_kind_defines_every_hook_itself(name):
    """Each hook is written in the kind's own class (none inherited, none missing), so a new hook
    added to HOOKS fails here for every kind that does not answer it yet."""
    kind = get_topology(name)
    own = vars(type(kind))
    assert [h for h in HOOKS if h not in own] == []
    assert kind.config.model_fields["kind"].annotation == Literal[name]


@pytest.mark.parametrize("name", sorted(TEAMS))
def test_every_hook_answers_with_its_type(name):
    cfg = run_config(name)
    kind, topo = get_topology(name), cfg.topology
    agents = kind.agents(topo)
    assert agents is None or set(agents) <= set(cfg.agent_names)
    assert set(kind.last_speakers(topo)) <= set(cfg.agent_names)
    assert kind.last_speaker_note(topo) is None or isinstance(kind.last_speaker_note(topo), str)
    assert kind.main_agent(topo) is None or kind.main_agent(topo) in cfg.agent_names
    assert kind.parts(topo) is None or set(kind.parts(topo)) <= set(cfg.agent_names)
    assert kind.transcript_order(topo) is None or set(kind.transcript_order(topo)) <= set(cfg.agent_names)
    assert isinstance(kind.turn_limit(topo), int) and kind.turn_limit(topo) >= 1
    assert kind.refs(topo, cfg.agent_names) == []
    assert kind.errors(cfg) == [] and kind.protocol_errors(cfg) == [] and kind.warnings(cfg) == []
    d = kind.drawing(cfg)
    assert isinstance(d, Drawing) and d.nodes[0] == registry.START and d.nodes[-1] == registry.END
    assert {e.source for e in d.edges} | {e.target for e in d.edges} <= set(d.nodes)
    assert hasattr(kind.build(topo), "run")
    try:
        teacher = kind.teacher(cfg, {}, lambda: build_env(cfg.env))
    except NoTeacher as e:
        assert str(e)
    else:
        assert callable(teacher)


def test_hooks_give_each_kind_its_own_facts():
    orch, debate, chain, graph = (run_config(k) for k in ("orchestrator", "debate", "chain", "graph"))
    assert get_topology("orchestrator").main_agent(orch.topology) == "o"
    assert get_topology("debate").last_speakers(debate.topology) == ["b"]  # majority vote: the last debater
    assert "majority vote" in get_topology("debate").last_speaker_note(debate.topology)
    assert get_topology("chain").turn_limit(chain.topology) == 2 + 1 * 2  # the sequence, then one loop back to s
    assert get_topology("chain").transcript_order(chain.topology) == ["s", "v"]
    assert get_topology("graph").last_speakers(graph.topology) == ["v"]
    assert get_topology("orchestrator").teacher(orch, {}, lambda: None) is not None


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(UnknownTopologyError, match=r"unknown topology kind 'ring'; valid: \['autogen', 'chain'"):
        get_topology("ring")


def test_a_kind_must_answer_every_hook_and_carry_its_tag(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    class RingConfig(Section):
        kind: Literal["ring"] = Field(description="tag")

    class Ring:
        name = "ring"
        config = RingConfig

    with pytest.raises(TypeError, match=r"does not define \['build', 'agents'"):
        register_topology(Ring)

    class Mistagged(Ring):
        config = type("Bad", (Section,), {"__annotations__": {"kind": Literal["other"]}})

    for hook in HOOKS:
        setattr(Mistagged, hook, lambda *a: None)
    with pytest.raises(TypeError, match=r"must be a pydantic model declaring `kind: Literal\['ring'\]`"):
        register_topology(Mistagged)
    with pytest.raises(ValueError, match="already registered"):
        register_topology(type("Again", (), {"name": "chain"}))


def test_the_schema_union_is_the_registry():
    from mas.config.schema import RunConfig

    union = RunConfig.model_fields["topology"].annotation
    members = [m.model_fields["kind"].annotation.__args__[0] for m in union.__args__]
    assert members == topology_kinds()


# --- nothing outside topologies/ branches on a kind -----------------------------------------

KIND_CLASSES = {"OrchestratorTopology", "DebateTopology", "ChainTopology", "GraphTopology", "AutogenTopology",
                "LangGraphTopology", "GraphNode", "GraphEdge", "AutogenTermination", "OpenAITopology"}


def _offences(path: Path) -> list[str]:
    """Comparisons of a topology kind with a kind's name, isinstance checks against a kind's config
    class, imports of those classes, and mappings keyed by kind names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = set(topology_kinds())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            names += [e.value for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set))
                      for e in c.elts if isinstance(e, ast.Constant)]
            text = ast.unparse(node)
            if "kind" in text and any(n in kinds for n in names):
                out.append(f"{path.name}:{node.lineno}: {text}")
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            hit = [a.name for a in node.names if a.name in KIND_CLASSES]
            if hit:
                out.append(f"{path.name}:{node.lineno}: imports {hit}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            text = ast.unparse(node)
            if any(c in text for c in KIND_CLASSES):
                out.append(f"{path.name}:{node.lineno}: {text}")
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if len(keys) > 1 and sum(k in kinds for k in keys) >= 2:
                out.append(f"{path.name}:{node.lineno}: a mapping keyed by topology kinds")
    return out


def test_no_module_outside_topologies_names_a_kind():
    """A new topology touches no file but its own: nothing outside ``topologies/`` switches on a
    kind's name or its config class (they ask the kind: ``mas.topologies.kind_of``)."""
    files = [p for folder in ("mas", "agents", "credit", "envs") for p in (ROOT / folder).rglob("*.py")]
    found = [o for p in files for o in _offences(p)]
    assert found == []


def test_the_grep_finds_a_branch_on_a_kind(tmp_path):
    """The check above can fail: each pattern it forbids is found."""
    bad = tmp_path / "bad.py"
    bad.write_text(inspect.cleandoc('''
        from mas.topologies.chain import ChainTopology
        def f(cfg):
            if cfg.topology.kind == "chain":
                return 1
            if isinstance(cfg.topology, ChainTopology):
                return 2
            return {"orchestrator": 1, "debate": 2}
    '''))
    assert len(_offences(bad)) == 4
