"""The Python API as documented: every ``python`` block of docs/python_api.md runs, in order, in
one namespace, and each does what the page says (a callback that stops after step 2 leaves a
checkpoint that resume continues to the end)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
DOC = REPO / "docs" / "python_api.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def steps_logged(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


def check_block(code: str, ns: dict, out: str, cwd: Path) -> None:
    """What the page promises for the block that was just run."""
    run = cwd / "runs" / "api-demo"
    if "mas.load_team(\"configs/quickstart.yaml\", [\n" in code:
        assert ns["team"].cfg.trainer.steps == 4 and ns["team"].cfg.agent("adder").sampling.temperature == 0.8
    elif "ConfigError" in code:
        assert out.startswith("credit.method: unknown method; valid: 'c3'") and "(found 'shapley_magic')" in out
    elif "class StopAtStep" in code:
        assert ns["summary"]["stopped"] == {"reason": "StopAtStep.on_step_end", "after_step": 2}
        assert [p.name for p in ns["stopper"].checkpoints] == ["step_000002"]
        assert (run / "checkpoints" / "latest").read_text() == "step_000002" and steps_logged(run) == [0, 1, 2]
        assert out.count("team reward") == 3
    elif "resume=True" in code:
        assert "stopped" not in ns["summary"] and steps_logged(run) == [0, 1, 2, 3]
        assert (run / "checkpoints" / "latest").read_text() == "step_000003"
        assert 0.0 <= ns["summary"]["eval_after"]["accuracy"] <= 1.0
    elif "mas.evaluate" in code:
        assert 0.0 <= ns["result"]["accuracy"] <= 1.0 and out.strip() == str(ns["result"]["accuracy"])
    elif "graph_team" in code:
        assert sorted(ns["graph_team"].agents) == ["checker", "solver"] and steps_logged(cwd / "runs" / "api-graph") == [0]
    elif "RunControl" in code:
        assert ns["summary"]["stopped"] == {"reason": "asked before the first step", "after_step": None}
    else:
        raise AssertionError(f"docs/python_api.md has a block this test does not check:\n{code}")


def test_the_documented_examples_run_and_do_what_the_page_says(tmp_path, monkeypatch):
    for name in ("configs", "examples"):  # the page runs from the repository root; its runs/ go to tmp_path
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ns: dict = {}
    found = blocks()
    assert len(found) == 7
    for code in found:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, str(DOC), "exec"), ns)  # noqa: S102 - the documentation's own examples
        check_block(code, ns, buf.getvalue(), tmp_path)


def test_import_mas_is_cheap_and_the_api_loads_on_first_use():
    code = ("import sys, mas; heavy = [m for m in ('torch', 'transformers', 'mas.config.schema', 'autogen_agentchat') "
            "if m in sys.modules]; assert not heavy, heavy; assert callable(mas.load_team) and 'mas.config.schema' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
