"""The OpenAI Agents SDK's "agents as tools" example (examples/openai_agents_as_tools.py): an
orchestrator that calls a solver agent and a checker agent through ``as_tool`` tools, then answers.
Every agent speaks in an episode that follows the protocol, which is what the triage team of
handoffs cannot give (it asks one tutor per task).

The embedded model was never taught this team, and an untrained one rarely writes a whole tool
call, so here the framework teacher (the warm-up's, with no deliberate weakness) is the model
behind the endpoint: the SDK's own code runs the tool calls it writes, and the test checks the
protocol's five turns, then that one RL step records every agent's turns and updates each one's policy on them.
``tests/test_openai_framework_examples.py`` trains the config one step on the embedded model itself."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest

import mas
from mas.rollout.backends.scripted import ScriptedBackend
from mas.tools import parse_tool_calls
from mas.training.warmup import scripted_teacher, teacher_demonstrations

REPO = Path(__file__).parents[1]
SMALL = ["trainer.steps=1", "trainer.batch_size=2", "trainer.group_size=2", "trainer.eval_size=0", "logging.progress=false",
         "trainer.warmup.steps=0"]
PROTOCOL = ["orchestrator", "solver", "orchestrator", "checker", "orchestrator"]


@pytest.fixture(scope="module")
def team():
    here = os.getcwd()
    os.chdir(REPO)  # the entry point is found from the current directory, as with `python -m`
    try:
        team = mas.load_team("configs/openai_agents_as_tools.yaml", SMALL)
    finally:
        os.chdir(here)
    with team:
        yield team


def test_the_teacher_calls_the_solver_then_the_checker_with_the_proposed_answer(team):
    demos, reward = teacher_demonstrations(team, 4, scripted_teacher(team.cfg, {"p_skip": 0.0}), seed=0)
    assert reward == 1.0  # the orchestrator's answer reached the env through the SDK's run
    turns = []
    for agent, (prompt, completion) in demos:
        tok = team.runtime.tokenizers[team.agents[agent].policy]
        turns.append((agent, tok.decode(prompt), tok.decode(completion[:-1])))
    assert [a for a, _, _ in turns] == PROTOCOL * 4
    for episode in range(4):
        (_, task_prompt, solve), (_, _, solved), (_, _, check), (_, checker_prompt, checked), (_, _, final) = \
            turns[5 * episode:5 * episode + 5]
        ((name, args),) = [(c.name, c.arguments) for c in parse_tool_calls(solve)]
        task = args["input"]
        assert name == "solve_problem" and task in task_prompt
        ((name, args),) = [(c.name, c.arguments) for c in parse_tool_calls(check)]
        proposed = solved.removeprefix("ANSWER: ")
        assert (name, args) == ("check_answer", {"input": f"{task}\nProposed answer: {proposed}"})
        assert args["input"] in checker_prompt  # the SDK ran the checker agent on what the orchestrator passed
        assert checked == final == solved  # each answers in the env's format


def test_one_step_through_the_endpoint_records_and_updates_every_agent(team, tmp_path):
    teacher = scripted_teacher(team.cfg, {"p_skip": 0.0})
    rng = random.Random(0)
    engine_backend = team.backend
    team.backend = ScriptedBackend(lambda req: teacher(req, rng), team.runtime.tokenizers)
    try:
        mas.train(team, tmp_path / "run")
    finally:
        team.backend = engine_backend
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("kind", "step") == "step" and "eval" not in r][-1]
    assert step["episodes"]["count"] == 4 and step["episodes"]["errors"] == 0, step["episodes"]
    assert {a: s["turns"] for a, s in step["agents"].items()} == {"orchestrator": 12, "solver": 4, "checker": 4}
    for agent in ("orchestrator", "solver", "checker"):  # each one's policy updated on the turns the endpoint recorded
        loss = step["policies"][team.cfg.agent(agent).policy]["loss"]
        assert math.isfinite(loss)
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert episodes and [[t["agent"] for t in e["turns"]] for e in episodes] == [PROTOCOL] * len(episodes)
