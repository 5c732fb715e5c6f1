"""An agent that never speaks, and a policy that gets no samples, are warned about once and
then counted: on the progress line, in warnings.jsonl, at the end of the run and in the report.

The team is the orchestrator team of ``team_helpers`` with a scripted lead that always answers
at once: helper and checker are never called, and checker's policy (judge, trainable here) has
no turn to learn from in any step."""

from __future__ import annotations

import json

from team_helpers import team_config

from mas.config.schema import validate_config
from mas.report import load_run, write_report
from mas.rollout.backends.scripted import ScriptedBackend
from mas.training.metrics import Silence
from mas.training.team import build_team
from mas.training.trainer import train


def lone_lead_team(model_dir, tokenizer, steps: int = 3):
    cfg = team_config(model_dir, "orchestrator", frozen_checker=False)
    cfg["trainer"] = {**cfg["trainer"], "steps": steps, "save_every": 1}
    team = build_team(validate_config(cfg))
    team.backend = ScriptedBackend(lambda req: "ANSWER: 5", {p: tokenizer for p in cfg["policies"]})
    return team


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_silent_agent_and_a_policy_without_samples_are_warned_once_then_counted(tiny_model_dir, tiny_tokenizer,
                                                                                  tmp_path, capsys):
    run = tmp_path / "run"
    train(lone_lead_team(tiny_model_dir, tiny_tokenizer), run)
    steps = [r for r in read(run / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert all(r["silent_agents"] == ["helper", "checker"] and r["idle_policies"] == ["judge"] for r in steps)
    assert all(r["policies"]["judge"]["samples"] == 0 and r["policies"]["main"]["samples"] > 0 for r in steps)

    warnings = read(run / "warnings.jsonl")  # the first step only: later ones are counted, not warned again
    assert [(w["kind"], w["step"]) for w in warnings] == [("silent_agent", 0), ("silent_agent", 0), ("no_samples", 0)]
    assert warnings[0]["message"].startswith("agent 'helper' did not speak in any of the 8 episodes of step 0")
    assert warnings[1]["message"].startswith("agent 'checker' did not speak")
    assert warnings[2]["message"].startswith("policy 'judge' got no samples in step 0, so its weights did not change: "
                                             "none of its agents (checker) spoke")
    out = capsys.readouterr().out
    assert out.count("warning: agent 'helper' did not speak") == 1
    assert "agent 'helper' has not spoken in 3 of 3 steps (first in step 0)" in out
    assert "policy 'judge' got no samples in 3 of 3 steps (first in step 0)" in out

    html = write_report(run).read_text()
    assert "agents that did not speak</b> helper in 3 of 3 steps (first: step 0); checker in 3 of 3 steps" in html
    assert "policies without samples</b> judge in 3 of 3 steps (first: step 0)" in html
    assert "While training: 3 warnings" in html  # the banner: the first-time warnings


def test_a_resumed_run_keeps_counting_and_does_not_warn_again(tiny_model_dir, tiny_tokenizer, tmp_path, capsys):
    run = tmp_path / "run"
    train(lone_lead_team(tiny_model_dir, tiny_tokenizer), run, stop_after=2)
    capsys.readouterr()
    train(lone_lead_team(tiny_model_dir, tiny_tokenizer), run, resume=True)
    out = capsys.readouterr().out
    assert "warning:" not in out  # step 0's warnings were given in the first segment
    assert "agent 'checker' has not spoken in 3 of 3 steps (first in step 0)" in out
    assert [w["step"] for w in read(run / "warnings.jsonl")] == [0, 0, 0]


def test_the_count_goes_on_the_progress_line():
    silence = Silence({"lead": "main", "helper": "main", "writer": "pen"})
    step = {"step": 0, "episodes": {"count": 4}, "silent_agents": ["writer"], "idle_policies": ["pen"]}
    first = silence.observe(step)
    assert [k for k, _ in first] == ["silent_agent", "no_samples"]
    assert "none of its agents (writer) spoke" in first[1][1]
    for s in (1, 2, 3, 4):
        assert silence.observe({**step, "step": s}) == []
    assert silence.brief() == {"silent": "writer×5", "no samples": "pen×5"}
    assert silence.closing() == ["agent 'writer' has not spoken in 5 of 5 steps (first in step 0)",
                                 "policy 'pen' got no samples in 5 of 5 steps (first in step 0)"]
    # a policy whose agents spoke but whose turns were all left out gets the other reason
    other = Silence({"lead": "main"}).observe({"step": 7, "episodes": {"count": 2}, "silent_agents": [],
                                               "idle_policies": ["main"]})
    assert "its agents' turns (lead) were all left out of the update" in other[0][1]
    # a step of an older run (no lists) counts nothing; an agent that speaks again is not un-counted
    assert Silence({}).observe({"step": 0, "episodes": {"count": 1}}) == []
    rebuilt = Silence.from_records({"writer": "pen"}, [step, {**step, "step": 1}])
    assert rebuilt.brief() == {"silent": "writer×2", "no samples": "pen×2"} and rebuilt.observe({**step, "step": 2}) == []


def test_the_report_counts_silent_agents_of_an_older_run_from_its_step_records(tiny_model_dir, tiny_tokenizer, tmp_path):
    """A run written before ``silent_agents`` / ``idle_policies`` existed: the agents missing from a
    step's ``agents`` and the policies whose update had 0 samples are counted instead."""
    run = tmp_path / "run"
    train(lone_lead_team(tiny_model_dir, tiny_tokenizer, steps=2), run)
    rows = read(run / "metrics.jsonl")
    for r in rows:
        for key in ("silent_agents", "idle_policies", "kind"):
            r.pop(key, None)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "warnings.jsonl").unlink()
    assert len(load_run(run).steps) == 2
    html = write_report(run).read_text()
    assert "helper in 2 of 2 steps (first: step 0); checker in 2 of 2 steps" in html
    assert "judge in 2 of 2 steps (first: step 0)" in html
