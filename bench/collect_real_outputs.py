"""Collect what a real model writes in each team: every turn's text, for the parsers' test fixture.

Runs rollouts of each config (default: every ``configs/smol_*.yaml``) at the agents' own
sampling temperatures and writes one JSON line per turn:

    {"config", "phase", "agent", "parser", "task", "text", "valid"}

``phase`` is ``raw`` (the model as it ships) or ``warm`` (after ``--warmup-steps`` supervised
steps of the team's format warm-up, ``mas.training.warmup``); ``valid`` is what the parser said when
the turn was collected (the fixture's labels are written by hand afterwards, see
``tests/agents/test_real_outputs.py``).  Tool turns are kept too (their text is a tool call).

    python bench/collect_real_outputs.py --out real.jsonl [--tasks 4 --group 2] [--warmup-steps 0]
        [--config configs/smol_debate.yaml ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mas.config.schema import load_config
from mas.training.team import build_team
from mas.training.warmup import warm_up

ROOT = Path(__file__).parents[1]


def collect(config: Path, tasks: int, group: int, warmup_steps: int, seed: int) -> list[dict]:
    cfg = load_config(config, [f"trainer.warmup.steps={warmup_steps}", "logging.progress=false"])
    team = build_team(cfg)
    try:
        phase = "raw"
        if warmup_steps:
            warm_up(team, lambda msg: print(f"  {msg}", file=sys.stderr))
            phase = "warm"
        parsers = {a.name: a.parser for a in cfg.agents}
        groups = team.engine.rollout(team.env.sample_tasks(tasks), group, seed=seed)
        rows = []
        for g in groups:
            for ep in g.episodes:
                for t in ep.turns:
                    if t.finish_reason == "removed":
                        continue
                    rows.append({"config": config.name, "phase": phase, "agent": t.agent, "parser": parsers[t.agent],
                                 "task": ep.task.prompt, "text": t.text, "valid": bool(t.valid)})
        return rows
    finally:
        team.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", type=Path, help="a config (repeatable); default: configs/smol_*.yaml")
    ap.add_argument("--out", type=Path, required=True, help="JSONL file to append the turns to")
    ap.add_argument("--tasks", type=int, default=4, help="training tasks per config")
    ap.add_argument("--group", type=int, default=2, help="episodes per task")
    ap.add_argument("--warmup-steps", type=int, default=0, help="supervised warm-up steps first (0: the raw model)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    configs = [c.resolve() for c in args.config] if args.config else sorted((ROOT / "configs").glob("smol_*.yaml"))
    out = args.out.resolve()
    os.chdir(ROOT)  # the configs name repo-relative paths (examples.graphs, examples/data/sums.jsonl)
    for config in configs:
        t0 = time.perf_counter()
        rows = collect(config, args.tasks, args.group, args.warmup_steps, args.seed)
        with out.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        valid = sum(r["valid"] for r in rows)
        print(f"{config.name}: {len(rows)} turns, {valid} parsed, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
