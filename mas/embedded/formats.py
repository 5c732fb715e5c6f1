"""The warm-start formats: every team the embedded model was taught to speak in.

A format is one team layout: its topology (the real config object, one or more variants),
its agents (name -> role prompt, parser, completion budget), the env its teacher plays, and
the scripted teacher (``teachers.py``).  The warm start runs every format's teacher through
the real engine and topology and trains on the pooled turns, so one model serves all of
them; ``configs/`` ships a team per format that uses exactly these prompts (a test checks
it).  The role prompts are the contract: a team with other prompts runs, but the model has
never seen them, and training warns when it cannot parse what the model writes
(``mas.embedded.fit``).

Adding a format is one entry in ``FORMATS`` (plus its teacher): its episodes then join the
default recipe, whose hash (and so the cache entry) changes with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from mas.envs.math.synthetic import SyntheticMathConfig
from mas.envs.research.facts import FactsConfig
from mas.envs.team import TeamConjunctiveConfig, TeamRelayConfig, TeamSaboteurConfig
from mas.topologies.registry import topology_config

from mas.topologies.teaching import (ChainTeacher, DebateTeacher, GraphTeacher, OrchestratorTeacher, RelayTeacher, FactsTeacher,
                                     SaboteurTeacher)


def _team(**fields: Any) -> Any:
    """A format's topology, written as its YAML section would be."""
    return topology_config(fields)


@dataclass(frozen=True)
class AgentSpec:
    """One warm-started agent: the exact role prompt, the parser that reads it, and the
    completion budget its longest teacher reply needs (configs set max_new_tokens to it)."""

    role: str
    parser: str
    max_new_tokens: int
    tools: tuple[str, ...] = ()  # the env tools it calls (the role says how: a config gives it tools_prompt: false)
    max_tool_calls: int = 0  # its tool calls per invocation

    def spec(self) -> dict[str, Any]:
        """As JSON for the recipe hash; the tool fields only where it has tools (the older formats keep their keys)."""
        from dataclasses import asdict

        return {k: v for k, v in asdict(self).items() if v or k not in ("tools", "max_tool_calls")}


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    configs: tuple[str, ...]  # shipped configs (repository paths) that use exactly these prompts
    agents: Mapping[str, AgentSpec]
    topologies: tuple[Any, ...]  # topology config objects; the teacher's episodes are split among them
    env: Any  # env config the teacher draws training tasks from (its seed is the recipe's); configs use exactly it
    teacher: Callable  # (GenRequest, random.Random) -> str
    episodes: int  # teacher episodes in the default recipe's warm start (0: none; see Recipe.extend)
    min_teacher_reward: float = 1.0  # the teacher's own mean reward; below 1 only where its flaw costs reward
    # A parts team (``topology.parts``): each specialist sees only its own part, so what it was
    # taught does not depend on the team's size.  A config may then run the first k agents of
    # the taught sequence with the env's ``size`` set to k.  (Not in ``spec``: it shapes no transcript.)
    any_size: bool = False
    # The agents whose turns the warm start trains on (None: every agent).  The other agents
    # still play their teacher's part, so the trained turns see the transcripts they will see.
    train_agents: tuple[str, ...] | None = None
    # Env configs the teacher plays instead of ``env``, its episodes split evenly among them: many
    # generated worlds, so that a name it writes is one it has just read, never one it could
    # remember (the research format).  Empty: ``env`` itself.
    worlds: tuple[Any, ...] = ()

    def one_agent(self, agent: str, name: str, description: str, teacher: Callable, episodes: int) -> "Format":
        """This team played by ``teacher``, training on ``agent``'s turns alone: the other agents
        keep what this format taught them, flaws included."""
        return replace(self, name=name, description=description, teacher=teacher, episodes=episodes,
                       train_agents=(agent,))

    @property
    def roles(self) -> dict[str, str]:
        return {name: a.role for name, a in self.agents.items()}

    def spec(self) -> dict[str, Any]:
        """Everything that shapes this format's transcripts, as JSON (part of the recipe hash)."""
        from dataclasses import asdict

        spec = {
            "agents": {n: a.spec() for n, a in self.agents.items()},
            "topologies": [t.model_dump(mode="json", by_alias=True) for t in self.topologies],
            "env": self.env.model_dump(mode="json"),
            "teacher": {type(self.teacher).__name__: asdict(self.teacher)},
            "min_teacher_reward": self.min_teacher_reward,
        }
        if self.train_agents is not None:  # absent otherwise, so the older formats keep their keys
            spec["train_agents"] = list(self.train_agents)
        if self.worlds:  # likewise
            spec["worlds"] = [w.model_dump(mode="json") for w in self.worlds]
        return spec

    @property
    def envs(self) -> tuple[Any, ...]:
        """The env configs the teacher plays (``worlds``, else ``env``)."""
        return self.worlds or (self.env,)


