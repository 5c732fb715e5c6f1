"""Resident memory between training steps, with and without one of glibc's settings.

Trains one config twice, side by side in two fresh processes (one torch thread each), as
shipped and with one call replaced by a no-op:
- ``--what release`` (default): ``mas.process.memory.release_freed_memory`` (glibc's
  ``malloc_trim``), with which every step starts; arms "release" and "keep";
- ``--what heap``: ``keep_large_blocks_off_the_heap`` (glibc's mmap threshold fixed at 4 MiB,
  set as the run starts); arms "fixed" and "moving" (glibc's own threshold, which rises to 32 MiB).
After each step it prints the resident set as the next step finds it (after the release, where
there is one) and the process's peak so far, for both, and the ratio of their mean step times.

    python bench/rss_per_step.py [--config configs/smol_orchestrator.yaml] [--steps 6] [--what heap] [--set key=value ...]

Nothing here is asserted: the numbers go to docs/benchmarks/memory.md with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


ARMS = {"release": ("release", "keep"), "heap": ("fixed", "moving")}


def child(config: str, overrides: list[str], mode: str, out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    import mas
    import mas.training.team
    import mas.training.trainer
    from mas.process.memory import peak_rss_mb, release_freed_memory, rss_mb

    keep = mode == "keep"
    if keep:
        mas.training.trainer.release_freed_memory = lambda: False
    if mode == "moving":
        mas.training.team.keep_large_blocks_off_the_heap = lambda: False
    rows = []

    class Record:
        def on_step_end(self, step, metrics, groups, credit):
            if not keep:
                release_freed_memory()  # what the trainer does first thing in the next step
            rows.append({"step": step, "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(), "step_s": metrics["time"]["step"]})

    team = mas.load_team(str(REPO / config), overrides)
    mas.train(team, out / "run", callbacks=[Record()])
    (out / "rows.json").write_text(json.dumps(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smol_orchestrator.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (both runs)")
    ap.add_argument("--json", type=Path, help="also write both runs' rows here")
    ap.add_argument("--what", choices=sorted(ARMS), default="release", help="the setting compared (module docstring)")
    ap.add_argument("--child", choices=[m for arms in ARMS.values() for m in arms], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    overrides = [*args.set, f"trainer.steps={args.steps}", "logging.progress=false"]
    if args.child:
        child(args.config, overrides, args.child, args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="mas-rss-") as tmp:
        procs = {}
        shipped, other = ARMS[args.what]
        for mode in (shipped, other):
            out = Path(tmp) / mode
            out.mkdir()
            cmd = [sys.executable, __file__, "--child", mode, "--out", str(out), "--config", args.config,
                   "--steps", str(args.steps), *[f"--set={s}" for s in args.set]]
            procs[mode] = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for mode, proc in procs.items():
            if proc.wait() != 0:
                print(f"the {mode} run failed (exit {proc.returncode})", file=sys.stderr)
                return 1
        rows = {mode: json.loads((Path(tmp) / mode / "rows.json").read_text()) for mode in procs}
    print(f"| step | RSS between steps, {shipped} (MB) | {other} (MB) | peak so far, {shipped} (MB) | {other} (MB) |")
    print("|---|---|---|---|---|")
    for a, b in zip(rows[shipped], rows[other]):
        print(f"| {a['step']} | {a['rss_mb']:,.0f} | {b['rss_mb']:,.0f} | {a['peak_rss_mb']:,.0f} | {b['peak_rss_mb']:,.0f} |")
    mean = {m: sum(r["step_s"] for r in rs) / len(rs) for m, rs in rows.items()}
    print(f"\nmean step time: {shipped} {mean[shipped]:.1f} s, {other} {mean[other]:.1f} s "
          f"(ratio {mean[shipped] / mean[other]:.2f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
