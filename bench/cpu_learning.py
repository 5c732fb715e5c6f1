"""Does every CPU config learn?  Held-out accuracy before and after training, and wall time.

Each config (default: every ``configs/cpu_*.yaml``, the team tasks and the quickstart) is
trained as shipped on the embedded model, in this process, one after another, into a fresh
run directory.  Printed per config: the topology, the credit method, the steps, held-out
accuracy before and after (greedy, ``trainer.eval_size`` tasks), the gain in points, the
wall seconds of the whole run (model build, both evaluations and the training) and whether
it meets the bar of +5 points within 5 minutes.

    python bench/cpu_learning.py [--configs configs/cpu_debate.yaml ...] [--threads 2] [--set trainer.seed=1]
    python bench/cpu_learning.py --recipe formats.graph=1600   # a variant of the warm start, built once into the cache

With ``--recipe`` every policy on ``model: embedded`` trains from that variant's folder instead
(``mas build-embedded --recipe``; built here first when the cache lacks it).

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


def embedded_overrides(config: str, folder: Path) -> list[str]:
    """``policies.<name>.model=<folder>`` for each policy of ``config`` on the embedded model."""
    from mas.config import load_config

    return [f"policies.{name}.model={folder}" for name, p in load_config(REPO / config).policies.items()
            if p.model == "embedded"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the bar is set for 2 cores)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every config")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--recipe", action="append", default=[], metavar="KEY=VALUE",
                    help="train from this variant of the embedded model's recipe (mas build-embedded --recipe)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    variant = None
    if args.recipe:
        from mas.embedded import Recipe
        from mas.embedded.build import ensure_embedded

        try:
            recipe = Recipe().varied(args.recipe)
        except ValueError as e:
            ap.error(str(e))
        variant = ensure_embedded(recipe, log=lambda msg: print(msg, file=sys.stderr))
        print(f"recipe {recipe.key()} ({', '.join(args.recipe)}): {variant}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mas-cpu-learning-") as tmp:
        for config in args.configs:
            extra = embedded_overrides(config, variant) if variant else []
            rows.append(run_one(config, [*args.set, *extra], Path(tmp)))
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
