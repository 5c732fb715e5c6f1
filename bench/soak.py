"""Soak: the resident memory of one long training run, step by step.

Trains one config in a fresh child process (one torch thread) and records, after every step
(``on_step_end``), the resident set (``mas.process.memory.rss_mb``) as the step leaves it (what
``memory.rss_mb`` in metrics.jsonl says), the resident set after ``release_freed_memory`` (what
the trainer does first in the next step, done here so the last step gets it too) and the
process's peak so far (``peak_rss_mb``); and the same after each phase before RL: the team
loaded, the format warm-up and each held-out evaluation (the trainer's ``warm_up`` and
``evaluate``, wrapped in the child).  It prints a row every ``--every`` steps, then the phases,
the least-squares slope of the resident set in MB per step over steps ``[--fit-from, N)`` and
the peak.

    python bench/soak.py --config configs/quickstart.yaml --steps 2000 [--every 100] [--minutes 15] [--set key=value ...] [--json soak.json]

``--minutes`` stops the run (as a callback does: after the step, with a checkpoint, and without
the evaluation after training) once that much of it has passed, for a machine too slow for N.

``--census`` also counts, at each phase and every ``--every`` steps, the live torch tensors
(``gc.get_objects()``) and the bytes of their distinct storages, and splits the resident set
into anonymous and file-backed pages; ``--trim-phases`` then calls ``release_freed_memory``
(glibc's ``malloc_trim``) after each phase and records the resident set it leaves, to tell live
memory from a heap glibc keeps.  ``--keep-phase-heap`` turns the release that ends the warm-up
and each evaluation into a no-op, as before that fix, for a side-by-side run.  A census takes a
second or so on a large heap.

Nothing here is asserted: the numbers go to docs/benchmarks/memory.md with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tensor_census() -> dict[str, float]:
    """Live torch tensors (``mas.process.memory.live_tensors``) and the resident set's kinds."""
    from mas.process.memory import live_tensors

    count, nbytes = live_tensors()
    return {"tensors": count, "tensor_mb": nbytes / 2**20, **resident_kinds()}


