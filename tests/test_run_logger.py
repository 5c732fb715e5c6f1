"""The run directory writer: warnings printed and kept for the report, and what each metrics.jsonl line is."""

from __future__ import annotations

import json

from team_helpers import team_config

from mas.config.schema import validate_config
from mas.training.metrics import RunLogger


def test_a_warning_is_printed_and_kept_in_warnings_jsonl(tiny_model_dir, tmp_path, capsys):
    logger = RunLogger(tmp_path / "run", validate_config(team_config(tiny_model_dir)), show_progress=False)
    logger.warn("the embedded model parsed 0% of lead's turns", kind="unparsed", step=0)
    logger.warn("second", kind="other")
    logger.close_progress()
    assert "warning: the embedded model parsed 0% of lead's turns" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "run" / "warnings.jsonl").read_text().splitlines()]
    assert rows == [{"step": 0, "kind": "unparsed", "message": "the embedded model parsed 0% of lead's turns"},
                    {"step": None, "kind": "other", "message": "second"}]


def test_a_warning_of_several_lines_prints_its_first_and_keeps_it_whole(tiny_model_dir, tmp_path, capsys):
    """An error a team's framework raised (DSPy's parse error quotes the whole reply) would fill the
    console between the progress lines: printed, it is its first line and where the rest is."""
    logger = RunLogger(tmp_path / "run", validate_config(team_config(tiny_model_dir)), show_progress=False)
    message = "step 3: 1 x agent_error, e.g. task 'syn-2-9': AdapterParseError: cannot parse.\n\nLM Response: [[ ## x\n"
    logger.warn(message, kind="fault.agent_error", step=3)
    logger.close_progress()
    out = capsys.readouterr().out
    assert out == ("warning: step 3: 1 x agent_error, e.g. task 'syn-2-9': AdapterParseError: cannot parse. "
                   "[...; whole message in warnings.jsonl]\n")
    [row] = [json.loads(line) for line in (tmp_path / "run" / "warnings.jsonl").read_text().splitlines()]
    assert row["message"] == message


def test_a_run_without_warnings_has_an_empty_warnings_jsonl_and_every_metrics_line_says_its_kind(tiny_model_dir, tmp_path):
    """warnings.jsonl is there (empty) from the start; metrics.jsonl's lines carry ``kind``: the
    evaluation before training comes first, then one "step" line per step, then the one after,
    as docs/report.md says; the report reads the run, and the same run without ``kind`` (written
    before it existed), alike."""
    from pathlib import Path

    from team_helpers import varied_reward

    from mas.report import load_run, write_report
    from mas.training.metrics import RECORD_KINDS, record_kind
    from mas.training.team import build_team
    from mas.training.trainer import train

    cfg = team_config(tiny_model_dir, "chain")
    cfg["trainer"].update(steps=2, eval_size=2)
    team = build_team(validate_config(cfg))
    team.engine.score = varied_reward
    run = tmp_path / "run"
    train(team, run)
    assert (run / "warnings.jsonl").read_text() == ""  # the chain: every agent speaks, every policy learns
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("eval", r.get("step"))) for r in rows] == [("eval", "before"), ("step", 0), ("step", 1),
                                                                         ("eval", "after")]
    assert [record_kind(r) for r in rows] == [r["kind"] for r in rows]

    docs = (Path(__file__).parents[1] / "docs" / "report.md").read_text()
    for kind in RECORD_KINDS:  # the docs name every kind a line can be
        assert f'"kind": "{kind}"' in docs, kind
    assert "first line" in docs and "warnings.jsonl" in docs

    new = load_run(run)
    assert new.warnings == [] and [m["step"] for m in new.steps] == [0, 1] and set(new.evals) == {"before", "after"}
    assert '<div class="banner"' not in write_report(run).read_text()  # an empty warnings file: no banner

    old = tmp_path / "old"  # the same run as an older version wrote it: no kind, no warnings.jsonl
    old.mkdir()
    for name in ("config.yaml", "run_info.json", "episodes.jsonl", "summary.json"):
        (old / name).write_text((run / name).read_text())
    (old / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "kind"}) + "\n"
                                               for r in rows))
    warmup = {"steps": 2, "batch_size": 8, "lr": 2e-4, "source": "teacher", "teacher_reward": 1.0,
              "policies": {"main": {"losses": [2.5, 0.4], "tokens": 310, "seconds": 4.5, "demonstrations": 12,
                                    "loss_first": 2.5, "loss_last": 0.4}}}
    with (old / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"warmup": warmup}) + "\n")
    loaded = load_run(old)
    assert [m["step"] for m in loaded.steps] == [0, 1] and set(loaded.evals) == {"before", "after"}
    assert loaded.warmup == warmup and loaded.warnings == []
    assert "Reward: team and per agent" in write_report(old).read_text()
