"""Does every CPU config learn?  Held-out accuracy before and after training, and wall time.

Each config (default: every ``configs/cpu_*.yaml``, the team tasks and the quickstart) is
trained as shipped on the embedded model, in this process, one after another, into a fresh
run directory.  Printed per config: the topology, the credit method, the steps, held-out
accuracy before and after (greedy, ``trainer.eval_size`` tasks), the gain in points, the
wall seconds of the whole run (model build, both evaluations and the training) and whether
it meets the bar of +5 points within 5 minutes.  A config with a format warm-up
(``trainer.warmup``: ``cpu_facts``, a task the embedded model was not warm-started on) also
shows the accuracy after the warm-up, and its gain is RL's, counted from there; its RL seconds
(the training steps alone) are shown beside the whole run's.  A research config also prints,
per evaluation, the tool calls per episode and the share of episodes whose tool calls reached a
supporting paragraph (one of them, and all of them).

    python bench/cpu_learning.py [--configs configs/cpu_debate.yaml ...] [--threads 2] [--set trainer.seed=1]
    python bench/cpu_learning.py --recipe formats.graph=1600   # a variant of the warm start, built once into the cache

With ``--recipe`` every policy on ``model: embedded`` trains from that variant's folder instead
(``mas build-embedded --recipe``; built here first when the cache lacks it); with ``--embedded
FOLDER``, from that folder (a build kept elsewhere).

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
RESEARCH = ("em", "f1", "tool_calls", "support_any", "support_all")  # what a research team's evaluations also report


def run_one(config: str, overrides: list[str], out: Path) -> dict:
    import mas

    run_dir = out / Path(config).stem
    t0 = time.perf_counter()
    team = mas.load_team(REPO / config, [f"logging.run_dir={run_dir}", "logging.progress=false", *overrides])
    summary = mas.train(team, run_dir)
    wall = time.perf_counter() - t0
    cfg = team.cfg
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    warmup = summary.get("eval_warmup", {}).get("accuracy")
    rl_s = sum(float(r["time"]["step"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "step" in r)
    research = {name: {k: summary[f"eval_{name}"][k] for k in RESEARCH if k in summary.get(f"eval_{name}", {})}
                for name in ("before", "warmup", "after")}
    return {"config": config, "topology": cfg.topology.kind, "method": cfg.credit.method, "steps": cfg.trainer.steps,
            "before": before, "warmup": warmup, "after": after,
            "gain_points": 100 * (after - (before if warmup is None else warmup)), "wall_s": wall, "rl_s": rl_s,
            "research": {k: v for k, v in research.items() if v}}


def embedded_overrides(config: str, folder: Path) -> list[str]:
    """``policies.<name>.model=<folder>`` for each policy of ``config`` on the embedded model."""
    from mas.config.schema import load_config

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
    ap.add_argument("--embedded", type=Path, help="train from this embedded build's folder instead")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    variant = args.embedded
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

    print(f"\n| config | topology | credit | steps | held-out before | after warm-up | after | gain (points) | wall s | RL s | "
          f"+{BAR_POINTS:.0f} points in {BAR_SECONDS / 60:.0f} min |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ok = r["gain_points"] >= BAR_POINTS and r["wall_s"] <= BAR_SECONDS
        warm = "-" if r["warmup"] is None else f"{r['warmup']:.3f}"
        print(f"| `{r['config']}` | {r['topology']} | {r['method']} | {r['steps']} | {r['before']:.3f} | {warm} | {r['after']:.3f} | "
              f"{r['gain_points']:+.1f} | {r['wall_s']:.0f} | {r['rl_s']:.0f} | {'yes' if ok else 'no'} |")
    for r in rows:
        for name, scores in r["research"].items():
            print(f"- {r['config']} {name}: " + ", ".join(f"{k} {v}" if isinstance(v, dict) else f"{k} {v:.3f}"
                                                         for k, v in scores.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
