"""Read a run directory (what ``mas train`` wrote) into one object for the report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mas.config.loading import read_config_data
from mas.config.messages import ConfigError
from mas.training.metrics import record_kind


class NotARunError(ValueError):
    """The path is not a run directory of ``mas train``."""


@dataclass
class RunData:
    path: Path
    name: str
    config: dict[str, Any]
    steps: list[dict[str, Any]]  # metrics.jsonl step records (kind "step"), in step order
    evals: dict[str, dict[str, Any]]  # "before"/"after" -> eval metrics
    episodes: list[dict[str, Any]]  # episodes.jsonl records
    info: dict[str, Any]  # run_info.json ({} for runs written before it existed)
    summary: dict[str, Any]
    skipped_lines: int = 0  # unreadable lines (a run killed mid-write leaves a partial last line)
    agents: list[str] = field(default_factory=list)  # the team's agents, in config order
    warnings: list[dict[str, Any]] = field(default_factory=list)  # warnings.jsonl: {"step", "kind", "message"}; [] if empty or absent
    warmup: dict[str, Any] | None = None  # the format warm-up's record (mas.training.warmup), if the run had one
    config_problem: str | None = None  # why config.yaml could not be read (the report goes on without it)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)  # every evaluation record, in the order written

    def series(self, *keys: str) -> list[float | None]:
        """One value per step under the nested ``keys`` (None where a step lacks it)."""
        out = []
        for m in self.steps:
            v: Any = m
            for k in keys:
                v = v.get(k) if isinstance(v, dict) else None
            out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
        return out

    @property
    def step_numbers(self) -> list[float]:
        return [float(m["step"]) for m in self.steps]

    @property
    def policies(self) -> list[str]:
        names: list[str] = []
        for m in self.steps:
            names += [p for p in m.get("policies", {}) if p not in names]
        return names


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    if not path.exists():
        return [], 0
    rows, bad = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:  # half-written by a crash, or not a record
            bad += 1
    return rows, bad


def load_run(path: str | Path, name: str | None = None) -> RunData:
    """Load ``path``; a missing directory or one without ``metrics.jsonl`` is a ``NotARunError``."""
    path = Path(path)
    if not path.is_dir():
        raise NotARunError(f"{path}: no such directory; give a run directory written by `mas train`")
    if not (path / "metrics.jsonl").exists():
        raise NotARunError(f"{path}: no metrics.jsonl there; is it a run directory written by `mas train`?")
    rows, bad = _read_jsonl(path / "metrics.jsonl")
    episodes, bad_ep = _read_jsonl(path / "episodes.jsonl")
    warnings, bad_warn = _read_jsonl(path / "warnings.jsonl")
    kinds = [record_kind(r) for r in rows]  # "step", "eval", "warmup" (older runs: read from the keys)
    steps = sorted((r for r, k in zip(rows, kinds) if k == "step" and isinstance(r.get("step"), (int, float))),
                   key=lambda r: r["step"])
    eval_rows = [r for r, k in zip(rows, kinds) if k == "eval" and "eval" in r]
    evals = {r["eval"]: r for r in eval_rows}
    warmup = next((r["warmup"] for r, k in zip(rows, kinds) if k == "warmup" and isinstance(r.get("warmup"), dict)), None)
    config, config_problem = _read_config(path / "config.yaml")
    info = json.loads((path / "run_info.json").read_text()) if (path / "run_info.json").exists() else {}
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else {}
    agents = [a["name"] for a in config.get("agents", [])]
    for m in steps:  # agents seen in metrics but not in the config (should not happen) still show
        agents += [a for a in m.get("agents", {}) if a not in agents]
    team = config.get("team", {}).get("name", path.name)
    return RunData(path=path, name=name or team, config=config, steps=steps, evals=evals, episodes=episodes,
                   info=info, summary=summary, skipped_lines=bad + bad_ep + bad_warn, agents=agents, warnings=warnings,
                   warmup=warmup, config_problem=config_problem, eval_rows=eval_rows)


def _read_config(path: Path) -> tuple[dict[str, Any], str | None]:
    """The run's own config.yaml as data, through the bounded reader; a damaged one is reported,
    not fatal: the metrics are still worth a report."""
    if not path.exists():
        return {}, None
    try:
        data = read_config_data(path)
    except ConfigError as e:
        return {}, f"{path.name} unreadable ({'; '.join(' '.join(line.split()) for line in e.lines)})"
    if not isinstance(data, dict):
        return {}, f"{path.name} is not a mapping"
    return data, None