def resident_kinds() -> dict[str, float]:
    """The resident set split as the kernel counts it (Linux ``/proc/self/status``, MiB): anonymous
    pages (the heap, tensors) and file-backed pages (mapped libraries and weight files)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile"):
                    out[key.lower().replace("rss", "rss_") + "_mb"] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def child(config: str, overrides: list[str], every: int, census: bool, trim: bool, keep_phases: bool, minutes: float | None,
          out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    import mas
    import mas.training.evaluation
    import mas.training.trainer as trainer
    import mas.training.warmup
    from mas.process.memory import peak_rss_mb, release_freed_memory, rss_mb

    if keep_phases:  # as before the fix: the warm-up and evaluations keep the heap they freed
        for module in (mas.training.evaluation, mas.training.warmup):
            if hasattr(module, "release_freed_memory"):
                module.release_freed_memory = lambda: False

    phases: list[dict] = []
    steps: list[dict] = []
    t0 = time.perf_counter()

    def record(name: str, rows: list[dict], **extra) -> dict:
        row = {"phase": name, **extra, "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(), "t_s": time.perf_counter() - t0}
        if census:
            row.update(tensor_census())
        if trim:
            release_freed_memory()
            row["rss_trimmed_mb"] = rss_mb()
        rows.append(row)
        return row

    record("imported", phases)
    team = mas.load_team(str(REPO / config), overrides)
    record("loaded", phases)
    seed = team.cfg.trainer.seed
    warm, evaluate = trainer.warm_up, trainer.evaluate

    def warm_up(*args, **kwargs):
        got = warm(*args, **kwargs)
        record("warm-up", phases)
        return got

    def evaluation(team_, size, seed_, *args, **kwargs):
        got = evaluate(team_, size, seed_, *args, **kwargs)
        where = ("after step %d" % steps[-1]["step"]) if steps else (
            "noise floor" if seed_ != seed else "after warm-up" if any(p["phase"] == "warm-up" for p in phases) else "before")
        record(f"eval {where}", phases)
        return got

    trainer.warm_up, trainer.evaluate = warm_up, evaluation

    class Record:
        def on_step_end(self, step, metrics, groups, credit):
            sample = census and (step % every == 0 or step == team.cfg.trainer.steps - 1)
            row = {"step": step, "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(), "step_s": metrics["time"]["step"]}
            release_freed_memory()  # what the trainer does first thing in the next step
            row["rss_released_mb"] = rss_mb()
            if sample:
                row.update(tensor_census())
            steps.append(row)
            if step % every == 0:
                print(f"step {step}: RSS {row['rss_mb']:,.0f} MB ({row['rss_released_mb']:,.0f} released), peak {row['peak_rss_mb']:,.0f} MB, "
                      f"step {row['step_s']:.2f} s", flush=True)
            return minutes is not None and time.perf_counter() - t0 > 60 * minutes  # True: stop after this step

    mas.train(team, out / "run", callbacks=[Record()])
    (out / "rows.json").write_text(json.dumps({"phases": phases, "steps": steps}))


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys on xs (None under two points)."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def summarise(rows: dict, fit_from: int) -> dict:
    steps = rows["steps"]
    fit = [r for r in steps if r["step"] >= fit_from]
    peak = max([r["peak_rss_mb"] for r in steps] + [p["peak_rss_mb"] for p in rows["phases"]])
    return {"steps": len(steps), "fit_from": fit_from,
            "slope_mb_per_step": slope([r["step"] for r in fit], [r["rss_mb"] for r in fit]),
            "slope_released_mb_per_step": slope([r["step"] for r in fit], [r["rss_released_mb"] for r in fit]),
            "rss_first_mb": steps[0]["rss_mb"] if steps else None, "rss_last_mb": steps[-1]["rss_mb"] if steps else None,
            "peak_rss_mb": peak, "mean_step_s": sum(r["step_s"] for r in steps) / max(len(steps), 1)}


def run_child(cmd: list[str], env: dict[str, str]) -> int:
    """The child's exit code; a SIGTERM to this process (or a Ctrl-C) stops the child too, so
    stopping the soak never leaves a run training on its own."""
    proc = subprocess.Popen(cmd, env=env)

    def stop(signum, _frame):  # raise out of the wait below: waiting again inside it would deadlock
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10, help="print (and census) every K steps")
    ap.add_argument("--fit-from", type=int, default=20, help="fit the slope over steps [FIT_FROM, N)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--census", action="store_true", help="count live tensors at each phase and every K steps")
    ap.add_argument("--trim-phases", action="store_true", help="malloc_trim after each phase and record what is left")
    ap.add_argument("--minutes", type=float, help="stop after the step that ends past this many minutes of the run")
    ap.add_argument("--keep-phase-heap", action="store_true",
                    help="make the warm-up's and evaluations' release_freed_memory a no-op (as before the fix)")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    overrides = [*args.set, f"trainer.steps={args.steps}", "logging.progress=false"]
    if args.child:
        child(args.config, overrides, args.every, args.census, args.trim_phases, args.keep_phase_heap, args.minutes, args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="mas-soak-") as tmp:
        cmd = [sys.executable, __file__, "--child", "--out", tmp, "--config", args.config, "--steps", str(args.steps),
               "--every", str(args.every), *[f"--set={s}" for s in args.set]] + ["--minutes", str(args.minutes)] * (args.minutes is not None)
        cmd += ["--census"] * args.census + ["--trim-phases"] * args.trim_phases + ["--keep-phase-heap"] * args.keep_phase_heap
        if run_child(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}) != 0:
            print("the run failed", file=sys.stderr)
            return 1
        rows = json.loads((Path(tmp) / "rows.json").read_text())
    counted = args.census and "tensors" in rows["phases"][0]
    head = "| phase | RSS (MB) | peak so far (MB) |" + " anonymous / file-backed (MB) | live tensors | their storages (MB) |" * counted
    head += " RSS after malloc_trim (MB) |" * args.trim_phases
    print("\n" + head + "\n" + "|---" * head.count(" | ") + "|---|")
    for p in rows["phases"]:
        line = f"| {p['phase']} | {p['rss_mb']:,.0f} | {p['peak_rss_mb']:,.0f} |"
        if counted:
            line += (f" {p.get('rss_anon_mb', 0):,.0f} / {p.get('rss_file_mb', 0):,.0f} | {p['tensors']:,} |"
                     f" {p['tensor_mb']:,.0f} |")
        if args.trim_phases:
            line += f" {p['rss_trimmed_mb']:,.0f} |"
        print(line)
    print("\n| step | RSS at step end (MB) | after release (MB) | peak so far (MB) |" + " live tensors | their storages (MB) |" * args.census)
    print("|---|---|---|---|" + "---|---|" * args.census)
    for r in rows["steps"]:
        if r["step"] % args.every == 0 or r is rows["steps"][-1]:
            line = f"| {r['step']} | {r['rss_mb']:,.0f} | {r['rss_released_mb']:,.0f} | {r['peak_rss_mb']:,.0f} |"
            if args.census:
                line += f" {r.get('tensors', 0):,} | {r.get('tensor_mb', 0):,.0f} |"
            print(line)
    s = summarise(rows, args.fit_from)
    fitted = "n/a" if s["slope_mb_per_step"] is None else (
        f"{s['slope_mb_per_step']:+.3f} MB/step at step end, {s['slope_released_mb_per_step']:+.3f} after release")
    print(f"\n{s['steps']} steps, mean {s['mean_step_s']:.2f} s a step; RSS slope over steps [{args.fit_from}, {s['steps']}): "
          f"{fitted}; RSS {s['rss_first_mb']:,.0f} MB at step 0, {s['rss_last_mb']:,.0f} MB at the last; "
          f"peak {s['peak_rss_mb']:,.0f} MB")
    if args.json:
        args.json.write_text(json.dumps({**rows, "summary": s, "config": args.config, "overrides": args.set}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
