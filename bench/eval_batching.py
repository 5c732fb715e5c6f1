"""A held-out evaluation with its generate calls cut by memory (the default) and whole.

The hf backend cuts a group so that one call's memory (``generate_bytes``) stays within its call
budget (``mas.rollout.backends.hf``: 1 GiB on CPU), where it used to send every task of an
evaluation in one call.  For each config, two fresh
processes (one torch thread each) evaluate the same held-out tasks greedily, as the run's
first evaluation does: with the default bound, and with it lifted.  Printed per config: the
episodes that differ (every turn's completion ids), accuracy, generate calls, the widest call,
wall time and peak resident memory of each.

    python bench/eval_batching.py [--configs configs/smol_debate.yaml ...] [--set key=value ...]

Nothing here is asserted: the numbers go to docs/benchmarks/memory.md with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOL = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("smol_*.yaml"))


def child(config: str, overrides: list[str], whole: bool, out: Path) -> None:
    import time

    import torch

    torch.set_num_threads(1)
    import mas.rollout.backends.hf as hf
    from mas.api import load_team
    from mas.process.memory import peak_rss_mb

    if whole:
        hf.default_call_budget = lambda device: 2**62  # the bound lifted: every task in one call
    widest: list[int] = []
    with load_team(REPO / config, ["logging.progress=false", *overrides]) as team:
        for policy in team.policies.values():
            if policy.model is None:
                continue
            real = policy.model.generate

            def counted(*args, _real=real, **kwargs):
                widest.append(int(kwargs["input_ids"].shape[0]))
                return _real(*args, **kwargs)

            policy.model.generate = counted
        tasks = team.env.eval_tasks(team.cfg.trainer.eval_size or 100)
        t0 = time.perf_counter()
        episodes = team.engine.evaluate(tasks, seed=team.cfg.trainer.seed)
        seconds = time.perf_counter() - t0
    out.write_text(json.dumps({
        "episodes": [[t.completion_ids for t in ep.turns] for ep in episodes],
        "accuracy": sum(ep.reward for ep in episodes) / len(episodes),
        "calls": len(widest), "widest": max(widest, default=0), "seconds": seconds, "peak_rss_mb": peak_rss_mb(),
    }))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=SMOL)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for every run")
    p.add_argument("--child", nargs=3, metavar=("CONFIG", "WHOLE", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        config, whole, out = args.child
        child(config, args.set, whole == "1", Path(out))
        return
    print("| config | tasks | episodes that differ | accuracy | generate calls, bounded / whole | widest call (rows) | "
          "wall s, bounded / whole | peak RSS MB, bounded / whole |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            got = {}
            for whole in (0, 1):
                out = Path(tmp) / f"{Path(config).stem}-{whole}.json"
                cmd = [sys.executable, __file__, "--child", config, str(whole), str(out)]
                cmd += [a for s in args.set for a in ("--set", s)]
                subprocess.run(cmd, check=True, cwd=REPO)
                got[whole] = json.loads(out.read_text())
            b, w = got[0], got[1]
            differ = sum(x != y for x, y in zip(b["episodes"], w["episodes"]))
            print(f"| `{Path(config).stem}` | {len(b['episodes'])} | {differ} | {b['accuracy']:.3f} / {w['accuracy']:.3f} | "
                  f"{b['calls']} / {w['calls']} | {b['widest']} / {w['widest']} | {b['seconds']:.0f} / {w['seconds']:.0f} | "
                  f"{b['peak_rss_mb']:,.0f} / {w['peak_rss_mb']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