def _agents(**specs: tuple) -> Mapping[str, AgentSpec]:
    return MappingProxyType({name: AgentSpec(*s) for name, s in specs.items()})


_ARITHMETIC = SyntheticMathConfig(name="synthetic_math", num_ops=2, max_operand=9, seed=0)

ORCHESTRATOR = Format(
    name="orchestrator",
    description="an orchestrator delegates each arithmetic step to an adder or a subtractor (the quickstart team)",
    configs=("configs/quickstart.yaml", "configs/cpu_orchestrator.yaml"),
    agents=_agents(
        orchestrator=("You are the orchestrator. Use CALL adder: a+b or CALL subtractor: a-b, then ANSWER: n.", "orchestrator", 12),
        adder=("You are the adder.", "answer", 8),
        subtractor=("You are the subtractor.", "answer", 8),
    ),
    topologies=(_team(kind="orchestrator", orchestrator="orchestrator",
                                     specialists=("adder", "subtractor"), max_turns=6),),
    env=_ARITHMETIC,
    teacher=OrchestratorTeacher(p_direct=0.6),
    episodes=2000,
)

DEBATE = Format(
    name="debate",
    description="three debaters answer for two rounds; a majority vote or a judge gives the team's answer",
    configs=("configs/cpu_debate.yaml",),
    agents=_agents(
        alpha=("You are debater alpha. End with ANSWER: n.", "answer", 24),
        beta=("You are debater beta. End with ANSWER: n.", "answer", 24),
        gamma=("You are debater gamma. End with ANSWER: n.", "answer", 24),
        judge=("You are the judge. Give the debaters' answer: ANSWER: n.", "answer", 8),
    ),
    topologies=(
        _team(kind="debate", debaters=("alpha", "beta", "gamma"), rounds=2, aggregator=None),
        _team(kind="debate", debaters=("alpha", "beta", "gamma"), rounds=2, aggregator="judge"),
    ),
    env=_ARITHMETIC,
    teacher=DebateTeacher(p_direct=0.6),
    episodes=600,
)

CHAIN = Format(
    name="chain",
    description="a solver answers, a verifier accepts or rejects, and a rejected answer goes back to the solver",
    configs=("configs/cpu_chain.yaml",),
    agents=_agents(
        solver=("You are the solver. End with ANSWER: n. If the verifier rejected it, work it out.", "answer", 24),
        verifier=("You are the verifier. Reply ACCEPT or REJECT.", "verdict", 24),
    ),
    topologies=(_team(kind="chain", sequence=("solver", "verifier"), loop_to="solver", max_loops=1),),
    env=_ARITHMETIC,
    teacher=ChainTeacher(p_direct=0.6, p_slip=0.3, p_lazy=0.8),
    episodes=1000,
)

