"""Runtime scaling: the Ray runtime against the local one, measured side by side in one run.

Three measurements, each a ratio of two runs of the same team from the same seed:

1. Update phase, local (the policies update one after another) against ray (each policy's
   actor updates at the same time).  The team: 3 debaters (one round, majority vote), each on
   its own trainable policy, so the three updates are the same size; the model is a
   random-weight Qwen2-architecture model large enough that one update takes about a second
   or more on one CPU core.  Local runs twice: with 1 torch thread (what each
   actor gets) and with every core (what a local run would use by default).
2. A whole step under ray with ``trainer.max_staleness: 0`` against ``1`` (the next step's
   rollout runs while this step's updates do).  Overlap can only fill what a phase leaves
   idle, so this team is one whose phases leave cores idle: a chain of 2 agents on 2 policies
   (the rollout runs one agent at a time, so one actor samples while the other waits), longer
   answers and 1 PPO epoch, so the rollout and the update phases take about as long.  The
   gain is bounded by (rollout + update) / max(rollout, update) and, on c cores, by the work
   that fits: a team of the first kind, whose 3 actors keep every core busy in both phases,
   gains little from overlap on 2 cores (its figure is printed too).
3. Ray's overhead per step on the quickstart team (embedded model): step time under ray
   against local, and where the time goes (phase by phase).

Step 0 of every run is a warm-up and is left out; the figures are means over the other steps.
One Ray instance serves every ray run (its start-up is not counted); its temp dir is under
``--work-dir``.

    python bench/runtime_scaling.py [--steps 5] [--hidden 320] [--layers 6] [--quickstart-steps 6]
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mas.config.schema import load_config, validate_config
from mas.training.team import build_team
from mas.models.tiny import tiny_causal_lm, train_tokenizer
from mas.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("p0", "p1", "p2")
CORPUS = ["You are agent. Task: 3+4-2 ANSWER: 5 CALL adder: 3+4 ACCEPT REJECT", "Task: 9-1+7 ANSWER: 15"] * 20


def parity_reward(episode) -> float:
    """A reward a random-weight model earns about half the time (so advantages are not all 0)."""
    turns = [t for t in episode.turns if t.completion_ids]
    return float(turns[0].completion_ids[0] % 2) if turns else 0.0


def overlap_team(model_dir: Path, steps: int, staleness: int, args) -> dict:
    """2 agents in a chain, each on its own trainable policy; phases of about equal length."""
    cfg = scaling_team(model_dir, steps, "ray", 1, staleness, args)
    names = POLICIES[:2]
    cfg["policies"] = {p: cfg["policies"][p] for p in names}
    cfg["agents"] = [{**a, "sampling": {"max_new_tokens": args.overlap_new_tokens}} for a in cfg["agents"][:2]]
    cfg["topology"] = {"kind": "chain", "sequence": [a["name"] for a in cfg["agents"]]}
    cfg["trainer"]["ppo_epochs"] = 1
    return cfg


def scaling_team(model_dir: Path, steps: int, kind: str, threads: int, staleness: int, args) -> dict:
    """3 debaters (one round, majority vote), each on its own trainable policy of the model in ``model_dir``."""
    policy = {"kind": "full", "model": str(model_dir), "device": "cpu",
              "optim": {"lr": 1e-4, "micro_batch_size": args.micro_batch}}
    return {
        "team": {"name": "scaling"},
        "policies": {p: copy.deepcopy(policy) for p in POLICIES},
        "agents": [{"name": f"a{i}", "policy": p, "role": f"You are debater {i}.", "parser": "answer",
                    "sampling": {"max_new_tokens": args.new_tokens}} for i, p in enumerate(POLICIES)],
        "topology": {"kind": "debate", "debaters": [f"a{i}" for i in range(len(POLICIES))], "rounds": 1},
        "env": {"name": "synthetic_math", "num_ops": 2, "seed": 0},
        "credit": {"method": "grpo"},
        "trainer": {"steps": steps, "batch_size": args.batch_size, "group_size": args.group_size,
                    "ppo_epochs": args.ppo_epochs, "eval_size": 0, "max_staleness": staleness, "seed": 0},
        "runtime": {"kind": kind, "num_threads": threads},
        "logging": {"progress": False},
    }


class StepClock:
    """Each step's metrics and the wall time between consecutive step ends (the step's whole
    cost, including a rollout that ran ahead during the previous step)."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.metrics: list[dict] = []

    def on_step_end(self, step, metrics, groups, credit) -> None:
        self.ends.append(time.perf_counter())
        self.metrics.append(metrics)

    def step_seconds(self) -> float:
        """Mean wall time per step after the warm-up step."""
        gaps = [b - a for a, b in zip(self.ends, self.ends[1:])]
        return statistics.mean(gaps)

    def mean(self, key: str) -> float:
        """Mean of ``time.<key>`` over the steps after the warm-up."""
        return statistics.mean(m["time"].get(key, 0.0) for m in self.metrics[1:])


