"""The run directory writer's warnings: printed and kept for the report."""

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
