"""The framework examples written the way AutoGen's and LangGraph's docs write their teams
(examples/README.md) train with mas on the embedded model, and the generic framework teacher
(mas/training/framework_teacher.py) warms any of them up: every agent gets demonstrations of its
part, in its own format, played through the team's own code."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
from test_config import uncommented_keys

import mas
from mas.cli import main
from mas.tools import has_tool_call, parse_tool_calls
from mas.rollout.backends.base import GenRequest
from mas.topologies.adapters import describe_tools, tool_schema
from mas.topologies.framework_teaching import FrameworkTeacher, TaskBook, asked_words, offered_tools, prefixed
from mas.training.warmup import scripted_teacher, teacher_demonstrations
from mas.types import Task

REPO = Path(__file__).parents[1]
# LangGraph 1.x points create_react_agent users at langchain, which is not installed here
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
EXAMPLES = {  # example -> its agents
    "autogen_selector_planner": {"selector", "planner", "calculator", "checker"},
    "autogen_swarm": {"planner", "calculator", "checker"},
    "langgraph_supervisor": {"supervisor", "calculator", "checker"},
    "langgraph_network": {"calculator", "checker"},
}
SMALL = ["trainer.steps=1", "trainer.batch_size=1", "trainer.group_size=2", "trainer.eval_size=0", "logging.progress=false",
         "trainer.warmup.steps=2", "trainer.warmup.episodes=4", "trainer.warmup.batch_size=4", "trainer.warmup.eval=false"]
# the supervisor's choice is structured output (a Router call), which 2 warm-up steps do not teach: its episodes would
# fail in LangChain's parser
LONGER = {"langgraph_supervisor": ["trainer.warmup.steps=40", "trainer.warmup.episodes=8"]}


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def example(request):
    """(name, team) of one example, loaded from the repository root as `mas train examples/<name>.yaml` does."""
    here = os.getcwd()
    os.chdir(REPO)  # the factory/builder is found from the current directory, as with `python -m`
    try:
        team = mas.load_team(f"examples/{request.param}.yaml", SMALL + LONGER.get(request.param, []))
    finally:
        os.chdir(here)
    with team:
        yield request.param, team


def read_back(team, demos):
    """(agent, text, valid) of each demonstration, read with the agent's own parser."""
    out = []
    for agent, (_, completion) in demos:
        tok = team.runtime.tokenizers[team.agents[agent].policy]
        assert completion[-1] == tok.eos_token_id
        text = tok.decode(completion[:-1])
        out.append((agent, text, team.agents[agent].parse(text)[1]))
    return out


# --- the examples train: one step through the path `mas train` takes ---------------------------------------


def test_the_example_configs_validate_and_comment_every_field(capsys):
    assert {p.stem for p in (REPO / "examples").glob("*.yaml")} == set(EXAMPLES)
    for name in EXAMPLES:
        path = f"examples/{name}.yaml"
        assert uncommented_keys((REPO / path).read_text()) == [], name
        here = os.getcwd()
        os.chdir(REPO)
        try:
            assert main(["validate", "-q", path]) == 0
        finally:
            os.chdir(here)
        assert f"{path}: ok" in capsys.readouterr().out



def test_an_example_trains_one_step_after_its_automatic_warm_up(example, tmp_path):
    name, team = example
    assert {a.name for a in team.cfg.agents} == EXAMPLES[name]
    summary = mas.train(team, tmp_path / "run")
    warmup = summary["warmup"]
    assert warmup["source"] == "teacher" and warmup["teacher_reward"] is not None  # the framework teacher played the team
    assert set(warmup["policies"]) == {a.policy for a in team.cfg.agents}  # every agent had demonstrations
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("kind") == "step"][-1]
    assert step["step"] == 0 and step["episodes"]["count"] == 2 and step["episodes"]["errors"] == 0
    spoke = {agent for agent, stats in step["agents"].items() if stats["turns"] > 0}
    assert spoke, "no agent spoke"
    for agent in spoke:  # each agent that spoke trained its own policy on its turns
        policy = team.cfg.agent(agent).policy
        assert policy in step["policies"] and policy not in step["idle_policies"], (agent, step["idle_policies"])
        assert math.isfinite(step["policies"][policy]["loss"])