def run(cfg, run_dir: Path, reward=None) -> StepClock:
    clock = StepClock()
    with build_team(cfg) as team:
        if reward is not None:
            team.engine.score = reward
        train(team, run_dir, callbacks=[clock])
    return clock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="steps per scaling run (the first is a warm-up)")
    ap.add_argument("--hidden", type=int, default=320)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--ppo-epochs", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--overlap-new-tokens", type=int, default=48, help="answer length in the overlap team (part 2)")
    ap.add_argument("--quickstart-steps", type=int, default=6, help="steps per quickstart run (0: skip part 3)")
    ap.add_argument("--work-dir", default=str(ROOT / ".mas_tmp" / "bench_runtime"), help="models, run dirs, Ray temp dir")
    args = ap.parse_args()

    import ray

    from mas.runtime.ray_cluster import ray_temp_dir, start_local_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cores = os.cpu_count() or 1
    temp = ray_temp_dir(work)
    start_local_ray(ray, num_cpus=max(cores, len(POLICIES)), include_dashboard=False, _temp_dir=str(temp), logging_level="WARNING")
    try:
        tok = train_tokenizer(CORPUS, vocab_size=300)
        model = tiny_causal_lm(tok, hidden_size=args.hidden, num_layers=args.layers, num_heads=4, seed=0)
        model_dir = work / "model"
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        params = sum(p.numel() for p in model.parameters())
        print(f"machine: {cores} cores, torch {torch.__version__}, no GPU used; Ray {ray.__version__}")
        print(f"scaling team: 3 trainable policies of {params / 1e6:.1f}M parameters each (hidden {args.hidden}, "
              f"{args.layers} layers), {args.batch_size} tasks x {args.group_size} episodes, {args.ppo_epochs} PPO epochs, "
              f"{args.steps} steps (step 0 left out)")

        def timed(team: dict, name: str) -> StepClock:
            t0 = time.perf_counter()
            clock = run(validate_config(team), work / name, parity_reward)
            print(f"  ran {name} in {time.perf_counter() - t0:.0f} s")
            return clock

        local1 = timed(scaling_team(model_dir, args.steps, "local", 1, 0, args), "local-1thread")
        localn = timed(scaling_team(model_dir, args.steps, "local", cores, 0, args), f"local-{cores}threads")
        ray0 = timed(scaling_team(model_dir, args.steps, "ray", 1, 0, args), "ray-staleness0")
        ray1 = timed(scaling_team(model_dir, args.steps, "ray", 1, 1, args), "ray-staleness1")
        chain0 = timed(overlap_team(model_dir, args.steps, 0, args), "chain-staleness0")
        chain1 = timed(overlap_team(model_dir, args.steps, 1, args), "chain-staleness1")

        print("\n1. update phase (mean seconds per step)")
        print(f"{'run':34s}{'update phase':>14s}" + "".join(f"{'update/' + p:>12s}" for p in POLICIES))
        for name, c in ((f"local, 1 thread", local1), (f"local, {cores} threads", localn), ("ray, 1 thread per actor", ray0)):
            print(f"{name:34s}{c.mean('update'):14.2f}" + "".join(f"{c.mean('update/' + p):12.2f}" for p in POLICIES))
        print(f"ratio local (1 thread) / ray:      {local1.mean('update') / ray0.mean('update'):.2f}x")
        print(f"ratio local ({cores} threads) / ray:     {localn.mean('update') / ray0.mean('update'):.2f}x")

        print("\n2. whole step under ray (mean wall seconds between step ends)")
        print(f"{'run':34s}{'step':>8s}{'rollout':>10s}{'credit':>8s}{'update':>8s}{'sync':>8s}")
        rows = (("chain of 2, max_staleness 0", chain0), ("chain of 2, max_staleness 1", chain1),
                ("3 debaters, max_staleness 0", ray0), ("3 debaters, max_staleness 1", ray1))
        for name, c in rows:
            rollout = c.mean("rollout_overlapped") if name.endswith("1") else c.mean("rollout")
            print(f"{name:34s}{c.step_seconds():8.2f}{rollout:10.2f}{c.mean('credit'):8.2f}{c.mean('update'):8.2f}{c.mean('sync'):8.2f}")
        print("  (with max_staleness 1 the rollout column is the next step's rollout, run inside the update phase)")
        print(f"ratio staleness 0 / staleness 1, chain of 2:   {chain0.step_seconds() / chain1.step_seconds():.2f}x")
        print(f"ratio staleness 0 / staleness 1, 3 debaters:   {ray0.step_seconds() / ray1.step_seconds():.2f}x")

        if args.quickstart_steps:
            overrides = [f"trainer.steps={args.quickstart_steps}", "trainer.eval_size=0", "logging.progress=false"]
            qs = {}
            for kind in ("local", "ray"):
                cfg = load_config(ROOT / "configs" / "quickstart.yaml", [*overrides, f"runtime.kind={kind}"])
                qs[kind] = run(cfg, work / f"quickstart-{kind}")
            print(f"\n3. quickstart team, {args.quickstart_steps} steps (step 0 left out): mean seconds per step")
            print(f"{'run':34s}{'step':>8s}{'rollout':>10s}{'credit':>8s}{'update':>8s}{'sync':>8s}")
            for kind, c in qs.items():
                print(f"{kind:34s}{c.step_seconds():8.2f}{c.mean('rollout'):10.2f}{c.mean('credit'):8.2f}"
                      f"{c.mean('update'):8.2f}{c.mean('sync'):8.2f}")
            print(f"ratio ray / local (Ray's overhead per step): {qs['ray'].step_seconds() / qs['local'].step_seconds():.2f}x")
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
