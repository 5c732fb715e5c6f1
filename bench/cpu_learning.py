"""Does every CPU config learn?  Held-out accuracy before and after training, and wall time.

Each config (default: every ``configs/cpu_*.yaml``, the team tasks and the quickstart) is
trained as shipped on the embedded model, in this process, one after another, into a fresh
run directory.  Printed per config: the topology, the credit method, the steps, held-out
accuracy before and after (greedy, ``trainer.eval_size`` tasks), the gain in points, the
wall seconds of the whole run (model build, both evaluations and the training) and whether
it meets the bar of +5 points within 5 minutes.

    python bench/cpu_learning.py [--configs configs/cpu_debate.yaml ...] [--threads 2] [--set trainer.seed=1]

Run it on an otherwise idle machine: the gains do not depend on load, the wall times do.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).parents[1]
DEFAULT = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("cpu_*.yaml")) + [
    "configs/team_conjunctive.yaml", "configs/team_saboteur.yaml", "configs/quickstart.yaml"]
BAR_POINTS, BAR_SECONDS = 5.0, 300.0


def run_one(config: str, overrides: list[str], out: Path) -> dict:
    import mas

    run_dir = out / Path(config).stem
    t0 = time.perf_counter()
    team = mas.load_team(REPO / config, [f"logging.run_dir={run_dir}", "logging.progress=false", *overrides])
    summary = mas.train(team, run_dir)
    wall = time.perf_counter() - t0
    cfg = team.cfg
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    return {"config": config, "topology": cfg.topology.kind, "method": cfg.credit.method, "steps": cfg.trainer.steps,
            "before": before, "after": after, "gain_points": 100 * (after - before), "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the bar is set for 2 cores)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every config")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mas-cpu-learning-") as tmp:
        for config in args.configs:
            rows.append(run_one(config, args.set, Path(tmp)))
            r = rows[-1]
            print(f"{r['config']}: {r['before']:.3f} -> {r['after']:.3f} ({r['gain_points']:+.1f} points) "
                  f"in {r['wall_s']:.0f} s", file=sys.stderr, flush=True)

    print(f"\n| config | topology | credit | steps | held-out before | after | gain (points) | wall s | "
          f"+{BAR_POINTS:.0f} points in {BAR_SECONDS / 60:.0f} min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ok = r["gain_points"] >= BAR_POINTS and r["wall_s"] <= BAR_SECONDS
        print(f"| `{r['config']}` | {r['topology']} | {r['method']} | {r['steps']} | {r['before']:.3f} | {r['after']:.3f} | "
              f"{r['gain_points']:+.1f} | {r['wall_s']:.0f} | {'yes' if ok else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
