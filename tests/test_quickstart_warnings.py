"""The quickstart trains without a Python warning from our own code.

``mas train configs/quickstart.yaml`` (2 steps, 20 held-out tasks, the cached embedded model)
runs in a fresh interpreter whose warning filters show every warning attributed to one of our
modules (``mas`` and ``mas.*``, which includes agents/, topologies/, credit/ and envs/) and
ignore the rest: third-party libraries' own deprecation notices do not fail this test (the
quickstart's stderr is read by hand for those).  Our warnings are recorded rather than turned
into errors: the engine isolates a failing episode (it is marked and scored 0), so an error
raised by a warning inside a rollout would be swallowed, and the test would pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mas.embedded.build import ensure_embedded

ROOT = Path(__file__).resolve().parents[1]

# the `mas` console script is mas.cli:main; this runs it with the warning filters set first
DRIVER = r"""
import json, sys, warnings

warnings.simplefilter("ignore")  # other people's warnings: read by hand, not failed on
warnings.filterwarnings("always", module=r"mas(\.|$)")  # every one of ours, even if caught
seen = []
warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: seen.append(
    f"{filename}:{lineno}: {category.__name__}: {message}")

from mas.cli import main

code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
sys.exit(code)
"""


def test_the_quickstart_trains_without_a_warning_from_our_code(tmp_path):
    ensure_embedded(log=lambda *_: None)  # the cached model (built once if missing, outside the check)
    run, report = tmp_path / "run", tmp_path / "warnings.json"
    args = [str(ROOT / "configs" / "quickstart.yaml"), "trainer.steps=2", "trainer.eval_size=8", "trainer.batch_size=2", "trainer.group_size=4", "--run-dir", str(run)]
    done = subprocess.run([sys.executable, "-c", DRIVER, str(report), "train", *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(report.read_text()) == []
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    assert steps == [0, 1] and "held-out team accuracy: before" in done.stdout
