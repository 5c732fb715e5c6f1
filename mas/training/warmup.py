"""The format warm-up: a short supervised stage on demonstrations of the team's protocol, before RL.

RL cannot start from zero reward.  A small real model (SmolLM2-135M-Instruct) asked to
orchestrate writes prose instead of ``CALL adder: 3+4``, and nothing it does parses, so every
episode scores 0 and every advantage is 0.  ``trainer.warmup`` fine-tunes each trainable
policy for a few steps on demonstrations of its agents' turns, in the team's own messages and
the model's own chat template, so that RL starts from a team that follows the protocol.

Where demonstrations come from (``WarmupConfig``):

* the team's **scripted teacher**: the teachers the embedded model is warm-started on
  (``mas.embedded.teachers``), generalised to the team's own agent names and played through the
  real engine and topology with the team's own role prompts and tokenizers, so every
  demonstration is exactly a turn the team would produce.  Each teacher teaches the protocol
  but keeps a deliberate weakness (``p_direct``: answering at once instead of delegating or
  working it out) for RL to fix;
* or a JSONL file the user supplies (``{agent, messages, completion}`` per line).

The warm-up never sees a held-out task: the teacher plays training tasks from a task stream of
its own (the env's training split, seeded apart from the run's stream, which stays untouched).
It is recorded in the run as its own phase: its steps, losses and time, and the held-out
accuracy after it (``summary["warmup"]``, ``{"eval": "warmup"}`` in metrics.jsonl).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mas.agents.parsers import parse_answer
from mas.agents.prompts import render_prompt
from mas.agents.tools import calls_spent, tool_call_text
from mas.rollout.backends.base import GenRequest
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import (AutogenTopology, ChainTopology, ConfigError, DebateTopology, LangGraphTopology, OrchestratorTopology,
                        RunConfig)
from mas.embedded.teachers import (ChainTeacher, DebateTeacher, FactsTeacher, OrchestratorTeacher, RelayTeacher,
                                   SaboteurTeacher, chain_steps, slipped)
from mas.rollout.engine import Engine
from mas.envs import build_env
from mas.envs.math.verify import gsm8k_final_answer, numbers_match, read_number
from mas.training.framework_teacher import framework_teacher
from mas.training.memory import release_freed_memory
from mas.training.sft import Demonstration
from mas.topologies import build_topology

Teacher = Callable[[GenRequest, random.Random], str]
DEMO_STREAM = 1_000_003  # the teacher's task stream: the env's seed plus this (training split, apart from the run's)
OPS = {"+": ("add", "plus", "sum"), "-": ("sub", "minus", "diff")}  # how a specialist's name says what it does


def scripted_teacher(cfg: RunConfig, knobs: dict[str, float]) -> Teacher:
    """The scripted teacher of ``cfg``'s team, with its agents' own names; a ``ConfigError`` naming
    ``trainer.warmup.demonstrations`` when the team has none (another layout, another task).

    Teams and their teachers (each keeps a deliberate, documented weakness for RL to fix):

    * arithmetic (``synthetic_math``): orchestrator, debate and solver/verifier chain teams, the
      embedded model's teachers (``mas.embedded.teachers``) under the team's agent names; the
      AutoGen selector team (``SelectorTeacher``); a LangGraph graph of one answering and one
      verdict agent, on ``synthetic_math`` or a custom task set of arithmetic expressions
      (``ChainTeacher`` on the task read from the framework's messages, ``FrameworkChainTeacher``);
    * GSM8K solver/verifier chains: the training problem's own worked solution (``SolutionChainTeacher``);
    * HotpotQA researcher (search, read) -> answerer chains (``ResearchTeacher``);
    * researcher (search, read) -> answerer chains on the generated two-hop facts (``FactsTeacher``, the embedded
      model's research teacher, which copies every name from what it has read);
    * the team tasks of ``envs/team`` (conjunctive and relay as parts chains, saboteur);
    * any other AutoGen or LangGraph team, on any env: the generic ``FrameworkTeacher``
      (``mas/training/framework_teacher.py``), which reads each request from the messages the
      framework built (who routes, who hands off, who answers); weakness ``p_skip``/``p_slip``.
    """
    top, env = cfg.topology, getattr(cfg.env, "name", None)
    p_direct = float(knobs.get("p_direct", 0.6))

    def unsupported(why: str) -> ConfigError:
        return ConfigError("config", [f"trainer.warmup: no scripted teacher for this team ({why}); give "
                                      "trainer.warmup.demonstrations, a JSONL file of {agent, messages, completion}"])

    def routes(specialists: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        out = []
        for op, words in OPS.items():
            name = next((s for s in specialists if any(w in s.lower() for w in words)), None)
            if name is None:
                raise unsupported(f"no specialist named for {op!r} among {list(specialists)}")
            out.append((op, name))
        return tuple(out)

    if env == "synthetic_math" and isinstance(top, OrchestratorTopology):
        teacher = OrchestratorTeacher(p_direct=p_direct, specialist_for=routes(top.specialists))
        return _renamed(teacher, {top.orchestrator: "orchestrator"})
    if env == "synthetic_math" and isinstance(top, DebateTopology):
        return DebateTeacher(p_direct=p_direct, judge=top.aggregator or "")
    if env == "synthetic_math" and isinstance(top, ChainTopology) and len(top.sequence) == 2:
        return ChainTeacher(p_direct=p_direct, p_slip=float(knobs.get("p_slip", 0.3)),
                            p_lazy=float(knobs.get("p_lazy", 0.8)), solver=top.sequence[0])
    if env in ("team_conjunctive", "team_relay", "team_fork") and isinstance(top, ChainTopology) and top.parts:
        return RelayTeacher(p_direct=float(knobs.get("p_direct", 0.2)))  # each specialist sees only its own part
    if env == "team_saboteur" and isinstance(top, ChainTopology) and len(top.sequence) == 2:
        return SaboteurTeacher(p_direct=p_direct, p_overrule=float(knobs.get("p_overrule", 0.6)), reviewer=top.sequence[1])
    if env == "gsm8k" and isinstance(top, ChainTopology) and len(top.sequence) == 2:
        return SolutionChainTeacher(solutions=gsm8k_solutions(cfg.env), p_direct=p_direct, p_slip=float(knobs.get("p_slip", 0.3)),
                                    p_lazy=float(knobs.get("p_lazy", 0.8)), solver=top.sequence[0], verifier=top.sequence[1])
    if env == "hotpotqa" and isinstance(top, ChainTopology) and len(top.sequence) == 2:
        researcher = cfg.agent(top.sequence[0])
        if not {"search", "read"} <= set(researcher.tools):
            raise unsupported(f"the first agent of the chain, {researcher.name!r}, needs the tools search and read")
        return ResearchTeacher(questions=hotpotqa_facts(cfg.env), researcher=researcher.name, p_direct=p_direct)
    if env == "facts" and isinstance(top, ChainTopology) and len(top.sequence) == 2:
        researcher = cfg.agent(top.sequence[0])
        if not {"search", "read"} <= set(researcher.tools):
            raise unsupported(f"the first agent of the chain, {researcher.name!r}, needs the tools search and read")
        return FactsTeacher(researcher=researcher.name, p_direct=p_direct, p_detour=float(knobs.get("p_detour", 0.3)))
    if isinstance(top, AutogenTopology) and top.team == "selector" and env == "synthetic_math":
        specialists = top.participants or tuple(a.name for a in cfg.agents if a.name != top.selector)
        if _fits(lambda: routes(specialists)):  # else the generic teacher below
            return SelectorTeacher(selector=top.selector or "", specialist_for=routes(specialists),
                                   p_misroute=float(knobs.get("p_misroute", 0.4)))
    by_parser = {p: [a.name for a in cfg.agents if a.parser == p] for p in ("answer", "verdict")}
    # a solver/checker graph on arithmetic; any other framework team gets the generic teacher below
    if (isinstance(top, LangGraphTopology) and env in ("synthetic_math", "custom") and len(cfg.agents) == 2
            and all(len(names) == 1 for names in by_parser.values())
            and (env != "custom" or _fits(lambda: _check_arithmetic(build_env(cfg.env), unsupported)))):
        solver, checker = by_parser["answer"][0], by_parser["verdict"][0]
        chain = ChainTeacher(p_direct=p_direct, p_slip=float(knobs.get("p_slip", 0.3)), p_lazy=float(knobs.get("p_lazy", 0.8)),
                             solver=solver)
        return FrameworkChainTeacher(chain, solver=solver, checker=checker)
    if isinstance(top, (AutogenTopology, LangGraphTopology)):  # any other framework team: the generic teacher
        return framework_teacher(cfg, build_env(demo_env_config(cfg)), knobs)
    raise unsupported(f"topology {top.kind!r} on env {env!r}")


def _fits(check: Callable[[], Any]) -> bool:
    """Whether a specific teacher's requirement holds (``check`` raises ``ConfigError`` when it does not)."""
    try:
        check()
    except ConfigError:
        return False
    return True


def _renamed(teacher: Teacher, names: dict[str, str]) -> Teacher:
    """``teacher`` asked as if the agents had the names it was written for (e.g. the team's
    orchestrator under whatever name the YAML gives it)."""
    if all(a == b for a, b in names.items()):
        return teacher
    return lambda req, rng: teacher(dataclasses.replace(req, agent=names.get(req.agent, req.agent)), rng)


# ---------------------------------------------------------------------------------------------
# teachers of the real-model teams (configs/smol_*.yaml): where the task sits in their messages
# ---------------------------------------------------------------------------------------------

# an arithmetic chain such as 8-5 or 3 + 4 - 2, not inside a word or a decimal; linear: the runs of
# digits and of blanks are separated by the operator
_EXPRESSION = re.compile(r"(?<![\w.])-?\d+(?:[ \t]*[-+][ \t]*\d+)+(?![\w.])")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _key(text: str) -> str:
    """A question as a lookup key: whitespace collapsed (a topology may re-wrap it)."""
    return " ".join(text.split())


def arithmetic_task(messages: list[dict[str, str]]) -> str:
    """The arithmetic expression a framework's messages pose (``8-5``), spaces removed.

    Frameworks put the task in their own places: an AutoGen participant gets it as the user
    message itself, the AutoGen selector inside its prompt's history as a ``user: 8-5`` line, a
    LangGraph node wherever the graph's code writes it.  The system message (the agent's role,
    which may hold worked examples) is skipped; a ``user: `` line wins over other text (an
    AutoGen history also quotes the agents); otherwise the first expression of the first user
    message that has one.  ValueError when there is none.
    """
    users = [m["content"] for m in messages if m.get("role") == "user"]
    tagged = [line.removeprefix("user: ") for text in users for line in text.splitlines() if line.startswith("user: ")]
    for text in tagged + users:
        m = _EXPRESSION.search(text)
        if m is not None:
            return re.sub(r"\s+", "", m.group(0))
    raise ValueError(f"the teacher found no arithmetic task in the messages {[u[:80] for u in users]}")


def claimed_answer(text: str, task: str) -> str | None:
    """The answer a message proposes for ``task``: the last number written after the task
    (``5-2 = 3?``, ``Task: 5-2 / Proposed answer: 3``), or None."""
    compact = re.sub(r"[ \t]+", "", text)
    at = compact.find(task)
    numbers = _NUMBER.findall(compact[at + len(task):] if at >= 0 else "")
    return numbers[-1] if numbers else None


def chain_transcript(text: str, agents: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """A chain topology's user message split into the task and the earlier turns: ``Task: <task>``,
    then ``<agent>: <text>`` lines; a turn's text may run over several lines (a worked solution,
    tool results) until the next line that starts with an agent's name."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if any(line.startswith(f"{a}: ") for a in agents)]
    first = starts[0] if starts else len(lines)
    task = "\n".join(lines[:first]).removeprefix("Task: ").strip()
    turns: list[tuple[str, str]] = []
    for i, line in enumerate(lines[first:], first):
        if i in starts:
            agent, said = line.split(": ", 1)
            turns.append((agent, said))
        else:
            turns[-1] = (turns[-1][0], turns[-1][1] + "\n" + line)
    return task, turns


@dataclass(frozen=True)
class FrameworkChainTeacher:
    """``ChainTeacher`` on a framework's solver/checker team (the LangGraph graph of
    ``examples/graphs.py``): each request is rewritten into the chain topology's format (``Task:
    8-5`` and the transcript) that the chain teacher reads.  The solver's earlier answers are its
    own assistant messages (a graph that shows a rejected solver its first try); the checker's
    request names the answer it checks after the task (``claimed_answer``).  The weaknesses are the
    chain teacher's: answers at once (``p_direct``) that sometimes slip (``p_slip``), and a checker
    that passes right answers without showing its check (``p_lazy``)."""

    chain: ChainTeacher
    solver: str
    checker: str

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        messages = req.messages or []
        task = arithmetic_task(messages)
        if req.agent == self.solver:
            tried = [m["content"] for m in messages if m.get("role") == "assistant"]
            lines = [f"{self.solver}: {t}" for t in tried]
        else:
            claim = claimed_answer(messages[-1]["content"], task)
            lines = [f"{self.solver}: ANSWER: {claim if claim is not None else 'none'}"]
        chained = [{"role": "user", "content": "\n".join([f"Task: {task}", *lines])}]
        return self.chain(dataclasses.replace(req, messages=chained), rng)


@dataclass(frozen=True)
class SelectorTeacher:
    """An AutoGen ``SelectorGroupChat`` of specialists for one-operation arithmetic (``team:
    selector``): the selector's model call names the specialist for the task's operation, and the
    specialist answers ``ANSWER: n``.  The task is read where AutoGen puts it (``arithmetic_task``).

    Each specialist does what its role says (the adder adds the two numbers, whatever the sign
    between them), so a misrouted task is answered wrongly.  Weakness: the selector names the
    wrong specialist with probability ``p_misroute``; the teacher's reward is about
    ``1 - p_misroute``, and RL has to learn the routing.
    """

    selector: str
    specialist_for: tuple[tuple[str, str], ...]  # (operator, specialist)
    p_misroute: float = 0.4

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        a, op, b, _ = chain_steps(arithmetic_task(req.messages or []))[0]
        route = dict(self.specialist_for)
        if req.agent == self.selector:
            if rng.random() < self.p_misroute:
                return next(name for o, name in self.specialist_for if o != op)
            return route[op]
        own = next(o for o, name in self.specialist_for if name == req.agent)
        return f"ANSWER: {a + b if own == '+' else a - b}"


def gsm8k_solutions(env_cfg: Any) -> dict[str, tuple[str, str]]:
    """question -> (worked solution, final answer) of every *training* problem of a GSM8K env: the
    dataset's own solution with its ``<<48/2=24>>`` calculator annotations removed, on one line,
    ending ``ANSWER: n`` instead of ``#### n``."""
    env = build_env(env_cfg)
    out = {}
    for task in env.sample_tasks(env.num_train):  # one epoch: every training problem once
        solution = task.meta["solution"]
        steps = re.sub(r"<<[^<>]*>>", "", solution[: solution.rfind("####")])
        final = gsm8k_final_answer(solution)
        out[_key(task.prompt)] = (f"{' '.join(steps.split())} ANSWER: {final}", final)
    return out


@dataclass(frozen=True)
class SolutionChainTeacher:
    """Solver -> verifier on problems with reference worked solutions (GSM8K): ``ChainTeacher``'s
    moves with the training problem's own worked solution where that teacher works the arithmetic
    out.  It knows the training problems only (``solutions``), so it can never play a held-out one.

    The solver answers at once with probability ``p_direct`` and then slips (a near miss) with
    probability ``p_slip``; otherwise, and always after a REJECT, it writes the worked solution.
    The verifier rejects every wrong answer.  Weaknesses: answering at once, and a verifier that
    passes a right answer with a bare ACCEPT (``p_lazy``) instead of restating what it checked.
    """

    solutions: Mapping[str, tuple[str, str]]  # question -> (worked solution ending ANSWER: n, final answer)
    p_direct: float = 0.6
    p_slip: float = 0.3
    p_lazy: float = 0.8
    solver: str = "solver"
    verifier: str = "verifier"

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        question, turns = chain_transcript((req.messages or [])[-1]["content"], (self.solver, self.verifier))
        if _key(question) not in self.solutions:
            raise KeyError(f"the teacher knows the training problems only; not {question[:80]!r}")
        worked, final = self.solutions[_key(question)]
        if req.agent == self.solver:
            if any(a == self.solver for a, _ in turns) or rng.random() >= self.p_direct:
                return worked
            number = read_number(final)
            wrong = number is not None and number.value.denominator == 1 and rng.random() < self.p_slip
            return f"ANSWER: {slipped(int(number.value), rng) if wrong else final}"
        latest = parse_answer(next(t for a, t in reversed(turns) if a == self.solver))[0].get("answer")
        if latest is None or not numbers_match(latest, final):
            return "REJECT"
        return "ACCEPT" if rng.random() < self.p_lazy else f"The solution gives {final}, which is right. ACCEPT"


@dataclass(frozen=True)
class Facts:
    """What the research teacher knows of a training question: its gold answers and supporting titles."""

    answers: tuple[str, ...]
    supporting: tuple[str, ...]
    read: str  # the supporting title to read: the one whose paragraph holds an answer


def hotpotqa_facts(env_cfg: Any) -> dict[str, Facts]:
    """question -> ``Facts`` of every *training* question of a HotpotQA env (its gold answers and
    the titles of its supporting paragraphs, ``Task.meta``)."""
    env = build_env(env_cfg)
    out = {}
    for task in env.sample_tasks(env.num_train):
        answers, titles = tuple(task.meta["answers"]), tuple(task.meta["supporting"])
        holds = [t for t in titles if (p := env.corpus.get(t)) is not None and _mentions(p.text, answers)]
        out[_key(task.prompt)] = Facts(answers, titles, (holds or list(titles))[0])
    return out


def _mentions(text: str, answers: tuple[str, ...]) -> str | None:
    """The first answer that ``text`` contains (case and spacing aside), or None."""
    low = _key(text).lower()
    return next((a for a in answers if _key(a).lower() in low), None)


def _tool_response(text: str) -> str:
    """The text of the last ``<tool_response>`` block of a tool-results message."""
    start = text.rfind("<tool_response>")
    end = text.find("</tool_response>", start)
    return text[start + len("<tool_response>"): end if end >= 0 else len(text)].strip() if start >= 0 else ""


def _sentence_with(text: str, answers: tuple[str, ...], limit: int = 200) -> str:
    """The sentence of ``text`` that holds an answer (else its first sentence), at most ``limit`` characters."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()] or [text.strip()]
    best = next((s for s in sentences if _mentions(s, answers)), sentences[0])
    if len(best) > limit:
        hit = _mentions(best, answers)
        at = max(0, best.lower().find(hit.lower()) - limit // 2) if hit else 0
        best = best[at: at + limit].strip()
    return best


@dataclass(frozen=True)
class ResearchTeacher:
    """A researcher with the ``search`` and ``read`` tools, then an answerer, on HotpotQA training
    questions (a chain; ``docs/research.md``).

    The researcher searches with the question, reads the supporting paragraph that holds the
    answer (``Facts.read``) and replies with its title and the sentence that holds the answer.
    The answerer answers from the evidence it was shown (the transcript, tool results included):
    the gold answer if the evidence holds it, else a guess (the top search result's title).
    Weakness: with probability ``p_direct`` the researcher replies from the search results at
    once (the top result's title and snippet) without reading, so the answer is often not in the
    evidence and the answerer's guess is wrong; RL has to find out that reading pays.  It knows the
    training questions only (``questions``).
    """

    questions: Mapping[str, Facts]
    researcher: str = "researcher"
    p_direct: float = 0.6

    def facts(self, question: str) -> Facts:
        if _key(question) not in self.questions:
            raise KeyError(f"the teacher knows the training questions only; not {question[:80]!r}")
        return self.questions[_key(question)]

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        messages = req.messages or []
        first = next(m["content"] for m in messages if m.get("role") == "user")
        if req.agent != self.researcher:
            question, turns = chain_transcript(first, (self.researcher,))
            evidence = "\n".join(t for _, t in turns)
            hit = _mentions(evidence, self.facts(question).answers)
            return f"ANSWER: {hit if hit is not None else _top_title(evidence) or 'unknown'}"
        question, _ = chain_transcript(first, (self.researcher,))
        facts = self.facts(question)
        rounds = sum(m.get("role") == "assistant" for m in messages)
        last = messages[-1]["content"]
        spent = rounds > 0 and calls_spent(last)  # the budget is spent: reply now
        if rounds == 0:
            return tool_call_text("search", {"query": question})
        if rounds == 1 and not spent and rng.random() >= self.p_direct:
            return tool_call_text("read", {"title": facts.read})
        found = _tool_response(last)
        if rounds >= 2 and found.startswith(f"{facts.read}: "):  # the paragraph it read
            return f"{facts.read}: {_sentence_with(found[len(facts.read) + 2:], facts.answers)}"
        top = next((line.split(". ", 1)[1] for line in found.splitlines()[1:2] if ". " in line), found)
        return top.replace(" ...", "").strip() or "I found nothing."


def _top_title(evidence: str) -> str | None:
    """The title of the first search result in a transcript (``1. <title>: <snippet>``)."""
    m = re.search(r"^1\. (.+?): ", evidence, re.MULTILINE)
    return m.group(1) if m else None


def _check_arithmetic(env: Any, unsupported: Callable[[str], ConfigError]) -> None:
    """The arithmetic teachers read their tasks from the messages: a custom task set must be arithmetic."""
    for task in env.sample_tasks(20):
        if _EXPRESSION.fullmatch(task.prompt.strip()) is None:
            raise unsupported(f"the teacher plays arithmetic expressions such as 8-5; task {task.task_id!r} is {task.prompt[:60]!r}")


def demo_env_config(cfg: RunConfig) -> Any:
    """The env config of the teacher's task stream: the run's env, seeded apart (training split only)."""
    return cfg.env.model_copy(update={"seed": cfg.env.seed + DEMO_STREAM}) if hasattr(cfg.env, "seed") else cfg.env


def teacher_demonstrations(team: Any, episodes: int, teacher: Teacher, seed: int) -> tuple[list[tuple[str, Demonstration]], float]:
    """``(agent, (prompt_ids, completion_ids))`` of every turn of ``episodes`` teacher episodes
    played through the team's own topology, agents and tokenizers on training tasks of a task
    stream of its own; and the teacher's mean reward."""
    cfg = team.cfg
    env = build_env(demo_env_config(cfg))
    rng = random.Random(f"warmup/{seed}")
    tokenizers = team.runtime.tokenizers
    backend = ScriptedBackend(lambda req: teacher(req, rng), tokenizers)
    rt = cfg.runtime
    engine = Engine(build_topology(cfg.topology), team.agents, tokenizers, dict.fromkeys(tokenizers, False), backend, env.score,
                    tools=getattr(env, "tools", {}), tool_timeout_s=rt.tool_timeout_s, tool_memory_mb=rt.tool_memory_mb,
                    tool_workers=rt.tool_workers)  # the env's tools (search, read) run for the teacher's calls too
    out: list[tuple[str, Demonstration]] = []
    rewards = []
    try:
        groups = engine.rollout(env.sample_tasks(episodes), group_size=1, seed=seed)
    finally:
        engine.close()
    for group in groups:
        ep = group.episodes[0]
        if ep.status == "error":  # a teacher that cannot read its team's messages: loud, not a missing demonstration
            raise RuntimeError(f"the scripted teacher's episode of task {ep.task_id!r} failed: {ep.error}")
        rewards.append(ep.reward)
        out += [(t.agent, (list(t.prompt_ids), list(t.completion_ids))) for t in ep.turns if t.completion_ids]
    return out, sum(rewards) / max(len(rewards), 1)


def file_demonstrations(team: Any, path: str) -> list[tuple[str, Demonstration]]:
    """Demonstrations from a JSONL file of ``{agent, messages, completion}``, rendered with each
    agent's chat template (the completion ends with the tokenizer's EOS, as a sampled turn does)."""
    out = []
    file = Path(path)
    if not file.is_file():
        raise ConfigError("config", [f"trainer.warmup.demonstrations: no such file {path!r}"])
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            agent, messages, completion = row["agent"], row["messages"], row["completion"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError("config", [f"trainer.warmup.demonstrations: {path}:{n}: expected "
                                          f"{{agent, messages, completion}} ({type(e).__name__}: {e})"]) from None
        if agent not in team.agents:
            raise ConfigError("config", [f"trainer.warmup.demonstrations: {path}:{n}: unknown agent {agent!r}; "
                                         f"valid: {sorted(team.agents)}"])
        tok = team.runtime.tokenizers[team.agents[agent].policy]
        prompt = render_prompt(tok, messages)
        out.append((agent, (prompt, tok.encode(completion, add_special_tokens=False) + [tok.eos_token_id])))
    return out


def warm_up(team: Any, log: Callable[[str], None], abort: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Fine-tune every trainable policy on its agents' demonstrations (``trainer.warmup``);
    returns the phase's record: per policy its steps, losses, tokens and seconds."""
    cfg = team.cfg
    w = cfg.trainer.warmup
    if w.demonstrations is not None:
        demos, teacher_reward = file_demonstrations(team, w.demonstrations), None
    else:
        demos, teacher_reward = teacher_demonstrations(team, w.episodes, scripted_teacher(cfg, w.teacher), cfg.trainer.seed)
    chosen = set(w.agents) or set(team.agents)
    unknown = sorted(chosen - set(team.agents))
    if unknown:
        raise ConfigError("config", [f"trainer.warmup.agents: unknown agents {unknown}; valid: {sorted(team.agents)}"])
    by_policy: dict[str, list[Demonstration]] = {}
    for agent, demo in demos:
        policy = team.agents[agent].policy
        if agent in chosen and policy in team.learners:
            by_policy.setdefault(policy, []).append(demo)
    record: dict[str, Any] = {"steps": w.steps, "batch_size": w.batch_size, "lr": w.lr,
                              "source": w.demonstrations or "teacher", "teacher_reward": teacher_reward, "policies": {}}
    for name, items in by_policy.items():
        log(f"warm-up: policy {name!r} on {len(items)} demonstration turns, {w.steps} supervised steps before RL "
            f"(its own phase: trainer.steps does not shorten it; trainer.warmup.steps=N does, 0 skips it)")
        got = team.runtime.warm_up(name, items, steps=w.steps, batch_size=w.batch_size, lr=w.lr,
                                   seed=cfg.trainer.seed, abort=abort)
        team.backend.sync_weights(name)
        release_freed_memory()  # this policy's activations and its dropped optimizer: back to the system before the next phase
        record["policies"][name] = {**got, "loss_first": got["losses"][0], "loss_last": got["losses"][-1]}
    return record
