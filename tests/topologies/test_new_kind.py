"""Adding a topology is one file plus its registration: ``pair_kind.py`` (in this folder), installed
as a plugin through the ``mas.topologies`` entry point, trains a step, appears in ``mas show``,
validates, and a bad config of it is refused by name; no other file of mas knows it exists.

The plugin is a real distribution on disk (a ``.dist-info`` with ``entry_points.txt`` beside the
module), found by ``importlib.metadata`` through ``PYTHONPATH`` in a fresh interpreter, as a user's
package would be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    shutil.copy(HERE / "pair_kind.py", root / "pair_kind.py")
    dist = root / "pairkind-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pairkind\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mas.topologies]\npair = pair_kind\n")
    return root


def run_mas(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "mas.cli", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


def pair_config(model_dir: Path, **topology) -> dict:
    return {
        "team": {"name": "pair"},
        "policies": {"main": {"kind": "full", "model": str(model_dir), "optim": {"lr": 1e-3}}},
        "agents": [
            {"name": "drafter", "policy": "main", "role": "You are a solver.", "parser": "answer",
             "sampling": {"max_new_tokens": 8}},
            {"name": "finisher", "policy": "main", "role": "You are a verifier.", "parser": "answer",
             "sampling": {"max_new_tokens": 8}},
        ],
        "topology": {"kind": "pair", "first": "drafter", "second": "finisher", **topology},
        "env": {"name": "synthetic_math", "num_ops": 1, "max_operand": 5, "seed": 0},
        "credit": {"method": "grpo"},
        "trainer": {"steps": 1, "batch_size": 2, "group_size": 2, "eval_size": 0, "seed": 0},
    }


def test_a_new_kind_validates_shows_and_trains(site, tmp_path, tiny_model_dir):
    good = tmp_path / "pair.yaml"
    good.write_text(yaml.safe_dump(pair_config(tiny_model_dir)))

    out = run_mas(["validate", str(good)], site, tmp_path)
    assert out.returncode == 0 and f"{good}: ok" in out.stdout, out.stdout + out.stderr

    out = run_mas(["show", str(good)], site, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "topology: pair" in out.stdout
    lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    assert "drafter ──reply──▶ finisher" in lines and "finisher ──ANSWER──▶ END" in lines, out.stdout

    run = tmp_path / "run"
    out = run_mas(["train", str(good), "--run-dir", str(run)], site, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    step = next(r for r in rows if r.get("step") == 0 and "policies" in r)
    assert step["policies"]["main"]["samples"] > 0  # both agents' turns reached the learner


def test_a_bad_config_of_the_new_kind_is_refused_by_name(site, tmp_path, tiny_model_dir):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump(pair_config(tiny_model_dir, second="judge")))
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(pair_config(tiny_model_dir, second="drafter")))
    missing = tmp_path / "missing.yaml"
    cfg = pair_config(tiny_model_dir)
    del cfg["topology"]["second"]
    missing.write_text(yaml.safe_dump(cfg))

    out = run_mas(["validate", str(unknown), str(same), str(missing)], site, tmp_path)
    assert out.returncode == 1
    err = out.stderr
    assert "topology.second: unknown agent; valid: ['drafter', 'finisher']" in err, err
    assert "the second agent must differ from the first" in err, err
    assert "topology.second: missing required field" in err, err
    # without the plugin the kind is unknown, and the error lists the kinds that are installed
    out = subprocess.run([sys.executable, "-m", "mas.cli", "validate", str(unknown)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 1 and "'pair'" in out.stderr and "'orchestrator'" in out.stderr, out.stderr
