"""The framework examples of ``kind: openai`` (examples/README.md): teams written as the OpenAI
Agents SDK's, AutoGen's, LangGraph's, smolagents' and DSPy's docs write them, each talking to the endpoint
mas serves with only base_url, the API key and the model names changed.  Each trains one step on
the embedded model through the endpoint, and the framework teacher plays each one through its own
framework code (the SDK's handoff, AutoGen's round robin, the graph's conditional edge).

Also the import-name trap: the OpenAI Agents SDK imports as ``agents``, the name of this
repository's ``agents/`` folder (installed as ``mas.agents``); from the repository root, with the
current directory first on ``sys.path``, ``import agents`` must still find the SDK
(``mas.refs.shield_checkout_folders``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mas
from mas.refs import _CheckoutShield
from mas.training.warmup import scripted_teacher, teacher_demonstrations

REPO = Path(__file__).parents[1]
EXAMPLES = {  # config -> its agents
    "openai_agents_as_tools": {"orchestrator", "solver", "checker"},
    "openai_agents_handoffs": {"triage", "addition_tutor", "subtraction_tutor"},
    "openai_autogen_reflection": {"primary", "critic"},
    "openai_dspy_program": {"solver", "checker"},
    "openai_langgraph_evaluator": {"generator", "evaluator"},
    "openai_smolagents_manager": {"manager", "calculator"},
}
SMALL = ["trainer.steps=1", "trainer.batch_size=1", "trainer.group_size=2", "trainer.eval_size=0", "logging.progress=false",
         "trainer.warmup.steps=0"]
# smolagents' own system prompt makes every prompt about 4,000 embedded tokens: shorter replies keep the step short;
# the evaluator's grade is structured output, which an untrained policy does not write (its episodes would fail in
# LangChain's parser): its shipped warm-up first (about 5 s)
SHORTER = {"openai_smolagents_manager": ["agents.manager.sampling.max_new_tokens=16",
                                         "agents.calculator.sampling.max_new_tokens=16"],
           "openai_langgraph_evaluator": ["trainer.warmup.steps=30"]}


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def example(request):
    """(name, team) of one example, loaded from the repository root as `mas train configs/<name>.yaml` does."""
    here = os.getcwd()
    os.chdir(REPO)  # the entry point is found from the current directory, as with `python -m`
    try:
        team = mas.load_team(f"configs/{request.param}.yaml", SMALL + SHORTER.get(request.param, []))
    finally:
        os.chdir(here)
    with team:
        yield request.param, team


def test_the_examples_are_the_shipped_openai_framework_configs():
    shipped = {p.stem for p in (REPO / "configs").glob("openai_*.yaml")} - {"openai_team"}  # openai_team: tests/topologies
    assert shipped == set(EXAMPLES)
    for name in EXAMPLES:
        assert (REPO / "examples" / f"{name}.py").is_file()
        assert f"entry: examples.{name}:run_team" in (REPO / "configs" / f"{name}.yaml").read_text()


def test_an_example_trains_one_step_through_the_endpoint(example, tmp_path):
    name, team = example
    assert {a.name for a in team.cfg.agents} == EXAMPLES[name]
    mas.train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("kind", "step") == "step" and "eval" not in r][-1]
    # no episode fails, but where the config trains failed episodes (DSPy's, which an untrained policy fails on
    # the reply DSPy cannot parse): each failure is then one the team's code raised, trained at reward 0
    trained_failures = step.get("failed_episodes_trained", 0)
    assert step["step"] == 0 and step["episodes"]["count"] == 2 and step["episodes"]["errors"] == trained_failures, step
    assert trained_failures == 0 or team.cfg.trainer.train_failed == ("agent_error",)
    spoke = {agent for agent, stats in step["agents"].items() if stats["turns"] > 0}
    first = {"openai_agents_as_tools": "orchestrator", "openai_agents_handoffs": "triage",
             "openai_autogen_reflection": "primary", "openai_dspy_program": "solver", "openai_langgraph_evaluator": "generator",
             "openai_smolagents_manager": "manager"}[name]
    assert first in spoke  # the framework's code asked for the agent by its model name
    for agent in spoke:  # each agent that spoke trained its own policy on the turns the endpoint recorded
        policy = team.cfg.agent(agent).policy
        assert policy in step["policies"] and math.isfinite(step["policies"][policy]["loss"])
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    for turn in (t for e in episodes for t in e["turns"]):  # token in, token out: what was sampled is what is trained
        assert turn["completion_ids"] == turn["logprobs"] > 0 and turn["prompt_ids"] > 0


def teacher_turns(team):
    """(agent, text) of the framework teacher's demonstrations on 4 training tasks, and its reward."""
    demos, reward = teacher_demonstrations(team, 4, scripted_teacher(team.cfg, {"p_skip": 0.0}), seed=0)
    out = []
    for agent, (_, completion) in demos:
        tok = team.runtime.tokenizers[team.agents[agent].policy]
        out.append((agent, tok.decode(completion[:-1])))
    return out, reward


