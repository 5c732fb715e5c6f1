"""The teachers of AutoGen and LangGraph teams: format warm-up demonstrations for any framework team.

``trainer.warmup`` plays a scripted teacher through the team's own engine and topology
(``mas.training.warmup.teacher_demonstrations``) and fine-tunes each policy on its agents'
turns.  The hand-written teachers know one layout each (a selector of an adder and a
subtractor, a solver/checker graph).  A team written with AutoGen or LangGraph is code mas
cannot see into, so this teacher reads each request the way a model would, from the messages
the framework built, and answers from what it finds there:

* **The task.**  It finds the prompt of one of the training tasks it plays in the messages (the
  system message aside; ``TaskBook``), and knows that task's gold answer.
* **A router** (AutoGen's selector, or an agent with the ``raw`` parser, such as a LangGraph
  supervisor that replies with a worker's name) names a candidate that has not spoken yet in
  the episode: from the ``['a', 'b']`` list AutoGen puts in its selector prompt, else the
  team's agents its prompt names, in the order it names them; in the team's order, not the
  list's: a member that plans (its prompt says so, or AutoGen's ``<name>: <description>`` roles
  list does) first, then the members in the order the planner's prompt names them.  When all of
  them have spoken it replies with the word its prompt asks for to finish (``FINISH``), or names
  the agent whose prompt asks for the team's stop word (else any agent that can end the team).
* **An agent offered tools** (described in its system message by ``topologies/adapters.py``):
  it calls one of its tools once, on the task (``tool_arguments``): no arguments; the task as a
  tool's one argument (a calculator's expression); the task's numbers as a tool's numeric
  parameters, in order, or those either side of the operation the tool's name names
  (``add(a: int, b: int)`` on ``What is 12+7?``: a=12, b=7; ``subtract`` on ``2+9-4``: 9 and 4),
  a tool named for the task's operation first.  It hands off (``transfer_to_<name>``) to an agent
  that has not spoken yet, or back to one that can reach them.
* **Agents as tools** (``agent_tools``: two or more tools, none a handoff, that each take one text
  argument and name no operation, as the OpenAI Agents SDK's ``Agent.as_tool`` makes them, each
  with one ``input``): the agent calls every one of them once, one call a reply, in the order its
  own prompt names them (else the list's), the first with the task, each later one with the task
  and, on a line of its own, the answer the latest result proposed (``Proposed answer: 3``,
  ``agent_tool_input``); then it answers.  The agent behind each tool reads the task in that
  input and answers.
* **An answer tool** (``final_answer`` or ``submit_answer`` with one text argument: smolagents'
  ``final_answer``, through which a ``ToolCallingAgent`` ends its run) is not work: the agent does
  its work first, then answers by calling it with its answer (``ANSWER: <gold>``).  What the agent
  called is read from its own messages: the ``<tool_call>`` blocks it wrote, or its framework's
  record of a call (smolagents writes ``Calling tools:`` and the calls as a Python list).
* **A planner** (its own prompt says it plans, delegates or assigns the work to the team:
  ``delegates``) with members still to speak and no tool to reach them writes a delegation in
  the form its prompt asks for, one line per pending member (``<member>: <subtask>``; AutoGen's
  selector tutorial's ``1. <agent> : <task>`` where the prompt shows none), in the order its
  prompt names them, the subtask being the task itself (``the task`` where its prompt is long).
  When they have spoken it answers, and ends the team with its stop word.
* **Otherwise it answers** in the env's format, ``ANSWER: <gold>`` (a verdict agent adds
  ``ACCEPT`` or ``REJECT``).  The agent that speaks when everyone else has spoken adds the stop
  words that are its to write: the capitalised words its own prompt asks for (``TERMINATE``,
  ``FINAL ANSWER``), and the texts of the AutoGen team's ``TextMentionTermination``s that no other
  member's prompt asks for.  A word another member's prompt asks for is that member's (a planner's
  "end with TERMINATE"): the others answer without it, and hand back to that member where they
  can (a swarm's ``transfer_to_planner``).  The teacher learns each agent's prompt from its
  requests' system messages (before its first request: what the kind read from the team's code,
  else the YAML ``role``).

Who has spoken is read from the messages too: a line ``<agent>: ...`` (how the AutoGen client
shows another agent's message and AutoGen's selector its history; a LangGraph graph must write
a report that way, as the examples do), and the agent's own assistant messages; a delegation's
line ``<member>: <the task>`` is not that member's turn.

The deliberate weakness, for RL to fix (as the other teachers' ``p_direct``): in a share
``p_skip`` of the episodes (chosen per task) the first agent to speak answers at once and the
team ends (the agent whose prompt asks for the stop word writes it), without consulting the
others, and such an answer is a near miss with probability ``p_slip``.  Where the team can stop
early (a termination word, a supervisor that finishes), the teacher's reward is then about
``1 - p_skip * p_slip``.

Limits: a LangGraph graph that routes on something other than the agents' text, or stops on a
word its prompts do not name, is not followed; a delegation's length is not measured against the
planner's ``max_new_tokens`` (the teacher has no tokenizer); a tool with two string parameters,
or a list, is not called; agents as tools are known by their one text argument each, not by the
agents behind them (two tools of one text argument each are called in turn, each once); a request
with no training task in its messages is a ``KeyError`` (the warm-up then fails loudly: give
``trainer.warmup.demonstrations``).

A reply whose start is forced (``GenRequest.prefix``: a ``tool_choice`` that asks for a call, a JSON
``response_format``, structured output; ``meet_start``) is what the teacher would write, in that
form: its own call of the tool where it makes one, else the tool's arguments (or the JSON object the
schema in the system message describes) filled from its reply (``filled``): a field with allowed
values takes the one its reply names (a router's choice), else the verdict's (``ACCEPT``: the
positive one, "correct", "yes"; ``REJECT``: the other), a boolean the verdict, a number the
answer, a string the reply's text on one line (no escaped newlines for a small model to learn);
a nested object or a list is null.  A reply whose fields the request asks for between
``[[ ## name ## ]]`` markers (DSPy's ChatAdapter; ``in_asked_form``) is filled the same way, each
field of the kind the system message lists, and ends with ``[[ ## completed ## ]]``.

Two framework teams on arithmetic have teachers of their own, which read the task where the
framework puts it (``arithmetic_task``): an AutoGen selector of specialists (``SelectorTeacher``)
and a LangGraph solver/checker graph (``FrameworkChainTeacher``, ``ChainTeacher`` on the task
read from the messages).  ``mas.training.framework_teacher`` re-exports this module's names.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mas.agents.parsers import parse_answer
from mas.response_format import JSON_START, asked_format
from mas.tools import forced_call_name, parse_tool_calls, tool_call_start, tool_call_text
from mas.envs import build_env
from mas.rollout.backends.base import GenRequest
from mas.topologies.adapters import describe_tools, tool_schema
from mas.topologies.teaching import ChainTeacher, NoTeacher, chain_steps, slipped
from mas.types import Task

HANDOFF = "transfer_to_"  # the name of a handoff tool, AutoGen's and LangGraph's: transfer_to_<agent>
ANSWER_TOOLS = ("final_answer", "submit_answer")  # a tool an agent answers through (smolagents' final_answer), not work
TOOLS_HEADER = describe_tools([tool_schema("t", "", None)]).splitlines()[0]  # how the adapters start their tool list
_TOOL_LINE = re.compile(r"^- (\w+)\(([^)]*)\)")
# a capitalised word or phrase a prompt asks an agent to write: "end with TERMINATE", "respond with FINISH",
# "prefix your reply with FINAL ANSWER"
_ASKED = re.compile(r"\b(?:with|write|writes|say|says|reply|replies|respond|responds|output)\s+[\"'`]?"
                    r"([A-Z][A-Z_]+(?: [A-Z][A-Z_]+)*)\b")
_NOT_STOPS = {"ANSWER", "ACCEPT", "REJECT"}  # the env's answer format and the verdict words: never a stop word
_LISTED = re.compile(r"\[\s*'[^'\]]+'(?:\s*,\s*'[^'\]]+')*\s*\]")  # AutoGen's {participants}: ['a', 'b']


def _key(text: str) -> str:
    """Text as a lookup key: whitespace collapsed (a framework may re-wrap it)."""
    return " ".join(text.split())


def _joins_before(ch: str) -> bool:
    return ch.isalnum() or ch in "+-*/^_."


def _occurs(key: str, text: str) -> bool:
    """``key`` in ``text`` as a whole: not a piece of a longer number, word or expression."""
    start = text.find(key)
    while start >= 0:
        end = start + len(key)
        before_ok = start == 0 or not _joins_before(text[start - 1])
        after = text[end:end + 2]
        after_ok = not after or not (after[0].isalnum() or after[0] in "+-*/^_" or (after[:1] == "." and after[1:].isdigit()))
        if before_ok and after_ok:
            return True
        start = text.find(key, start + 1)
    return False


class TaskBook:
    """The training tasks the teacher plays, found by their prompt in a request's messages.

    ``env`` is the teacher's own task stream (the one ``teacher_demonstrations`` samples from):
    the book reads it in order, ``first`` tasks to begin with and more as requests ask for tasks
    it has not read yet (the k-th task of a stream is the same in every run), up to ``most``."""

    def __init__(self, env: Any, first: int = 64, most: int = 20_000):
        self.env, self.most = env, most
        self.tasks: dict[str, Task] = {}
        self._by_length: list[str] = []
        self.read = 0  # tasks of the stream read so far
        self._read(first)

    def _read(self, n: int) -> None:
        for task in self.env.sample_tasks(n):
            self.tasks.setdefault(_key(task.prompt), task)
        self._by_length = sorted(self.tasks, key=len, reverse=True)
        self.read += n

    def find(self, messages: list[dict[str, str]]) -> Task:
        """The task whose prompt the messages pose: the longest prompt found in the first message (the
        system message skipped) that holds one.  KeyError when none holds a training task."""
        texts = [_key(m["content"]) for m in messages if m.get("role") != "system"]
        while True:
            for text in texts:
                hit = next((k for k in self._by_length if _occurs(k, text)), None)
                if hit is not None:
                    return self.tasks[hit]
            if self.read >= self.most:
                raise KeyError(f"the teacher knows the training tasks only (the first {self.read} of its stream); no task "
                               f"in the messages {[t[:80] for t in texts]}")
            self._read(max(1, min(self.read, self.most - self.read)))  # twice as many, up to most


@dataclass(frozen=True)
class Tool:
    """A tool a request offers, as the adapters describe it: its name, (parameter, required) pairs, and
    each parameter's type as the adapters write it (``int``, ``str``, ``any``; ``""`` where none is written)."""

    name: str
    params: tuple[tuple[str, bool], ...]
    types: tuple[str, ...] = ()


