"""The end of a run tells the story of its phases (issue 55): with a format warm-up, the held-out
result reads "before -> after warm-up -> after RL" and RL's gain is measured from the warm-up
(which lowers the start on purpose), the same in the terminal, summary.json, the report and
``mas study``; a team that starts at the ceiling is told it is a smoke test."""

from __future__ import annotations

import json

import pytest
import yaml
from team_helpers import team_config

from mas.cli import main, summary_lines
from mas.study.page import decoding_rows
from mas.training.metrics import held_out_story

# team_fork_n8's run from the issue: the warm-up took the team from 0.939 to 0.297, RL to 0.859
BEFORE, WARM, AFTER = {"accuracy": 0.939}, {"accuracy": 0.297}, {"accuracy": 0.859}


def test_a_warm_up_run_reads_before_after_warm_up_after_rl_with_rls_gain_from_the_warm_up():
    story = held_out_story(BEFORE, WARM, AFTER)
    assert story["rl_gain"] == pytest.approx(0.859 - 0.297) and story["total_gain"] == pytest.approx(0.859 - 0.939)
    assert story["rl_start"] == "warmup" and "ceiling" not in story
    lines = summary_lines({"eval_before": BEFORE, "eval_warmup": WARM, "eval_after": AFTER}, "accuracy")
    assert lines[0] == ("held-out team accuracy: before 0.939 -> after warm-up 0.297 -> after RL 0.859 "
                        "(RL +56.2 points from the warm-up; -8.0 overall, greedy)")


def test_without_a_warm_up_the_line_is_before_and_after():
    lines = summary_lines({"eval_before": {"accuracy": 0.27}, "eval_after": {"accuracy": 0.87}}, "accuracy")
    assert lines == ["held-out team accuracy: before 0.270 -> after 0.870 (+60.0 points, greedy)"]


def test_the_sampled_line_of_a_warm_up_run_starts_from_the_warm_up():
    def ev(acc, avg):
        return {"accuracy": acc, "sampled": {"k": 4, "avg": avg, "pass": avg}}
    lines = summary_lines({"eval_before": ev(0.9, 0.8), "eval_warmup": ev(0.3, 0.2), "eval_after": ev(0.8, 0.7)}, "accuracy")
    assert lines[1] == "held-out team accuracy, sampled (from the warm-up): avg@4 0.200 -> 0.700, pass@4 0.200 -> 0.700"


@pytest.mark.parametrize("start,noted", [(0.96, True), (0.9, True), (0.89, False)])
def test_a_team_that_starts_at_the_ceiling_is_told_it_is_a_smoke_test(start, noted):
    """langgraph_custom starts at 0.96-1.0 held-out: its summary says why it cannot show learning."""
    lines = summary_lines({"eval_before": {"accuracy": start}, "eval_after": {"accuracy": 1.0}}, "accuracy")
    note = [ln for ln in lines if ln.startswith("note: ")]
    assert bool(note) == noted
    if noted:
        assert f"started RL at {start:.3f} held-out, at or near the ceiling" in note[0] and "smoke test" in note[0]


def test_summary_json_and_the_terminal_carry_the_phases_of_a_warm_up_run(tmp_path, tiny_model_dir, capsys):
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"agent": "lead", "messages": [{"role": "user", "content": f"{a}+1"}],
                                         "completion": f"ANSWER: {a + 1}"}) + "\n" for a in range(4)))
    cfg = tmp_path / "team.yaml"
    cfg.write_text(yaml.safe_dump(team_config(tiny_model_dir, "orchestrator")))
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1", "trainer.eval_size=4", "trainer.eval_sampled_k=0",
                 "trainer.warmup.steps=1", "trainer.warmup.batch_size=2", f"trainer.warmup.demonstrations={demos}",
                 "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    story = summary["held_out"]
    assert story["before"] == summary["eval_before"]["accuracy"] and story["after_warmup"] == summary["eval_warmup"]["accuracy"]
    assert story["rl_gain"] == pytest.approx(summary["eval_after"]["accuracy"] - summary["eval_warmup"]["accuracy"])
    assert (f"held-out team accuracy: before {story['before']:.3f} -> after warm-up {story['after_warmup']:.3f} -> "
            f"after RL {story['after']:.3f} (RL {100 * story['rl_gain']:+.1f} points from the warm-up") in out

    from mas.report.page import _facts
    from mas.report.run import load_run

    facts = dict(_facts(load_run(run)))
    assert facts["held-out, phase by phase"].startswith(f"before {story['before']:.3f} -> after warm-up")


def test_the_study_reads_before_warm_up_and_final_and_gains_from_the_warm_up():
    from mas.study.analysis import decoding_summary

    def run(before, warm, final):
        return {"before_warmup": {"greedy": before}, "points": [{"steps": 0, "greedy": warm}, {"steps": 4, "greedy": final}]}

    d = decoding_summary([run(0.9, 0.3, 0.8), run(0.8, 0.5, 0.6)])
    assert d["before_warmup"]["greedy"] == pytest.approx(0.85) and d["start"]["greedy"] == pytest.approx(0.4)
    rows = decoding_rows({"table": [{"method": "grpo", "decodings": d}], "baseline": "grpo"})
    assert rows[0]["greedy"] == "0.850 → warm-up 0.400 → 0.700"