# --- the framework teacher on the examples ---------------------------------------------------------------------


def test_the_framework_teacher_demonstrates_every_agents_part_in_its_format(example):
    name, team = example
    teacher = scripted_teacher(team.cfg, {"p_skip": 0.0})
    assert isinstance(teacher, FrameworkTeacher)  # no hand-written teacher knows these teams
    demos, reward = teacher_demonstrations(team, 4, teacher, seed=0)
    turns = read_back(team, demos)
    assert {a for a, _, _ in turns} == EXAMPLES[name]  # every agent speaks
    # each parses with its parser, but a planner's delegation: a plan, not an answer (its parser reads the summary)
    delegations = [t for a, t, valid in turns if name == "autogen_selector_planner" and a == "planner" and not valid]
    assert [(a, t) for a, t, valid in turns if not valid and not has_tool_call(t) and t not in delegations] == []
    assert reward == 1.0  # without its weakness the teacher answers every task right
    calls = {(a, c.name) for a, t, _ in turns for c in parse_tool_calls(t)}
    assert ("calculator", "calculate") in calls  # the specialist uses its tool
    if name == "autogen_swarm":  # the planner hands off to each specialist, and they hand back
        assert {("planner", "transfer_to_calculator"), ("planner", "transfer_to_checker"),
                ("calculator", "transfer_to_planner")} <= calls
    if name == "langgraph_supervisor":  # the supervisor routes to each worker, then finishes: structured output, the
        # arguments of the Router call whose start is forced
        routes = [json.loads(t.removesuffix("}</tool_call>"))["next"] for a, t, _ in turns if a == "supervisor"]
        assert routes.count("calculator") == routes.count("checker") == routes.count("FINISH") == 4
    if name == "autogen_selector_planner":
        assert {t for a, t, _ in turns if a == "selector"} == {"planner", "calculator", "checker"}
        assert sum("TERMINATE" in t for a, t, _ in turns) == 4  # one agent per episode ends the chat
        assert len(delegations) == 4 and all("calculator" in t and "ANSWER" not in t for t in delegations)  # it plans first


def test_the_framework_teachers_weakness_answers_at_once_and_slips(example):
    name, team = example
    demos, reward = teacher_demonstrations(team, 4, scripted_teacher(team.cfg, {"p_skip": 1.0, "p_slip": 1.0}), seed=0)
    turns = read_back(team, demos)
    assert reward == 0.0  # every episode answered at once, wrongly
    assert not any(c.name == "calculate" for _, t, _ in turns for c in parse_tool_calls(t))  # nobody consulted
    assert "checker" not in {a for a, _, _ in turns}


# --- the teacher's reading of a request (no model) -------------------------------------------------------------


class Stream:
    """A task stream: task k is ``k+1`` plus ``k``."""

    def __init__(self):
        self.k = 0

    def sample_tasks(self, n):
        out = [Task(f"t{i}", f"{i + 1}+{i}", str(2 * i + 1)) for i in range(self.k, self.k + n)]
        self.k += n
        return out


def test_the_task_book_finds_a_whole_task_and_reads_on_in_its_stream():
    book = TaskBook(Stream(), first=2, most=64)
    assert book.find([{"role": "user", "content": "user: 2+1"}]).answer == "3"
    assert book.find([{"role": "system", "content": "e.g. 1+0"}, {"role": "user", "content": "What is 40+39?"}]).answer == "79"
    assert book.read >= 40  # it read on in the stream to find task 39
    with pytest.raises(KeyError, match="training tasks only"):
        book.find([{"role": "user", "content": "12+1 and 1+00 and 1+0.5 and 13+11"}])  # no whole task: 2+1 inside 12+1 ...
    with pytest.raises(KeyError, match="training tasks only"):
        book.find([{"role": "system", "content": "1+0"}])  # the system message is never the task


