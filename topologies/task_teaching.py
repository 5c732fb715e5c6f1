"""The teachers of teams on tasks with reference solutions or facts: GSM8K and HotpotQA chains.

The format warm-up (``trainer.warmup``) plays them through a chain team's own engine and
topology.  Each knows the *training* tasks only (their worked solutions, their gold answers and
supporting paragraphs), read from the env's training split, so it can never play a held-out one:

* ``SolutionChainTeacher``: solver -> verifier on GSM8K, with the problem's own worked solution
  (``gsm8k_solutions``);
* ``ResearchTeacher``: a researcher with ``search`` and ``read``, then an answerer, on HotpotQA
  (``hotpotqa_facts``).

``mas.training.warmup`` re-exports these names.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mas.agents.parsers import parse_answer
from mas.tools import calls_spent, tool_call_text
from mas.envs import build_env
from mas.envs.math.verify import gsm8k_final_answer, numbers_match, read_number
from mas.rollout.backends.base import GenRequest
from mas.topologies.framework_teaching import _EXPRESSION, chain_transcript
from mas.topologies.teaching import NoTeacher, slipped


def _key(text: str) -> str:
    """A question as a lookup key: whitespace collapsed (a topology may re-wrap it)."""
    return " ".join(text.split())


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
