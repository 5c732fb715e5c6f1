"""Scripted teachers of the built-in topologies: each the ideal team with one deliberate flaw.

The embedded model is warm-started on them (one per format, ``mas/embedded/formats.py``), and the
format warm-up of a real-model team (``trainer.warmup``) plays them under the team's own agent
names.  They live with the topologies because a topology kind owns its scripted teacher
(docs/architecture.md, "Kinds are plugins"); ``mas.embedded.teachers`` re-exports them.

A teacher (``Teacher``) is a frozen dataclass of its knobs; ``teacher(req, rng)`` maps a request (the agent
and the chat messages the real topology built) to the reply text.  It reads the task and the
transcript from the messages exactly as a model would see them, so the same code serves any
number of episodes running through the real engine.

Every teacher solves arithmetic chains such as ``3+4-2`` in one of two forms:

* at once: ``ANSWER: 5``: short, and hard for a tiny model (a 2-layer model gets a two-step
  chain right about a fifth of the time);
* worked: ``3+4=7 7-2=5 ANSWER: 5``: longer, one operation at a time, which a tiny model
  gets right most of the time.

Each teacher prefers the short or the lazy move a little more often than not, so the warm
started model's greedy choice is the weak one while sampling still tries the strong one:
reinforcement learning has something real to discover in every format.  The exception is
the specialist of a parts team (``RelayTeacher``): the team is right only if all N of them
are, so each must start right most of the time for N = 8 to leave any reward to learn from;
it takes the short move less often.  The flaw of each teacher is documented on its class;
each is deliberate.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from mas.tools import OPEN, calls_spent, parse_tool_calls, tool_call_text
from mas.rollout.backends.base import GenRequest

Teacher = Callable[[GenRequest, random.Random], str]  # a request and the episode's RNG -> the reply text
Step = tuple[int, str, int, int]  # (a, op, b, a op b)


class NoTeacher(ValueError):
    """No scripted teacher for this team: the message says why (another layout, another task, a
    missing tool).  The format warm-up turns it into a config error that names
    ``trainer.warmup.demonstrations``, the user's own demonstrations."""


# ---------------------------------------------------------------------------------------------
# arithmetic as the teachers write it
# ---------------------------------------------------------------------------------------------


# how a specialist's name says which operation it does
OPS = {"+": ("add", "plus", "sum"), "-": ("sub", "minus", "diff")}


