"""Peak resident memory of each phase of one training run, next to the memory plan's terms.

Trains one config in this process (one torch thread, ``logging.progress=false``) and records
the kernel's high-water mark of the resident set (``VmHWM`` of /proc/self/status) for each
phase on its own: the mark is reset to the resident set now (writing 5 to /proc/self/clear_refs)
as a phase starts and read as it ends.  Phases: loading the team (models, env, backend), each
held-out evaluation, the format warm-up, and per RL step its rollout, its credit's own
generations (methods that plan some) and the rest of the step (credit assignment, the updates,
sync).  The trainer's ``evaluate``, ``warm_up``, ``train_step``, ``rollout`` and
``execute_timed`` are wrapped here; nothing in mas is changed.  Then it prints the plan's terms
for the same config (``mas.learning.memory_plan.plan_run``: weights, optimizer, one learner
pass, the generation terms, the process baseline) and its planned peak.

``--longest`` makes every sampled completion run to its ``max_new_tokens`` (the stop ids are
masked until then, transformers' ``min_new_tokens``): no turn ends early, so a topology whose
replies then miss its protocol runs each episode to its turn cap, with the longest prompts its
history can build.  That is a step's worst case in tokens, for a bound on a step's peak that the
run's own steps, which may grow longer as training goes, cannot exceed.  The completions are
what the model samples under that mask, and the learner trains on them as usual.
``--suppress WORD`` (repeatable) keeps the word's tokens from being sampled (transformers'
``bad_words_ids``, with and without a leading space): ``--suppress ANSWER`` keeps an orchestrator
from ever answering, so with ``--longest`` every episode runs to its turn cap at full length.

    python bench/phase_peaks.py --config configs/smol_debate.yaml [--set trainer.steps=2 ...] [--json out.json]

Linux only (clear_refs).  Nothing here is asserted: the numbers go to docs/benchmarks/memory.md
with the machine and commit they came from.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def status_mb(key: str) -> float:
    """A size from /proc/self/status (VmRSS, VmHWM) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def reset_peak() -> None:
    """Set the kernel's high-water mark (VmHWM) back to the resident set now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Phases:
    """Records each phase's start RSS, its own peak and its end RSS."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.t0 = time.perf_counter()
        self._start = (status_mb("VmRSS"), time.perf_counter())

    def begin(self) -> None:
        reset_peak()
        self._start = (status_mb("VmRSS"), time.perf_counter())

    def end(self, name: str) -> dict:
        row = {"phase": name, "start_mb": self._start[0], "peak_mb": status_mb("VmHWM"), "end_mb": status_mb("VmRSS"),
               "seconds": time.perf_counter() - self._start[1]}
        self.rows.append(row)
        print(f"{name}: start {row['start_mb']:,.0f} MiB, peak {row['peak_mb']:,.0f}, end {row['end_mb']:,.0f} "
              f"({row['seconds']:.0f} s)", flush=True)
        self.begin()
        return row