def offered_tools(system: str) -> list[Tool]:
    """The tools the system message describes in the adapters' list (``describe_tools``)."""
    at = system.find(TOOLS_HEADER)
    if at < 0:
        return []
    out = []
    for line in system[at + len(TOOLS_HEADER):].splitlines()[1:]:
        m = _TOOL_LINE.match(line)
        if m is None:
            break
        parts = [p for p in m.group(2).split(",") if p.strip()]
        params = tuple((p.split(":")[0].strip(), "= optional" not in p) for p in parts)
        types = tuple(p.split(":", 1)[1].split("=")[0].strip() if ":" in p else "" for p in parts)
        out.append(Tool(m.group(1), params, types))
    return out


# -- a tool's arguments, read from the task ---------------------------------------------------------

_NUMERIC_TYPES = {"int", "integer", "float", "number"}  # as the adapters write JSON's integer and number, and as is
_TEXT_TYPES = {"str", "string"}
# the operations a tool's name can name (by a whole word of it: add_numbers, subtractTwo), and how a task
# writes each between two numbers
_OPERATIONS = (
    ({"add", "addition", "plus", "sum"}, ("+", "plus")),
    ({"sub", "subtract", "subtraction", "minus", "difference", "diff"}, ("-", "\u2212", "minus")),
    ({"mul", "multiply", "multiplication", "times", "product"}, ("*", "\u00d7", "times")),
    ({"div", "divide", "division", "quotient"}, ("/", "\u00f7", "divided by")),
)
_OPERAND = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")  # a number, not a piece of a word or of a longer number
_MINUS = ("-", "\u2212")