def test_tools_and_stop_words_are_read_as_the_adapters_and_prompts_write_them():
    system = "You plan.\n\n" + describe_tools([
        tool_schema("calculate", "Evaluate it.", {"type": "object", "properties": {"expression": {"type": "string"}},
                                                  "required": ["expression"]}),
        tool_schema("transfer_to_checker", "Handoff to checker.", None)])
    tools = offered_tools(system)
    assert [(t.name, t.params) for t in tools] == [("calculate", (("expression", True),)), ("transfer_to_checker", ())]
    assert offered_tools("You plan.") == []
    asked = asked_words("When done, reply with FINISH. DO NOT guess. Give ANSWER: <n> and end with TERMINATE.")
    assert asked == ["FINISH", "TERMINATE"]
    assert asked_words("Say ACCEPT or REJECT.") == []
    assert prefixed("prefix your reply with FINAL ANSWER so", "FINAL ANSWER") and not prefixed("end with TERMINATE", "TERMINATE")


def teacher(**kw):
    return FrameworkTeacher(book=TaskBook(Stream(), first=8), members=("planner", "calculator", "checker"),
                            routers=("selector",), parsers={"checker": "verdict"}, **kw)


def ask(t, agent, *messages):
    return t(GenRequest("p", [], 1.0, 1.0, 0, 8, agent=agent, messages=[{"role": r, "content": c} for r, c in messages]),
             random.Random(0))


def test_a_router_names_who_has_not_spoken_then_one_who_can_end_the_team():
    t = teacher(terminations=(("TERMINATE", ("checker",)),), p_skip=0.0)
    prompt = ("Roles:\nplanner: plans\ncalculator: adds\n\nHistory:\nuser: 3+2\n{said}\n"
              "Pick one of ['planner', 'calculator', 'checker'].")
    assert ask(t, "selector", ("user", prompt.format(said=""))) == "planner"  # the roles list is not the history
    assert ask(t, "selector", ("user", prompt.format(said="planner: ANSWER: 5"))) == "calculator"
    assert ask(t, "selector", ("user", prompt.format(said="planner: x\ncalculator: 5\nchecker: ANSWER: 5"))) == "checker"
    t = teacher(p_skip=0.0)  # a supervisor with a finishing word and no list
    system = "Workers: calculator, planner. Reply with the next worker; when done, reply with FINISH."
    assert ask(t, "selector", ("system", system), ("user", "3+2")) == "calculator"
    assert ask(t, "selector", ("system", system), ("user", "3+2\ncalculator: ANSWER: 5\nplanner: ANSWER: 5")) == "FINISH"


def test_the_last_agent_to_speak_answers_with_the_stop_words_and_a_verdict_agent_judges():
    t = teacher(terminations=(("TERMINATE", None),), p_skip=0.0)
    assert ask(t, "planner", ("user", "3+2")) == "ANSWER: 5"  # others still to speak: no stop word yet
    assert ask(t, "planner", ("system", "Prefix your reply with FINAL ANSWER."),
               ("user", "3+2\ncalculator: ANSWER: 5\nchecker: ANSWER: 5 ACCEPT")) == "FINAL ANSWER\nANSWER: 5\nTERMINATE"
    assert ask(t, "checker", ("user", "3+2\nplanner: ANSWER: 5\ncalculator: ANSWER: 5")) == "ANSWER: 5\nACCEPT\nTERMINATE"
    assert ask(t, "checker", ("user", "3+2\nplanner: ANSWER: 5\ncalculator: ANSWER: 6")) == "ANSWER: 5\nREJECT\nTERMINATE"


def renamed_termination_team(clients):
    """The swarm example, on an AutoGen whose TextMentionTermination no longer has ``_termination_text``."""
    from examples.autogen_swarm import build

    team = build(clients)

    def strip(cond):
        if hasattr(cond, "_termination_text"):
            del cond._termination_text
        for child in getattr(cond, "_conditions", None) or ():
            strip(child)

    strip(team._termination_condition)
    return team


def test_an_autogen_without_the_private_termination_text_leaves_the_teacher_the_prompts_words_not_a_crash():
    from types import SimpleNamespace

    from mas.topologies.autogen import autogen_shape

    agents = ["planner", "calculator", "checker"]
    as_shipped = autogen_shape(SimpleNamespace(factory="examples.autogen_swarm:build"), agents)
    renamed = autogen_shape(SimpleNamespace(factory="test_framework_examples:renamed_termination_team"), agents)
    assert as_shipped[1] and renamed == (as_shipped[0], [])  # the selector still read; the words from the prompts