def plan_terms(cfg) -> list[dict]:
    """The memory plan's terms per policy on the config's own devices (bytes -> MiB)."""
    from mas.learning.memory_plan import plan_run

    out = []
    for d in plan_run(cfg):
        for p in d.policies:
            row = {"device": d.device, "policy": p.name, "weights": p.weights, "optimizer": p.optimizer,
                   "gradients": p.gradients, "pass": p.pass_saved or 0, "generation": p.generation, "serving": p.serving}
            for k, v in vars(p).items():  # any further generation terms the plan models
                if k.startswith("gen_") and isinstance(v, int):
                    row[k] = v
            out.append({k: (v / 2**20 if isinstance(v, int) else v) for k, v in row.items()})
        out.append({"device": d.device, "policy": "(process baseline)", "baseline": d.overhead / 2**20})
        out.append({"device": d.device, "policy": "(planned peak)", "peak": d.peak() / 2**20})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smol_debate.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--run-dir", type=Path, default=None, help="run directory (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--longest", action="store_true", help="every completion runs to its max_new_tokens (worst case)")
    ap.add_argument("--suppress", action="append", default=[], metavar="WORD", help="never sample WORD (repeatable)")
    ap.add_argument("--calls", type=int, default=0, metavar="ROWS", help="print each generate call of at least ROWS rows as it ends")
    args = ap.parse_args(argv)

    import tempfile

    from mas.process.memory import huge_pages_for_large_tensors

    huge_pages_for_large_tensors()  # torch's allocator as the mas command sets it, before torch loads
    import torch

    torch.set_num_threads(1)
    import mas
    import mas.training.trainer as trainer
    from mas.config.loading import load_config

    cfg = load_config(str(REPO / args.config), [*args.set, "logging.progress=false"])
    phases = Phases()
    phases.end("imported")
    plan = plan_terms(cfg)  # the plan's process baseline is measured here, as `mas validate --plan` does
    phases.begin()
    team = mas.load_team(cfg)
    phases.end("load (build_team)")

    step_now = {"step": None}
    originals = {name: getattr(trainer, name) for name in ("evaluate", "warm_up", "train_step", "rollout", "execute_timed")}
    evals = {"n": 0}

    def evaluate(team_, size, seed, *a, **k):
        phases.end("between")
        got = originals["evaluate"](team_, size, seed, *a, **k)
        evals["n"] += 1
        phases.end(f"eval {evals['n']} ({size} tasks)")
        return got

    def warm_up(*a, **k):
        phases.end("between")
        got = originals["warm_up"](*a, **k)
        phases.end("warm-up")
        return got

    def train_step(team_, step, *a, **k):
        phases.end("between")
        step_now["step"] = step
        got = originals["train_step"](team_, step, *a, **k)
        phases.end(f"step {step} update (credit assignment, updates, sync)")
        step_now["step"] = None
        return got

    def rollout(team_, step, *a, **k):
        got = originals["rollout"](team_, step, *a, **k)
        phases.end(f"step {step} rollout")
        return got

    def execute_timed(*a, **k):
        got = originals["execute_timed"](*a, **k)
        phases.end(f"step {step_now['step']} credit generations")
        return got

    # every hf generate call: its rows, longest prompt and steps, and the resident set's rise
    # during it (from its start to the kernel's mark at its end; the mark is not reset here)
    from mas.rollout.backends import hf

    calls: list[dict] = []
    group = hf.HFBackend._generate_group

    def generate_group(self, handle, reqs):
        before, mark = status_mb("VmRSS"), status_mb("VmHWM")
        if args.longest or args.suppress:
            model, generate = handle.model, handle.model.generate
            extra: dict = {"min_new_tokens": None} if args.longest else {}
            if args.suppress:
                extra["bad_words_ids"] = [handle.tokenizer(w, add_special_tokens=False)["input_ids"]
                                          for word in args.suppress for w in (word, " " + word)]

            def forced(**kw):
                if args.longest:
                    extra["min_new_tokens"] = kw["max_new_tokens"]
                return generate(**kw, **extra)

            model.generate = forced
            try:
                got = group(self, handle, reqs)
            finally:
                del model.generate  # the class's method again
        else:
            got = group(self, handle, reqs)
        after = status_mb("VmHWM")
        calls.append({"phase": len(phases.rows), "policy": handle.name, "rows": len(reqs),
                      "prompt": max(len(r.prompt_ids) for r in reqs), "new": max(len(g.completion_ids) for g in got),
                      "start_mb": before, "mark_before_mb": mark, "peak_mb": after})
        if args.calls and len(reqs) >= args.calls:  # as it goes: a run cut short still says what its calls held
            c = calls[-1]
            print(f"  call {c['policy']} {c['rows']} rows x {c['prompt']} prompt tokens, {c['new']} steps: RSS {before:,.0f} "
                  f"-> mark {after:,.0f} MiB{' (mark set before)' if after <= mark else ''}", flush=True)
        return got

    hf.HFBackend._generate_group = generate_group
    trainer.evaluate, trainer.warm_up, trainer.train_step = evaluate, warm_up, train_step
    trainer.rollout, trainer.execute_timed = rollout, execute_timed
    with tempfile.TemporaryDirectory(prefix="mas-phases-") as tmp:
        mas.train(team, args.run_dir or Path(tmp) / "run")
    phases.end("after train")
    steps = [c for c in calls if c["phase"] < len(phases.rows) and phases.rows[c["phase"]]["phase"].startswith("step ")]
    if steps:
        print(f"\nRL steps' generate calls: {len(steps)}, longest prompt {max(c['prompt'] for c in steps)} tokens, "
              f"most steps {max(c['new'] for c in steps)}")
    whole = max(r["peak_mb"] for r in phases.rows)

    print("\n| phase | RSS at start (MiB) | peak (MiB) | RSS at end (MiB) | seconds |")
    print("|---|---|---|---|---|")
    for r in phases.rows:
        if r["phase"] == "between" and r["peak_mb"] - r["start_mb"] < 1:
            continue
        print(f"| {r['phase']} | {r['start_mb']:,.0f} | {r['peak_mb']:,.0f} | {r['end_mb']:,.0f} | {r['seconds']:.0f} |")
    print(f"\nwhole-run peak: {whole:,.0f} MiB")
    print("\nlargest generate call of each phase (rows x longest prompt, steps; RSS at its start, the phase's mark after it):")
    by_phase: dict[int, dict] = {}
    for c in calls:
        if c["phase"] not in by_phase or c["peak_mb"] - c["start_mb"] > by_phase[c["phase"]]["peak_mb"] - by_phase[c["phase"]]["start_mb"]:
            by_phase[c["phase"]] = c
    for i, c in sorted(by_phase.items()):
        name = phases.rows[i]["phase"] if i < len(phases.rows) else "?"
        n = sum(1 for x in calls if x["phase"] == i)
        print(f"  {name}: {n} calls; largest {c['policy']} {c['rows']} rows x {c['prompt']} prompt tokens, {c['new']} steps: "
              f"RSS {c['start_mb']:,.0f} -> mark {c['peak_mb']:,.0f} MiB")
    print("\nplan (MiB):")
    for r in plan:
        print("  " + ", ".join(f"{k} {v:,.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    peak = [r["peak"] for r in plan if "peak" in r]
    if peak:
        print(f"measured / planned peak: {whole:,.0f} / {max(peak):,.0f} = {whole / max(peak):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"phases": phases.rows, "calls": calls, "plan": plan, "whole_mb": whole}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