GRAPH = Format(
    name="graph",
    description="a checker sends the task to a worker (one step per visit) until the steps give the answer, then to an answerer",
    configs=("configs/cpu_graph.yaml",),
    agents=_agents(
        checker=("You are the checker. REJECT until the steps give the answer, then ACCEPT.", "verdict", 4),
        worker=("You are the worker. Write the next step as a+b=c.", "raw", 10),
        answerer=("You are the answerer. Give ANSWER: n.", "answer", 8),
    ),
    topologies=(topology_config({
        "kind": "graph", "entry": "check",
        "nodes": [{"name": "check", "agent": "checker"}, {"name": "work", "agent": "worker"},
                  {"name": "answer", "agent": "answerer"}],
        "edges": [{"from": "check", "to": "answer", "when": "accept"}, {"from": "check", "to": "work", "when": "reject"},
                  {"from": "check", "to": "answer"}, {"from": "work", "to": "check"}, {"from": "answer", "to": "END"}],
        "max_turns": 8,
    }),),
    env=_ARITHMETIC,
    teacher=GraphTeacher(p_direct=0.6),
    episodes=800,
)

# The graph's worker alone: the checker always rejects until every step is written, and only
# the worker's turns are trained on, so the checker and the answerer keep what GRAPH taught
# them (the checker's flaw included).  In GRAPH the worker writes steps in 40% of the episodes
# only, and the build it gave miscopied operands ("9-1+3": "8-1=7"), which held cpu_graph to
# +10 points; these 400 episodes (800 worker turns, 4% of the pool) raised it to +59.5
# (docs/benchmarks/embedded_recipe.md, with the other configs and a second build seed).
GRAPH_WORKER = GRAPH.one_agent("worker", "graph_worker", "the graph's worker writes every step (its turns only)",
                               GraphTeacher(p_direct=0.0), episodes=400)

CONJUNCTIVE = Format(
    name="team_conjunctive",
    description="two specialists each see and solve only their own part; right only if both parts are",
    configs=("configs/team_conjunctive.yaml",),
    agents=_agents(
        left=("You solve part A. End with ANSWER: n.", "answer", 24),
        right=("You solve part B. End with ANSWER: n.", "answer", 24),
    ),
    topologies=(_team(kind="chain", sequence=("left", "right"), parts=True),),
    env=TeamConjunctiveConfig(name="team_conjunctive"),
    teacher=RelayTeacher(p_direct=0.2),
    episodes=800,
)

# One role for every specialist and every team size: taught on the largest shipped team
# (N = 8, 800 turns, about the turns the conjunctive reporter no longer takes), run at any N.
_RELAY_ROLE = ("You solve your part. End with ANSWER: n.", "answer", 24)
_RELAY_AGENTS = tuple(f"s{k}" for k in range(1, 9))

RELAY = Format(
    name="team_relay",
    description="N specialists each see and solve only their own part; right only if every part is (any N up to 8)",
    configs=("configs/team_relay_n2.yaml", "configs/team_relay_n4.yaml", "configs/team_relay_n8.yaml"),
    agents=_agents(**dict.fromkeys(_RELAY_AGENTS, _RELAY_ROLE)),
    topologies=(_team(kind="chain", sequence=_RELAY_AGENTS, parts=True),),
    env=TeamRelayConfig(name="team_relay", size=len(_RELAY_AGENTS)),
    teacher=RelayTeacher(p_direct=0.2),
    episodes=100,
    any_size=True,
)

SABOTEUR = Format(
    name="team_saboteur",
    description="a solver answers; a reviewer accepts or overrules it, and its overruling answers are wrong",
    configs=("configs/team_saboteur.yaml",),
    agents=_agents(
        solver=("You solve the task. End with ANSWER: n.", "answer", 24),
        reviewer=("You are the reviewer. Reply ACCEPT, or REJECT and ANSWER: n.", "verdict", 10),
    ),
    topologies=(_team(kind="chain", sequence=("solver", "reviewer")),),
    env=TeamSaboteurConfig(name="team_saboteur"),
    teacher=SaboteurTeacher(p_direct=0.6, p_overrule=0.6),
    episodes=800,
    min_teacher_reward=0.3,  # the reviewer's overrules fail 60% of the episodes by design
)