def task_numbers(text: str) -> list[tuple[str, int, int]]:
    """The numbers ``text`` writes, in order, as ``(number, start, end)``.  A minus right before a
    number is its sign where no operand comes before it (``-3+5``, ``What is -3?``, ``4 - -2``) and the
    operator where one does (``9-4`` is 9 and 4)."""
    out = []
    for m in _OPERAND.finditer(text):
        value, start = m.group(0), m.start()
        before = text[:start].rstrip(" \t")
        if before.endswith(_MINUS):
            prev = before[:-1].rstrip(" \t")
            if not prev or not (prev[-1].isdigit() or prev[-1] == ")"):
                value, start = "-" + value, len(before) - 1
        out.append((value, start, m.end()))
    return out


def tool_operation(name: str) -> tuple[str, ...] | None:
    """How a task writes the operation a tool's name names (``add`` -> ``+``, ``plus``), or None."""
    words = set(re.split(r"[^a-z]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()))
    return next((forms for names, forms in _OPERATIONS if words & names), None)


def operands(operation: tuple[str, ...] | None, text: str, k: int) -> list[str] | None:
    """``k`` numbers of the task ``text`` for a tool's numeric parameters: for two parameters of a tool
    that names an operation, the two numbers either side of the first such operation in the task
    (``subtract`` on ``2+9-4``: 9 and 4); otherwise the task's first ``k`` numbers in order.  None
    where the task has fewer."""
    numbers = task_numbers(text)
    if k == 2 and operation is not None:
        for (a, _, end), (b, start, _) in zip(numbers, numbers[1:]):
            between = text[end:start].strip().lower()
            if between in operation:
                return [a, b]
    return [n for n, _, _ in numbers[:k]] if len(numbers) >= k else None


def names_task_operation(name: str, text: str) -> bool:
    """Whether a tool's name names an operation the task ``text`` has between two of its numbers
    (``subtract`` or ``subtractNumbers`` on ``9-4``)."""
    forms = tool_operation(name)
    numbers = task_numbers(text)
    return forms is not None and any(text[end:start].strip().lower() in forms
                                     for (_, _, end), (_, start, _) in zip(numbers, numbers[1:]))


def called(chat: list[dict[str, str]], tools: list[Tool]) -> list[str]:
    """The tools the agent has called, read from its own (assistant) messages: the ``<tool_call>`` blocks
    it wrote, and the offered tools its framework's record of a call names (smolagents writes a call
    back as ``Calling tools:`` and a list of ``{'function': {'name': 'calculate', ...}}``)."""
    out = []
    for m in chat:
        if m.get("role") != "assistant":
            continue
        blocks = [c.name for c in parse_tool_calls(m["content"]) if c.name]
        out += blocks or [t.name for t in tools if re.search(rf"""['"]name['"]: ['"]{re.escape(t.name)}['"]""", m["content"])]
    return out


def answer_tool(tools: list[Tool]) -> Tool | None:
    """The tool the agent answers through (``ANSWER_TOOLS``: smolagents' ``final_answer(answer)``, which
    ends the agent's run with its argument), where it takes one text argument; None where none is offered."""
    return next((t for t in tools if t.name in ANSWER_TOOLS and len(t.params) == 1
                 and (t.types or ("",))[0] in _TEXT_TYPES | {""}), None)


def agent_tools(tools: list[Tool], prompt: str) -> list[Tool]:
    """The tools that stand for agents (an SDK's ``Agent.as_tool``: one ``input`` string), in the order
    ``prompt`` (the agent's own words) names them, the others in the list's order: the tools that each
    take one text argument and name no operation (``solve_problem(input: str)``, not ``add(a, b)`` or
    ``subtract(expression: str)``), where the request offers two or more of them, no handoff among them.
    A single such tool is a tool like any other (a calculator's ``calculate(expression: str)``)."""
    own = prompt.split(TOOLS_HEADER)[0]
    found = [t for t in tools if not t.name.startswith(HANDOFF) and len(t.params) == 1 and t.params[0][1]
             and (t.types or ("",))[0] in _TEXT_TYPES and tool_operation(t.name) is None]
    if len(found) < 2:
        return []
    at = {t.name: m.start() for t in found if (m := re.search(rf"(?<!\w){re.escape(t.name)}(?!\w)", own))}
    return sorted(found, key=lambda t: (t.name not in at, at.get(t.name, 0), found.index(t)))


def agent_tool_input(prompt: str, results: list[str]) -> str:
    """What the teacher passes to an agent-tool: the task, and after a first result that proposes an
    answer, a line with the latest such answer (``Proposed answer: 3``)."""
    claims = [parsed["answer"] for r in results if (parsed := parse_answer(r)[0]).get("answer")]
    return prompt if not claims else f"{prompt}\nProposed answer: {claims[-1].strip()}"


def tool_results(chat: list[dict[str, str]]) -> list[str]:
    """The tool results handed back in the messages, in order (the ``<tool_response>`` blocks)."""
    return [m.group(1).strip() for msg in chat if msg.get("role") == "user"
            for m in re.finditer(r"<tool_response>(.*?)</tool_response>", msg["content"], re.S)]


def _as_json_number(text: str, kind: str) -> int | float | None:
    """A task's number as a tool's ``int`` or ``float`` argument (an ``int`` one must be whole)."""
    value = float(text)
    if value.is_integer():
        return int(value)
    return None if kind in ("int", "integer") else value


def tool_arguments(tool: Tool, prompt: str) -> dict[str, Any] | None:
    """The call of ``tool`` on the task ``prompt``: no arguments; the prompt as its one argument
    (a calculator's expression, a search's query); the task's numbers as its numeric arguments
    (``add(a: int, b: int)`` on ``What is 12+7?``: a=12, b=7; ``operands``), with the prompt as its
    one string argument if it also has one.  None where the task cannot fill them (two string
    parameters, a list, too few numbers)."""
    types = tool.types or ("",) * len(tool.params)
    required = [(p, t) for (p, needed), t in zip(tool.params, types) if needed]
    if not required:
        return {}
    numeric = [(p, t) for p, t in required if t in _NUMERIC_TYPES]
    other = [p for p, t in required if t not in _NUMERIC_TYPES]
    if len(required) == 1 and other:
        return {other[0]: prompt}  # one argument that is no number: the task itself
    if len(other) > 1 or (other and dict(required)[other[0]] not in _TEXT_TYPES):
        return None
    values = operands(tool_operation(tool.name), prompt, len(numeric))
    if values is None:
        return None
    args: dict[str, Any] = {p: prompt for p in other}
    for (p, t), text in zip(numeric, values):
        number = _as_json_number(text, t)
        if number is None:
            return None
        args[p] = number
    return {p: args[p] for p, _ in required}  # in the tool's order


def asked_words(text: str) -> list[str]:
    """The capitalised words ``text`` asks its reader to write (``TERMINATE``, ``FINISH``, ``FINAL ANSWER``),
    in order; the env's ``ANSWER`` and the verdict words are not among them."""
    return list(dict.fromkeys(w for w in _ASKED.findall(text) if w not in _NOT_STOPS))


def prefixed(text: str, word: str) -> bool:
    """Whether ``text`` asks for ``word`` at the start of the reply ("prefix your reply with FINAL ANSWER")."""
    return re.search(rf"\b(?i:prefix)\w*\b[^.\n]{{0,40}}\bwith\s+[\"'`]?{re.escape(word)}\b", text) is not None


def transcript(messages: list[dict[str, str]], task: Task) -> list[str]:
    """The lines of the user messages after the task's prompt first appears: what was said about
    the task (AutoGen's selector prompt lists every participant as ``<name>: <description>``
    before its history, which starts with the task)."""
    words = task.prompt.split()
    pattern = re.compile(r"\s+".join(map(re.escape, words))) if words else None
    lines: list[str] = []
    found = False
    for m in messages:
        if m.get("role") != "user":
            continue
        text = m["content"]
        if not found and pattern is not None:
            hit = pattern.search(text)
            if hit is None:
                continue
            found, text = True, text[hit.end():]
        lines += text.splitlines()
    return lines if found else [line for m in messages if m.get("role") == "user" for line in m["content"].splitlines()]


def before_task(messages: list[dict[str, str]], task: Task) -> list[str]:
    """The lines of the user messages before the task's prompt first appears (AutoGen's selector
    prompt: its ``<name>: <description>`` list of the participants)."""
    words = task.prompt.split()
    pattern = re.compile(r"\s+".join(map(re.escape, words))) if words else None
    lines: list[str] = []
    for m in messages:
        if m.get("role") != "user":
            continue
        hit = pattern.search(m["content"]) if pattern is not None else None
        lines += (m["content"] if hit is None else m["content"][:hit.start()]).splitlines()
        if hit is not None:
            return lines
    return []


def said_by(lines: list[str], agents: Iterable[str]) -> list[tuple[str, str]]:
    """``(agent, text)`` of each line ``<agent>: <text>``, in order."""
    names = tuple(agents)
    out = []
    for line in lines:
        who = next((a for a in names if line.startswith(f"{a}: ")), None)
        if who is not None:
            out.append((who, line[len(who) + 2:]))
    return out


# -- a planner's delegation -------------------------------------------------------------------------

# an agent whose own prompt says it plans the work and hands it out to the team ("You plan ... give each one
# to a team member", "You are a planning agent ... you only plan and delegate tasks")
# ("Do the subtask the planner gives you", "check the plan" say no such thing); a description of the agent
# (AutoGen's selector lists them) says it in the third person: "Plans the work: ..."
_PLANS = re.compile(r"\b(?:you(?: \w+){0,3} (?:plan|delegate|assign)s?\b|planning\b|delegat\w*"
                    r"|assign(?:s|ing)? (?:\w+ ){0,2}?(?:tasks?|subtasks?|work)\b|hands? out\b)"
                    r"|^[ \t]*(?:plans|delegates|assigns)\b", re.I | re.M)
_TEAM = re.compile(r"\b(?:team|teammates?|members?|agents?|workers?|specialists?|others)\b", re.I)
# the form of a delegation a prompt asks for: "1. <agent> : <task>" (AutoGen's selector tutorial), "<member>: <subtask>"
_FORM = re.compile(r"(?P<num>\b1[.)][ \t]*)?<\s*(?:agent|agent name|member|team member|member name|worker|specialist|name)\s*>"
                   r"(?P<sep>[ \t]*(?::|-|->|=>)[ \t]*)<\s*(?:task|sub-?task|job|work|assignment|instruction)\s*>", re.I)
_SHORT_TASK = 60  # a task prompt longer than this is named "the task" in a delegation (a reply budget is small)


def delegates(system: str, agent: str, members: Iterable[str]) -> bool:
    """Whether ``agent``'s own prompt says it plans the work and hands it to other members: a planning
    word (plan, delegate, assign, subtask) outside the agents' names ("check the planner's result" is
    none), and the team (another member by name, or "team", "members", "agents").  The adapters' tool
    list is not the agent's own words."""
    text = system.split(TOOLS_HEADER)[0]
    others = [m for m in members if m != agent]
    named = any(re.search(rf"(?<!\w){re.escape(m)}(?!\w)", text) for m in others)
    for name in sorted([*others, agent], key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", " ", text)
    return bool(_PLANS.search(text)) and (named or bool(_TEAM.search(text)))


def delegation(system: str, names: list[str], subtask: str) -> str:
    """A planner's message handing ``subtask`` to each of ``names``, one line each, in the form its
    prompt asks for (``<member>: <subtask>``; numbered where the form is, ``1. <agent> : <task>``),
    else in AutoGen's selector-tutorial form ``1. <agent> : <task>``."""
    m = _FORM.search(system.split(TOOLS_HEADER)[0])
    number, sep = ("1. ", " : ") if m is None else (m.group("num") or "", m.group("sep"))
    return "\n".join(f"{f'{i}{number[1:]}' if number else ''}{name}{sep}{subtask}" for i, name in enumerate(names, 1))


# -- a reply whose start is forced: the call or the JSON object the request asks for ----------------

_POSITIVE = {"accept", "accepted", "approve", "approved", "correct", "right", "yes", "true", "pass", "passed", "good",
             "valid", "ok", "done", "success"}  # a verdict's positive value, as a schema's allowed values write it
_NEGATION = re.compile(r"^(?:not[ _-]?|in|un|non[ _-]?)", re.I)  # "not correct", "incorrect", "unsure": a negated value


@dataclass(frozen=True)
class Slot:
    """One field of a forced reply: its name, its kind (``enum``, ``boolean``, ``integer``, ``number``,
    ``string`` or ``other``) and, for ``enum``, its allowed values."""

    name: str
    kind: str
    values: tuple[Any, ...] = ()


def schema_slots(schema: dict[str, Any]) -> list[Slot]:
    """The fields of a JSON schema's object (its ``properties``)."""
    out = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        values = prop.get("enum")
        kind = "enum" if isinstance(values, list) and values else prop.get("type")
        out.append(Slot(name, kind if kind in ("enum", "boolean", "integer", "number", "string") else "other",
                        tuple(values) if kind == "enum" else ()))
    return out


def tool_slots(tool: Tool) -> list[Slot]:
    """The fields of a tool's arguments, as the adapters' tool list writes them (``describe_tools``)."""
    kinds = {"int": "integer", "integer": "integer", "float": "number", "number": "number", "bool": "boolean",
             "boolean": "boolean", "str": "string", "string": "string", "any": "string", "": "string"}
    out = []
    for (name, _), type_ in zip(tool.params, tool.types or ("",) * len(tool.params)):
        values = tuple(json.loads(v) for v in re.findall(r'"(?:[^"\\]|\\.)*"', type_)) if type_.startswith('"') else ()
        out.append(Slot(name, "enum", values) if values else Slot(name, kinds.get(type_, "other")))
    return out


def verdict_value(values: tuple[Any, ...], accept: bool) -> Any:
    """The allowed value that says ``accept`` (or rejects): the one that reads as positive ("correct",
    "yes", "pass"), or, of two, the one the other negates ("incorrect", "not funny"); else the first
    (accept) or the last (reject)."""
    text = [str(v).strip().lower() for v in values]
    good = [i for i, v in enumerate(text) if v in _POSITIVE]
    if not good and len(values) == 2:
        negated = [i for i, v in enumerate(text) if _NEGATION.sub("", v) == text[1 - i] and v != text[1 - i]]
        good = [1 - negated[0]] if len(negated) == 1 else []
    if accept:
        return values[good[0] if good else 0]
    if not good:
        return values[-1]
    return next((v for i, v in enumerate(values) if i not in good), values[-1])


def filled(slots: list[Slot], reply: str) -> dict[str, Any]:
    """``slots`` filled from the teacher's own ``reply``: an allowed value the reply is (a router's
    choice) or the verdict's, a boolean the verdict, a number the answer, a string the reply."""
    said = reply.strip()
    verdict = True if "ACCEPT" in said else False if "REJECT" in said else None
    answer = parse_answer(said)[0].get("answer")
    numbers = [n for n, _, _ in task_numbers(answer or said)]
    out: dict[str, Any] = {}
    for slot in slots:
        if slot.kind == "enum":
            named = [v for v in slot.values if str(v) == said or (isinstance(v, str) and v == said.split("\n")[0])]
            out[slot.name] = named[0] if named else verdict_value(slot.values, verdict is not False)
        elif slot.kind == "boolean":
            out[slot.name] = verdict is not False
        elif slot.kind in ("integer", "number"):
            value = float(numbers[0]) if numbers else 0.0
            out[slot.name] = int(value) if slot.kind == "integer" or value.is_integer() else value
        elif slot.kind == "string":
            out[slot.name] = " ".join(line.strip() for line in said.splitlines() if line.strip())  # one line
        else:
            out[slot.name] = None
    return out


# DSPy's ChatAdapter: the output fields in the system message ("2. `answer` (int): ..."), and the markers
# the last user message asks the reply to write them between ("Respond with the corresponding output
# fields, starting with the field `[[ ## reasoning ## ]]`, ... ending with the marker for `[[ ## completed ## ]]`")
_FIELD_LINE = re.compile(r"^\d+\. `(\w+)` \(([^)]*)\)", re.M)
_MARKER = re.compile(r"`\[\[ ## (\w+) ## \]\]`")
_FIELD_KINDS = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}


def asked_fields(messages: list[dict[str, str]]) -> list[Slot]:
    """The fields a request asks the reply to write between ``[[ ## name ## ]]`` markers, ending with
    ``[[ ## completed ## ]]`` (DSPy's ChatAdapter), in the order asked, each of the kind the system
    message gives it (``Literal['a', 'b']``: those values); [] where none are asked."""
    users = [m["content"] for m in messages if m.get("role") == "user"]
    ask = users[-1].rpartition("Respond with")[2] if users else ""
    names = _MARKER.findall(ask)
    if len(names) < 2 or names[-1] != "completed":
        return []
    system = "\n".join(m["content"] for m in messages if m.get("role") == "system")
    output = system.partition("Your output fields are:")[2]
    types = {name: type_.strip() for name, type_ in _FIELD_LINE.findall(output)}
    slots = []
    for name in names[:-1]:
        type_ = types.get(name, "str")
        values = tuple(re.findall(r"'([^']*)'", type_)) if type_.startswith("Literal[") else ()
        slots.append(Slot(name, "enum", values) if values else Slot(name, _FIELD_KINDS.get(type_, "other")))
    return slots


def fields_text(slots: list[Slot], reply: str) -> str:
    """The teacher's ``reply`` as the marked fields ``slots`` ask for, filled as a forced JSON object's are."""
    values = filled(slots, reply)
    parts = [f"[[ ## {slot.name} ## ]]\n{'' if values[slot.name] is None else values[slot.name]}" for slot in slots]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def in_asked_form(req: GenRequest, reply: str) -> str:
    """The teacher's ``reply`` in the form the request asks for (``meet_start`` for a forced start).
    Where nothing is forced and the reply calls no tool: the marked fields it asks for
    (``asked_fields``), or the JSON object its system message asks for (tools offered beside the
    format, so the start is not forced: an AutoGen agent with tools and ``output_content_type``)."""
    system, prefix = system_text(req), req.prefix
    if not prefix and tool_call_start() not in reply:
        slots = asked_fields(req.messages or [])
        if slots:
            return fields_text(slots, reply)
        if asked_format(system) is not None:
            prefix = JSON_START
    return meet_start(prefix, reply, system)


def system_text(req: GenRequest) -> str:
    """The request's system messages, joined."""
    return "\n".join(m["content"] for m in req.messages or [] if m.get("role") == "system")


def meet_start(prefix: str, reply: str, system: str) -> str:
    """The teacher's ``reply`` in the form a forced start asks for (module docstring): as it is where it
    already starts so; the reply's own call from where it starts; else the named (or the first offered)
    tool called with its arguments filled from the reply, or the JSON object the system message's
    schema describes (``{"reply": ...}`` for a plain JSON object)."""
    if not prefix or reply.startswith(prefix):
        return reply
    if prefix == JSON_START:
        fmt = asked_format(system)
        value = filled(schema_slots(fmt["schema"]), reply) if fmt and "schema" in fmt else {"reply": reply.strip()}
        return json.dumps(value, ensure_ascii=False)
    if prefix.startswith(tool_call_start()):
        at = reply.find(prefix)
        if at >= 0:  # the reply calls it (after its text: a report, then a handoff)
            return reply[at:]
        tools, name = offered_tools(system), forced_call_name(prefix)
        tool = next((t for t in tools if t.name == name), None) if name is not None else tools[0] if tools else None
        if tool is not None:
            return tool_call_text(tool.name, filled(tool_slots(tool), reply))
    return reply  # a start it cannot meet: the scripted backend says so, naming it


@dataclass(frozen=True)
class FrameworkTeacher:
    """The generic teacher of an AutoGen or LangGraph team (module docstring): every agent speaks,
    a planner delegates, agents hand off where they can and answer ``ANSWER: <gold>``; the stop words
    go to the agent whose prompt asks for them; weakness ``p_skip``/``p_slip``."""

    book: TaskBook = field(compare=False)
    members: tuple[str, ...]  # the agents that do the work, in YAML order
    routers: tuple[str, ...]  # the agents whose reply names who speaks next
    parsers: Mapping[str, str]  # agent -> its YAML parser
    terminations: tuple[tuple[str, tuple[str, ...] | None], ...] = ()  # the team's (stop text, sources or None)
    p_skip: float = 0.5
    p_slip: float = 0.5
    # agent -> its system prompt: as the kind gave it (or the YAML role), then as each request shows it
    prompts: dict[str, str] = field(default_factory=dict, compare=False)

    def __call__(self, req: GenRequest, rng: random.Random) -> str:
        return in_asked_form(req, self._reply(req, rng))

    def _reply(self, req: GenRequest, rng: random.Random) -> str:
        messages = req.messages or []
        task = self.book.find(messages)
        skip = random.Random(f"framework-teacher/{task.task_id}").random() < self.p_skip  # one choice per episode
        system = "\n".join(m["content"] for m in messages if m.get("role") == "system")
        if system.strip() and req.agent is not None:
            self.prompts[req.agent] = system  # its own words: what it asks for, whether it plans
        chat = [m for m in messages if m.get("role") != "system"]
        subtask = self._subtask(task)
        lines = said_by(transcript(chat, task), self.members)
        said = [(a, text) for a, text in lines if _key(text) != subtask]  # a delegation's line is no member's turn
        spoke = list(dict.fromkeys(a for a, _ in said))
        if req.agent in self.routers:
            return self._route(chat, system, said, skip, task)
        tools = offered_tools(system)
        mine = called(chat, tools)
        pending = [] if skip else [a for a in self.members if a not in spoke and a != req.agent]
        targets = {t.name[len(HANDOFF):]: t.name for t in tools if t.name.startswith(HANDOFF)}
        handoffs = {a: name for a, name in targets.items() if a in self.members and a != req.agent}  # not to "user"
        answers = answer_tool(tools)
        work = [t for t in tools if not t.name.startswith(HANDOFF) and t is not answers]
        as_tools = agent_tools(work, system)  # agents as tools: each called once, in the order the prompt names them
        left = [t for t in as_tools if t.name not in mine]
        if left and not skip:
            return tool_call_text(left[0].name, {left[0].params[0][0]: agent_tool_input(task.prompt, tool_results(chat))})
        if work and not as_tools and not skip and not any(t.name in mine for t in work):
            call = self._tool_call(work, task)
            if call is not None:
                return call
        if handoffs and pending:  # to the agent named for the task's operation first (a triage's tutors), else in order
            order = sorted(pending, key=lambda a: not (a in handoffs and names_task_operation(handoffs[a], task.prompt)))
            target = next((a for a in order if a in handoffs), None)
            if target is not None:
                return tool_call_text(handoffs[target], {})
            back = next((a for a in reversed(spoke) if a in handoffs), None)  # an agent that can reach the others
            if back is not None and sum(name.startswith(HANDOFF) for name in mine) < len(self.members):
                return f"ANSWER: {task.answer.strip()}\n{tool_call_text(handoffs[back], {})}"  # report, then hand back
        # it reaches the others by its tools
        by_tool = bool(handoffs) or bool(as_tools) or any(t.name in self.members for t in tools)
        if pending and not by_tool and delegates(system, req.agent, self.members):
            return delegation(system, self._protocol_order(pending), subtask)
        reply = self._answer(req.agent, task, said, system, final=not pending, skip=skip, rng=rng)
        owner = None if pending else next((a for a in self._owners_of_words(req.agent, system) if a in handoffs), None)
        if owner is not None:
            return f"{reply}\n{tool_call_text(handoffs[owner], {})}"  # the one who ends it
        if answers is not None:  # its framework takes the answer as this tool's argument
            return tool_call_text(answers.name, {answers.params[0][0]: reply})
        return reply

    # -- the moves --------------------------------------------------------------------------

    def _route(self, chat: list[dict[str, str]], system: str, said: list[tuple[str, str]], skip: bool, task: Task) -> str:
        last = next((m["content"] for m in reversed(chat) if m.get("role") == "user"), "")
        listed = _LISTED.findall(last)
        if listed:
            candidates = [n for n in re.findall(r"'([^']+)'", listed[-1]) if n in self.members]
        else:
            text = "\n".join([system, *(m["content"] for m in chat if m.get("role") == "user")])
            at = {a: m.start() for a in self.members if (m := re.search(rf"(?<!\w){re.escape(a)}(?!\w)", text))}
            candidates = sorted(at, key=at.get)
        answered = any(parse_answer(text)[1] for _, text in said)
        described = dict(said_by(before_task(chat, task), candidates))  # AutoGen's {roles}: "<name>: <description>"
        pending = self._protocol_order([a for a in candidates if a not in {a for a, _ in said}], described)
        if pending and not (skip and answered):
            return pending[0]
        finish = [w for w in asked_words(f"{system}\n{last}") if w not in self.members]
        if finish:
            return finish[0]
        enders = [a for a in candidates if self._stop_words(a, self.prompts.get(a, ""))]
        asking = [a for a in enders if self._asks(a)]  # its own prompt asks for the stop word: it ends the team
        return (asking or enders or candidates or list(self.members))[0]

    def _protocol_order(self, names: list[str], described: Mapping[str, str] | None = None) -> list[str]:
        """``names`` in the team's order: a member that plans first (its prompt says so, or the router's
        description of it: AutoGen's selector prompt lists each participant's), then the order in which
        the planner's prompt names them, then the agents' list order."""
        about = {a: f"{self.prompts.get(a, '')}\n{(described or {}).get(a, '')}" for a in self.members}
        planners = [a for a in self.members if delegates(about[a], a, self.members)]
        plan = "\n".join(about[a].split(TOOLS_HEADER)[0] for a in planners)
        at = {a: m.start() for a in names if (m := re.search(rf"(?<!\w){re.escape(a)}(?!\w)", plan))}
        return sorted(names, key=lambda a: (a not in planners, a not in at, at.get(a, 0), names.index(a)))

    @staticmethod
    def _subtask(task: Task) -> str:
        """What a delegation hands each member: the task's prompt, or "the task" where it is long."""
        prompt = _key(task.prompt)
        return prompt if len(prompt) <= _SHORT_TASK else "the task"

    @staticmethod
    def _tool_call(work: list[Tool], task: Task) -> str | None:
        """The call of one of the offered tools on the task: the first whose arguments the task fills
        (``tool_arguments``), a tool that names an operation the task has first (``subtract`` on ``9-4``)."""
        for tool in sorted(work, key=lambda t: not names_task_operation(t.name, task.prompt)):
            args = tool_arguments(tool, task.prompt)
            if args is not None:
                return tool_call_text(tool.name, args)
        return None

    def _answer(self, agent: str, task: Task, said: list[tuple[str, str]], system: str, final: bool, skip: bool,
                rng: random.Random) -> str:
        gold = task.answer.strip()
        if skip and re.fullmatch(r"-?\d+", gold) and rng.random() < self.p_slip:
            gold = str(slipped(int(gold), rng))
        lines = [f"ANSWER: {gold}"]
        if self.parsers.get(agent) == "verdict":  # accept the latest answer of another agent if it is the gold one
            claims = [parsed["answer"] for a, text in said if a != agent and (parsed := parse_answer(text)[0]).get("answer")]
            lines.append("ACCEPT" if claims and claims[-1].strip() == task.answer.strip() else "REJECT")
        if final:
            words = [w for w in self._stop_words(agent, system) if not any(w in line for line in lines)]  # e.g. ANSWER
            lines = [w for w in words if prefixed(system, w)] + lines + [w for w in words if not prefixed(system, w)]
        return "\n".join(lines)

    def _asks(self, agent: str, system: str | None = None) -> list[str]:
        """The capitalised words ``agent``'s own prompt asks it to write (not the agents' names)."""
        text = self.prompts.get(agent, "") if system is None else system
        return [w for w in asked_words(text) if w not in self.members and w not in self.routers]

    def _owners(self, word: str) -> list[str]:
        """The members whose own prompts ask for ``word`` (as far as the teacher has seen their prompts)."""
        return [a for a in self.members if word in self._asks(a)]

    def _stop_words(self, agent: str, system: str) -> list[str]:
        """The words with which ``agent`` ends the team: the capitalised words its own prompt asks for,
        and the team's text terminations it may trigger that no other member's prompt asks for (those
        are that member's to write)."""
        own = self._asks(agent, system)
        team = [text for text, sources in self.terminations if sources is None or agent in sources]
        return list(dict.fromkeys([*(w for w in team if w in own or not set(self._owners(w)) - {agent}), *own]))

    def _owners_of_words(self, agent: str, system: str) -> list[str]:
        """The members that write a team termination ``agent`` could trigger but leaves to them (their
        prompts ask for it): whom it hands back to when everyone has spoken."""
        own = self._asks(agent, system)
        team = [text for text, sources in self.terminations if sources is None or agent in sources]
        return list(dict.fromkeys(o for w in team if w not in own for o in self._owners(w) if o != agent))


def framework_teacher(cfg: Any, env: Any, knobs: Mapping[str, float], selector: str | None = None,
                      terminations: tuple[tuple[str, tuple[str, ...] | None], ...] = (),
                      prompts: Mapping[str, str] | None = None) -> FrameworkTeacher:
    """The framework teacher of ``cfg``'s AutoGen or LangGraph team, reading its tasks from ``env``
    (the teacher's own task stream).  ``selector``: the agent that picks speakers (a router), if
    the team has one; ``terminations``: its text terminations ``(text, sources or None)``;
    ``prompts``: the agents' system prompts where the kind can read them from the team's code (a
    factory's agents), else each agent's YAML ``role`` until its first request shows its own.
    Knobs: ``p_skip`` (0.5) and ``p_slip`` (0.5)."""
    names = [a.name for a in cfg.agents]
    routers = tuple(a.name for a in cfg.agents if a.name == selector or a.parser == "raw")
    return FrameworkTeacher(
        book=TaskBook(env, first=max(cfg.trainer.warmup.episodes, 1)),
        members=tuple(n for n in names if n not in routers),
        routers=routers,
        parsers={a.name: a.parser for a in cfg.agents},
        terminations=tuple(terminations),
        p_skip=float(knobs.get("p_skip", 0.5)),
        p_slip=float(knobs.get("p_slip", 0.5)),
        prompts={**{a.name: a.role for a in cfg.agents if getattr(a, "role", None)}, **dict(prompts or {})},
    )


def _check_arithmetic(env: Any) -> None:
    """The arithmetic teachers read their tasks from the messages: a custom task set must be arithmetic
    (``NoTeacher`` when it is not)."""
    for task in env.sample_tasks(20):
        if _EXPRESSION.fullmatch(task.prompt.strip()) is None:
            raise NoTeacher(f"the teacher plays arithmetic expressions such as 8-5; task {task.task_id!r} is {task.prompt[:60]!r}")


def solver_checker_teacher(cfg: Any, knobs: Mapping[str, float]) -> FrameworkChainTeacher | None:
    """A framework team of one answering and one verdict agent on arithmetic (``synthetic_math``,
    or a custom task set of arithmetic expressions): ``ChainTeacher`` on the task read from the
    framework's messages; None for any other team."""
    by_parser = {p: [a.name for a in cfg.agents if a.parser == p] for p in ("answer", "verdict")}
    env = cfg.env.name
    if env not in ("synthetic_math", "custom") or len(cfg.agents) != 2 or any(len(n) != 1 for n in by_parser.values()):
        return None
    if env == "custom":
        try:
            _check_arithmetic(build_env(cfg.env))
        except NoTeacher:
            return None
    solver, checker = by_parser["answer"][0], by_parser["verdict"][0]
    chain = ChainTeacher(p_direct=float(knobs.get("p_direct", 0.6)), p_slip=float(knobs.get("p_slip", 0.3)),
                         p_lazy=float(knobs.get("p_lazy", 0.8)), solver=solver)
    return FrameworkChainTeacher(chain, solver=solver, checker=checker)


# ---------------------------------------------------------------------------------------------
# the arithmetic teachers of framework teams: where the task sits in their messages
# ---------------------------------------------------------------------------------------------

# an arithmetic chain such as 8-5 or 3 + 4 - 2, not inside a word or a decimal; linear: the runs of
# digits and of blanks are separated by the operator
_EXPRESSION = re.compile(r"(?<![\w.])-?\d+(?:[ \t]*[-+][ \t]*\d+)+(?![\w.])")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


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
        return in_asked_form(req, self.chain(dataclasses.replace(req, messages=chained), rng))


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
        return in_asked_form(req, self._reply(req, rng))

    def _reply(self, req: GenRequest, rng: random.Random) -> str:
        a, op, b, _ = chain_steps(arithmetic_task(req.messages or []))[0]
        route = dict(self.specialist_for)
        if req.agent == self.selector:
            if rng.random() < self.p_misroute:
                return next(name for o, name in self.specialist_for if o != op)
            return route[op]
        own = next(o for o, name in self.specialist_for if name == req.agent)
        return f"ANSWER: {a + b if own == '+' else a - b}"