def test_the_framework_teacher_plays_each_team_through_its_own_framework_code(example):
    name, team = example
    turns, reward = teacher_turns(team)
    assert reward == 1.0  # the teacher's answers reach the env through the framework's own control flow
    spoke = [a for a, _ in turns]
    if name == "openai_agents_handoffs":  # the SDK ran the handoff the triage agent wrote, and the tutor answered
        assert all('"name": "transfer_to_' in t for a, t in turns if a == "triage")
        assert spoke.count("triage") == 4 and len(spoke) == 8 and set(spoke) - {"triage"} <= EXAMPLES[name]
    elif name == "openai_autogen_reflection":  # the round robin stopped on the critic's APPROVE
        assert spoke == ["primary", "critic"] * 4 and all(t == "APPROVE" for a, t in turns if a == "critic")
    elif name == "openai_langgraph_evaluator":  # the conditional edge ended the graph on the evaluator's grade
        assert spoke == ["generator", "evaluator"] * 4
        # structured output: the JSON after the forced '{', its grade the one the guide's route reads
        assert all(t.startswith('"grade": "correct", "feedback": "ANSWER: ') for a, t in turns if a == "evaluator")
    elif name == "openai_dspy_program":  # each module's fields between DSPy's markers, as its ChatAdapter asks
        assert spoke == ["solver", "checker"] * 4
        for _, text in turns:
            assert text.startswith("[[ ## reasoning ## ]]\nANSWER: ") and text.endswith("\n\n[[ ## completed ## ]]")
            assert "\n\n[[ ## answer ## ]]\n" in text
    elif name == "openai_smolagents_manager":  # every step a tool call (smolagents asks for one): the work, then final_answer
        assert spoke == ["manager", "calculator", "calculator", "manager"] * 4
        # each demonstration is what follows the forced start <tool_call>{"name": " (smolagents' tool_choice 'required')
        assert [t.split('", "arguments": ')[0] for _, t in turns[:4]] == ["calculator", "calculate", "final_answer",
                                                                           "final_answer"]
        assert all('"arguments": {"answer": "ANSWER: ' in t for _, t in turns[2::4] + turns[3::4])  # the env's format
    else:
        assert set(spoke) == EXAMPLES[name]


# --- the import-name trap: `agents` is the OpenAI Agents SDK, mas's folder is mas.agents ----------------------


def test_import_agents_from_the_repository_root_finds_the_sdk_once_mas_is_imported():
    import agents

    import mas.agents

    assert hasattr(agents, "Runner") and Path(agents.__file__).parent != REPO / "agents"
    assert Path(mas.agents.__file__).parent == REPO / "agents"  # mas's own folder is still mas.agents
    run = {"cwd": REPO, "env": {**os.environ, "PYTHONPATH": ""}, "capture_output": True, "text": True, "timeout": 120}
    where = "import agents, pathlib; print(pathlib.Path(agents.__file__).parent)"
    bare = subprocess.run([sys.executable, "-c", where], **run)
    assert bare.stdout.strip() == str(REPO / "agents")  # the trap: plain Python at the root finds the folder
    shielded = subprocess.run([sys.executable, "-c", "import mas; " + where], **run)
    assert shielded.returncode == 0 and shielded.stdout.strip() != str(REPO / "agents"), shielded.stderr


def test_the_shield_finds_no_top_level_agents_rather_than_mas_folder(monkeypatch):
    shield = _CheckoutShield()
    monkeypatch.setattr(sys, "path", [str(REPO)])  # only the checkout: no installed SDK to find
    with pytest.raises(ModuleNotFoundError, match="mas.agents, not a top-level package") as e:
        shield.find_spec("agents")
    assert e.value.name == "agents"
    assert shield.find_spec("agents.policy", [str(REPO / "agents")]) is None  # submodules: not its business
    assert shield.find_spec("json") is None  # other names: not its business


def test_the_shield_leaves_a_users_own_agents_folder_alone(tmp_path, monkeypatch):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(REPO), *sys.path])
    spec = _CheckoutShield().find_spec("agents")
    assert spec is not None and Path(spec.origin).parent == tmp_path / "agents"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(REPO), os.getcwd())])
    assert _CheckoutShield().find_spec("agents") is None  # the checkout's root not on sys.path: nothing to shadow