# The saboteur's solver alone, every answer worked out; only the solver's turns are trained, so
# the reviewer keeps its designed flaw.  Taught in the recipe's second stage (``Recipe.extend``,
# episodes=0 keeps it out of the pooled warm start): on the one-stage build the solver's worked
# answers were right 88% of the time, which held team_saboteur to +61.5; the second stage took
# it to +69.0 and moved the other configs by 0.5 to 7 points (docs/benchmarks/embedded_recipe.md).  In the
# pooled warm start the same turns reshuffled every other format's start by tens of points.
SABOTEUR_SOLVER = SABOTEUR.one_agent("solver", "saboteur_solver", "the saboteur team's solver works every answer out (its turns only)",
                                     SaboteurTeacher(p_direct=0.0, p_overrule=0.6), episodes=0)

# cpu_facts's team: a researcher with BM25 search and read over a generated world, then an
# answerer (envs/research/facts.py).  The 0.22M model does not copy a name it has not seen into a
# tool call unless it is taught on thousands of fresh names (docs/benchmarks/research_stage.md: copying appears
# after about 2,500 steps of first calls with a new name each, never on one world's 400 names),
# so the teacher plays FACTS_WORLDS, 40 worlds of other corpus seeds with 499 training chains
# each: every person and organisation it copies is one of about 20,000.  None of them is a
# person or an organisation of cpu_facts's own world (corpus seed 0), training or held out (a
# test checks).  The teacher keeps the config warm-up's flaws (p_direct, p_detour), so the
# greedy researcher replies after the first search and RL has the second hop to find.  Taught
# in the recipe's research stage (``Recipe.research``), at the episodes' own lengths (up to
# about 1,160 tokens: the researcher's invocation is one sequence), not in the pooled warm start.
_FACTS_ENV = FactsConfig(name="facts", corpus_seed=0, num_train=400, num_eval=100, num_cities=16, seed=0, reward="em",
                         search_k=1, max_k=3, snippet_chars=60, read_chars=200)
FACTS_WORLD_SEEDS = tuple(range(1000, 1040))
FACTS_WORLDS = tuple(_FACTS_ENV.model_copy(update={"corpus_seed": s, "num_train": 499, "num_eval": 1})
                     for s in FACTS_WORLD_SEEDS)

FACTS = Format(
    name="facts",
    description="a researcher searches and reads generated paragraphs in two hops; an answerer gives the city",
    configs=(),  # configs/cpu_facts.yaml once the recipe's research stage teaches this format
    agents=_agents(
        researcher=('You are the researcher. Call <tool_call>{"name": "search", "arguments": {"query": q}}</tool_call> '
                    'or read with {"title": t}.', "raw", 96, ("search", "read"), 4),
        answerer=("You are the answerer. Reply ANSWER: city.", "answer", 16),
    ),
    topologies=(_team(kind="chain", sequence=("researcher", "answerer")),),
    env=_FACTS_ENV,
    worlds=FACTS_WORLDS,
    teacher=FactsTeacher(p_direct=0.6, p_detour=0.3),
    episodes=0,
    min_teacher_reward=0.3,  # the replies after one search (p_direct) give the birthplace, always wrong
)

# The same team on the whole path every time (no reply after one search, no unneeded search),
# for a research stage (``--recipe research.facts_path=N``).  With FACTS's flaws only 40% of a
# stage's episodes read, and 4,000 steps taught the first call's copy alone (30% of held-out
# people); those weights trained further on the whole path copied every name within 3,000 steps.
# A stage of this format alone, from the two-stage model, did not: 5,000 steps copied 1 held-out
# person in 40 (docs/benchmarks/research_stage.md, "The embedded build's research stage").  cpu_facts's own
# warm-up teaches FACTS's flaws either way, so RL has the second hop to find.
FACTS_PATH = replace(FACTS, name="facts_path", description="the facts team's researcher takes the whole path every time",
                     teacher=FactsTeacher(p_direct=0.0, p_detour=0.0), min_teacher_reward=0.9)

FORMATS: Mapping[str, Format] = MappingProxyType({f.name: f for f in (ORCHESTRATOR, DEBATE, CHAIN, GRAPH, CONJUNCTIVE, SABOTEUR,
                                                                       RELAY, GRAPH_WORKER, SABOTEUR_SOLVER, FACTS, FACTS_PATH)})