def specialists_by_op(specialists: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(operation, specialist) for ``+`` and ``-``: the first specialist whose name says it does it
    (``adder``, ``sub_agent``); ``NoTeacher`` when one has none."""
    out = []
    for op, words in OPS.items():
        name = next((s for s in specialists if any(w in s.lower() for w in words)), None)
        if name is None:
            raise NoTeacher(f"no specialist named for {op!r} among {list(specialists)}")
        out.append((op, name))
    return tuple(out)


def renamed(teacher: Teacher, names: dict[str, str]) -> Teacher:
    """``teacher`` asked as if the agents had the names it was written for (e.g. the team's
    orchestrator under whatever name the YAML gives it)."""
    if all(a == b for a, b in names.items()):
        return teacher
    return lambda req, rng: teacher(dataclasses.replace(req, agent=names.get(req.agent, req.agent)), rng)


def chain_steps(expr: str) -> list[Step]:
    """'3+4-2' -> [(3,'+',4,7), (7,'-',2,5)], left to right; also handles a leading minus ('-3+4')."""
    nums, ops, cur = [], [], ""
    for ch in expr.strip():
        if ch in "+-" and cur not in ("", "-"):
            nums.append(int(cur))
            ops.append(ch)
            cur = ""
        else:
            cur += ch
    nums.append(int(cur))
    steps, acc = [], nums[0]
    for op, b in zip(ops, nums[1:]):
        r = acc + b if op == "+" else acc - b
        steps.append((acc, op, b, r))
        acc = r
    return steps


def value(expr: str) -> int:
    steps = chain_steps(expr)
    return steps[-1][3] if steps else int(expr)


def step_text(step: Step) -> str:
    a, op, b, r = step
    return f"{a}{op}{b}={r}"


def worked(expr: str) -> str:
    """'3+4-2' -> '3+4=7 7-2=5': every step written out."""
    return " ".join(step_text(s) for s in chain_steps(expr))


def solve(expr: str, rng: random.Random, p_direct: float) -> str:
    """The answer at once with probability ``p_direct``, else worked out; always right."""
    if rng.random() < p_direct:
        return f"ANSWER: {value(expr)}"
    return f"{worked(expr)} ANSWER: {value(expr)}"


def slipped(n: int, rng: random.Random) -> int:
    """A near miss: ``n`` off by 1 or 2."""
    return n + rng.choice((-2, -1, 1, 2))


_ANSWER = re.compile(r"ANSWER:\s*(-?\d+)")


def answer_of(text: str) -> int | None:
    m = _ANSWER.findall(text)
    return int(m[-1]) if m else None


def user_text(req: GenRequest) -> str:
    return (req.messages or [])[-1]["content"]


def task_line(req: GenRequest, prefix: str = "Task: ") -> str:
    """The task as the topology wrote it on the first line of the user message."""
    return user_text(req).splitlines()[0].removeprefix(prefix).strip()


def transcript_lines(req: GenRequest, agent: str) -> list[str]:
    """The texts of ``agent``'s earlier turns in a chain or graph transcript ('agent: text' lines)."""
    return [line.split(": ", 1)[1] for line in user_text(req).splitlines()[1:] if line.startswith(f"{agent}: ")]


# ---------------------------------------------------------------------------------------------
# the teachers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrchestratorTeacher:
    """Orchestrator + adder + subtractor (the quickstart team).

    The orchestrator either delegates each step (``CALL adder: 3+4`` ... ``ANSWER: 5``) or,
    with probability ``p_direct``, answers at once.  Both are right; answering at once is just
    much harder for a tiny model.  Flaw: it answers at once more often than it delegates, so
    RL has to find out that delegating to the specialists pays.
    """

    p_direct: float = 0.6
    specialist_for: tuple[tuple[str, str], ...] = (("+", "adder"), ("-", "subtractor"))

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        messages = req.messages or []
        if req.agent != "orchestrator":
            return f"ANSWER: {value(messages[-1]['content'])}"
        steps = chain_steps(messages[1]["content"].removeprefix("Task: "))
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done == 0 and rng.random() < self.p_direct:
            return f"ANSWER: {steps[-1][3]}"
        if done == len(steps):
            return f"ANSWER: {steps[-1][3]}"
        a, op, b, _ = steps[done]
        return f"CALL {dict(self.specialist_for)[op]}: {a}{op}{b}"


@dataclass(frozen=True)
class DebateTeacher:
    """Debaters answer the question each round; a judge (when there is one) gives the majority.

    Round 2 shows each debater the others' answers; the teacher's debaters are always right,
    so agreeing and recomputing coincide.  Flaw: each debater answers at once with
    probability ``p_direct`` instead of working it out.
    """

    p_direct: float = 0.6
    judge: str = "judge"

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        question = task_line(req, "Question: ")
        if req.agent == self.judge:
            votes = [answer_of(line) for line in user_text(req).splitlines() if line.startswith("- ")]
            counts = Counter(v for v in votes if v is not None)
            return f"ANSWER: {counts.most_common(1)[0][0] if counts else value(question)}"
        return solve(question, rng, self.p_direct)


@dataclass(frozen=True)
class ChainTeacher:
    """Solver -> verifier, back to the solver on REJECT (the Dr. MAS solver/verifier loop).

    The solver answers at once with probability ``p_direct`` and then slips (a near miss)
    with probability ``p_slip``; otherwise, and always after a REJECT, it works the answer
    out.  The verifier rejects every wrong answer, showing its working.  Flaw: it passes a
    right answer with a bare ACCEPT (no check) with probability ``p_lazy``, so the warm
    started verifier's greedy reply is a rubber stamp; RL has to find out that checking (and
    working it out the first time) pays.
    """

    p_direct: float = 0.6
    p_slip: float = 0.3
    p_lazy: float = 0.8
    solver: str = "solver"

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        task = task_line(req)
        truth = value(task)
        if req.agent == self.solver:
            if transcript_lines(req, self.solver) or rng.random() >= self.p_direct:
                return f"{worked(task)} ANSWER: {truth}"
            return f"ANSWER: {slipped(truth, rng) if rng.random() < self.p_slip else truth}"
        latest = answer_of(transcript_lines(req, self.solver)[-1])
        if latest != truth:
            return f"{worked(task)} REJECT"
        return "ACCEPT" if rng.random() < self.p_lazy else f"{worked(task)} ACCEPT"


@dataclass(frozen=True)
class GraphTeacher:
    """A checker routes to a worker (REJECT: do the next step) or to an answerer (ACCEPT).

    The graph of the Dr. MAS search orchestra (verify -> search or answer), with arithmetic
    steps for searches.  The worker writes one step per visit (``3+4=7``), the checker
    rejects until every step is written, and the answerer copies the last result, or
    computes the answer at once when no step was written.  Flaw: on its first visit the
    checker accepts at once with probability ``p_direct``, skipping the work.
    """

    p_direct: float = 0.6
    checker: str = "checker"
    worker: str = "worker"

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        task = task_line(req)
        steps = chain_steps(task)
        done = len(transcript_lines(req, self.worker))
        if req.agent == self.checker:
            first = not transcript_lines(req, self.checker)
            if first and rng.random() < self.p_direct:
                return "ACCEPT"
            return "REJECT" if done < len(steps) else "ACCEPT"
        if req.agent == self.worker:
            return step_text(steps[min(done, len(steps) - 1)])
        return f"ANSWER: {value(task)}"


@dataclass(frozen=True)
class RelayTeacher:
    """A specialist of a parts team (``topology.parts``: team_relay, team_conjunctive) sees only
    its own part (``Task: 3+4-2``) and answers it: at once with probability ``p_direct``, else
    worked out; always right.  Flaw: the answers at once, which the warm-started model gets
    right about 30% of the time when sampling, against about 82% for a worked answer.
    ``p_direct`` is low (0.2, against 0.6 elsewhere) so that a warm-started specialist is right
    on about two thirds of its parts when sampling at temperature 1 (the model samples the
    short answer about 30% of the time, more often than its teacher gave it): the team, right
    only when every specialist is, then still succeeds in a few of 64 episodes at N = 8
    (0.67^8 ≈ 4%), and each specialist has a short answer left to unlearn.  (Measured on the
    build ``58b7f71d68ff``: greedy, a specialist works its part out and is right on about 88%
    of held-out parts.  Sampled, a specialist is right on about 63-65% of its parts on
    ``49feff5a05f4`` and 71-73% on the shipped two-stage ``851c280c22da``: docs/benchmarks/team_size.md,
    team size.)"""

    p_direct: float = 0.2

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        return solve(task_line(req), rng, self.p_direct)


@dataclass(frozen=True)
class SaboteurTeacher:
    """A solver answers; a reviewer accepts, or rejects and writes its own answer, which
    replaces the solver's (envs/team/saboteur.py).  The solver answers at once with
    probability ``p_direct``, else works it out, and is always right.  Flaw, the designed
    saboteur: the reviewer overrules with probability ``p_overrule`` and its answer is then a
    near miss, so an episode it overrules fails although the solver was right.  RL has to
    teach the reviewer to accept, and the solver to work the answer out."""

    p_direct: float = 0.6
    p_overrule: float = 0.6
    reviewer: str = "reviewer"

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        task = task_line(req)
        if req.agent != self.reviewer:
            return solve(task, rng, self.p_direct)
        if rng.random() < self.p_overrule:
            return f"REJECT ANSWER: {slipped(value(task), rng)}"
        return "ACCEPT"


# ---------------------------------------------------------------------------------------------
# research: a researcher with search and read, then an answerer (envs/research/facts.py)
# ---------------------------------------------------------------------------------------------


_PERSON = re.compile(r"organisation that (.+?) founded\?")
_REPLY_CITY = re.compile(r"\b([A-Z][a-z]+)\.\s*$")  # the last name of a reply


def _tool_calls_so_far(messages: list[dict[str, str]]) -> list[tuple[str | None, str | None]]:
    """(name, query or title) of every tool call in this invocation's assistant messages."""
    return [(c.name, (c.arguments or {}).get("query") or (c.arguments or {}).get("title"))
            for m in messages if m.get("role") == "assistant" for c in parse_tool_calls(m["content"])]


def _seen(messages: list[dict[str, str]], pattern: str) -> str | None:
    """The first group of ``pattern`` in the user messages so far (the task and the tool responses)."""
    for m in messages:
        if m.get("role") == "user":
            found = re.search(pattern, m["content"])
            if found:
                return found.group(1)
    return None


@dataclass(frozen=True)
class FactsTeacher:
    """A researcher with ``search`` and ``read``, then an answerer, on the generated two-hop facts
    ("In which city is the organisation that <person> founded?"): search the person, read the
    person's paragraph, search the organisation it names, reply with the city alone
    (``reply``: ``Harhaven.``); the answerer gives the city that reply ends with.

    It knows nothing of the world: every name it writes it copies from what it has read (the
    person from the question, the birthplace from the first search's snippet, the organisation
    from the paragraph, the city from the second search), so it plays any generated world, and
    the turns it leaves teach exactly that copying.  Flaws, as ``cpu_facts``'s warm-up teacher:
    with probability ``p_direct`` the researcher replies after the first search with the city it
    shows (the birthplace, always wrong); with probability ``p_detour`` it first makes an unneeded
    search (the birthplace).

    Why the city alone: a sentence that names the organisation before the city (``The <org> is
    based in <city>.``) hides the city from the embedded 2-layer model, which copies the last name
    its context shows (the organisation, in its own reply).  On that sentence it copied the
    organisation and then wrote a city from its prior: 1 in 40 held-out replies right after 3,000
    steps of whole-path demonstrations; replying with the city alone, 38 in 40 after 250 more
    (docs/benchmarks/research_stage.md, "The embedded build's research stage")."""

    p_direct: float = 0.6
    p_detour: float = 0.3
    researcher: str = "researcher"
    reply: str = "{city}."  # the researcher's last turn; {city} is the one it found (or the birthplace)

    def __post_init__(self) -> None:
        try:
            example = self.reply.format(city="Harhaven")
        except (KeyError, IndexError, ValueError):  # another placeholder, or a stray brace
            example = ""
        if not _REPLY_CITY.search(example):  # the answerer reads the reply's last name
            raise ValueError(f"FactsTeacher.reply {self.reply!r} must end with {{city}} and a full stop: the answerer "
                             "gives the city the reply ends with, so any other reply would teach it to answer 'unknown'")

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        messages = req.messages or []
        if req.agent != self.researcher:
            replies = [line for line in user_text(req).splitlines() if line.startswith(f"{self.researcher}: ")
                       and OPEN not in line]
            city = _REPLY_CITY.search(replies[-1]) if replies else None
            return f"ANSWER: {city.group(1) if city else 'unknown'}"
        task = next(m["content"] for m in messages if m.get("role") == "user")
        person = _PERSON.search(task)
        if person is None:
            raise ValueError(f"not a facts question: {task[:80]!r}")
        person = person.group(1)
        done = _tool_calls_so_far(messages)
        if not done:
            return tool_call_text("search", {"query": person})
        birthplace = _seen(messages, rf"{re.escape(person)} was born in ([A-Z][a-z]+)")
        org = _seen(messages, rf"{re.escape(person)} founded the (.+?) in \d")
        city = _seen(messages, rf"The {re.escape(org)} is based in ([A-Z][a-z]+)") if org else None
        direct = self.reply.format(city=birthplace)
        if ("search", org) in done and city:
            return self.reply.format(city=city)
        if calls_spent(messages[-1]["content"]):  # the budget is spent: reply now
            return direct
        if ("read", person) not in done:
            return direct if rng.random() < self.p_direct else tool_call_text("read", {"title": person})
        if ("search", birthplace) not in done and rng.random() < self.p_detour:
            return tool_call_text("search", {"query": birthplace})
        return tool_call_text("search", {"query": org})
