"""Rollout throughput: the framework's engine against raw ``model.generate`` on the same batches.

Runs the quickstart team (embedded model) for a few rollouts and records every batch the
engine sent to the backend.  Then it replays exactly those batches as plain left-padded
``model.generate`` calls (same prompts, same max_new_tokens, same sampling) and compares
completion tokens per second, measured side by side in one process.  The ratio is the cost
of everything around generation: LangGraph execution, batching, prompt rendering, parsing
and bookkeeping.  That cost is also printed per turn:

    overhead per turn = (framework seconds - raw generate seconds) / turns

which does not shrink with model size (it is Python around the model calls), so it is the
number that says what the framework costs at scale.

Both wall time and the process's CPU time are reported: on a shared machine other
processes stretch wall time, while CPU time counts only this process's own work (with one
torch thread, ``--threads 1``, it is the time the work itself took).  ``--repeat N`` runs
the same rollouts (same seeds, so the same batches) and the same raw replay N times each
and keeps the fastest of each, the usual way to read through the noise of a busy machine.

``--gc-freeze`` moves every object alive once the team is built (torch, transformers, the
model, LangGraph's modules: about half a million) out of Python's cyclic garbage collector
(``gc.freeze``), as a training script could.  A rollout's own objects are freed by reference
counting (the built-in topologies leave no cyclic garbage), yet every few rollouts the
collector scans that whole heap; the flag shows what that costs per turn.

``--breakdown`` runs the same rollouts once more with CPU timers around the parts of a turn
and prints where the framework's time goes, per turn: the model's ``generate``, the backend
around it (logprobs, decoding, batching), prompt rendering, Python's garbage collector (a
collection is charged to the collector, not to the part it interrupted), and the rest
(LangGraph's graph execution, the engine, parsing, asyncio).  It also runs LangGraph alone
on the same episode shapes, a graph of one node that does nothing but route back to itself
as many times as each episode had turns, all episodes of a rollout at once as the engine
runs them: the floor any turn pays with LangGraph as the engine.

``--backend vllm`` (run it with ``.venv-vllm/bin/python``, docs/vllm.md) builds the team with
every policy on the vLLM backend and compares, on the batches its rollouts sent, the vLLM
backend against the hf backend (``transformers`` generate) on the same weights, side by side
in one process: completion tokens per second of each, the engine's start-up time, and
``--parity`` the largest and mean difference of each side's sampling logprobs from the
learner's recompute (``mas.learning.logprobs.turn_logprobs``), i.e. what the PPO ratio starts from.

    python bench/rollout_throughput.py [--config configs/quickstart.yaml] [--steps 3] [--device cpu]
                                       [--threads N] [--repeat N] [--gc-freeze] [--breakdown]
    .venv-vllm/bin/python bench/rollout_throughput.py --backend vllm --config configs/smol_orchestrator.yaml
                                       [--dtype float32] [--parity] [--steps 3] [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections import Counter

import torch

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from mas.agents.prompts import PromptCache
from mas.config.schema import load_config
from mas.training.team import build_team
from mas.topologies.base import TeamState


def raw_generate(policies, batches) -> tuple[int, float, float]:
    """(completion tokens, wall seconds, CPU seconds) of plain ``generate`` on ``batches``."""
    tokens, seconds, cpu = 0, 0.0, 0.0
    for reqs in batches:
        by_policy: dict[str, list] = {}
        for r in reqs:
            by_policy.setdefault(r.policy, []).append(r)
        for name, rs in by_policy.items():
            handle = policies[name]
            tok, model = handle.tokenizer, handle.model
            width = max(len(r.prompt_ids) for r in rs)
            ids = torch.full((len(rs), width), tok.pad_token_id)
            mask = torch.zeros((len(rs), width), dtype=torch.long)
            for i, r in enumerate(rs):
                ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
                mask[i, width - len(r.prompt_ids):] = 1
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.no_grad():
                out = model.generate(input_ids=ids.to(handle.device), attention_mask=mask.to(handle.device),
                                     do_sample=True, temperature=rs[0].temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=max(r.max_new_tokens for r in rs),
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            seconds += time.perf_counter() - t0
            cpu += time.process_time() - c0
            new = out[:, width:]
            # count up to and including the first EOS, like the framework does
            for row in new.tolist():
                tokens += (row.index(tok.eos_token_id) + 1) if tok.eos_token_id in row else len(row)
    return tokens, seconds, cpu


class PartClock:
    """CPU seconds spent in each wrapped part; garbage collections are a part of their own."""

    def __init__(self) -> None:
        self.parts: Counter[str] = Counter()
        self._gc_start = 0.0

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.process_time()
        else:
            self.parts["gc"] += time.process_time() - self._gc_start

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            c0, gc0 = time.process_time(), self.parts["gc"]
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] += time.process_time() - c0 - (self.parts["gc"] - gc0)
        return timed


def langgraph_floor(rollouts: list[list[int]]) -> float:
    """CPU seconds LangGraph alone takes for these rollouts (each a list of turns per episode),
    garbage collection left out."""
    async def node(state: TeamState, config) -> Command:
        step = state["step"] + 1
        return Command(update={"step": step, "last": step}, goto="turn" if step < config["configurable"]["turns"] else END)

    g = StateGraph(TeamState)
    g.add_node("turn", node, destinations=("turn", END))
    g.add_edge(START, "turn")
    graph = g.compile()

    async def rollout(turns: list[int]) -> None:
        await asyncio.gather(*[graph.ainvoke({"step": 0, "last": None}, config={"configurable": {"turns": n}}) for n in turns])

    asyncio.run(rollout(rollouts[0]))  # warm-up
    gc.disable()  # garbage collection has its own line in the breakdown
    try:
        c0 = time.process_time()
        for turns in rollouts:
            asyncio.run(rollout(turns))
        return time.process_time() - c0
    finally:
        gc.enable()


def breakdown(team, cfg, tasks: list) -> None:
    """One more pass of the same rollouts with the parts of a turn timed (see the module docstring)."""
    clock = PartClock()
    models = {id(h.model): h.model for h in team.policies.values()}  # LoRA policies may share one module
    for model in models.values():
        model.generate = clock.wrap("generate", model.generate)
    generate_batch, render = team.backend.generate_batch, PromptCache.render
    team.backend.generate_batch = clock.wrap("backend", generate_batch)
    PromptCache.render = clock.wrap("render", render)
    gc.callbacks.append(clock.on_gc)
    try:
        shapes, c0 = [], time.process_time()
        for step, step_tasks in enumerate(tasks):
            groups = team.engine.rollout(step_tasks, cfg.trainer.group_size, seed=step + 1)
            shapes.append([len(e.turns) for g in groups for e in g.episodes])
        total = time.process_time() - c0
    finally:
        gc.callbacks.remove(clock.on_gc)
        PromptCache.render = render
        team.backend.generate_batch = generate_batch
        for model in models.values():
            del model.generate
    turns = sum(map(sum, shapes))
    floor = langgraph_floor(shapes)
    p = clock.parts
    rows = [("model generate", p["generate"]), ("backend around generate", p["backend"] - p["generate"]),
            ("prompt rendering", p["render"]), ("garbage collection", p["gc"]),
            ("LangGraph, engine, parsing, asyncio", total - p["backend"] - p["render"] - p["gc"])]
    print(f"where the time goes (CPU ms per turn, {turns} turns):")
    for name, seconds in rows:
        print(f"  {name:38s}{seconds / turns * 1e3:8.3f}")
    print(f"  {'framework besides generate':38s}{(total - p['generate']) / turns * 1e3:8.3f}")
    print(f"  {'LangGraph alone, same episode shapes':38s}{floor / turns * 1e3:8.3f}")


def backend_side_by_side(team, batches: list[list], repeat: int, parity: bool) -> None:
    """The vLLM backend against the hf backend on the same weights and the same recorded batches
    (see the module docstring).  Each batch is sent whole to each backend, as the engine sent it."""
    from mas.rollout.backends.hf import HFBackend
    from mas.learning.logprobs import turn_logprobs

    vllm_backend = team.backend
    hf = HFBackend(team.policies)
    stats = vllm_backend.stats

    def run(backend) -> tuple[int, float, list]:
        tokens, seconds, results = 0, 0.0, []
        for i, reqs in enumerate(batches):
            t0 = time.perf_counter()
            out = backend.generate_batch(reqs, seed=i)
            seconds += time.perf_counter() - t0
            tokens += sum(len(r.completion_ids) for r in out)
            results.append(out)
        return tokens, seconds, results

    sides = {}
    for name, backend in (("vllm", vllm_backend), ("hf", hf)):
        runs = [run(backend) for _ in range(repeat)]
        best = min(runs, key=lambda r: r[1])
        sides[name] = best
    requests = sum(map(len, batches))
    print(f"vLLM engine start-up: {stats.engine_start_s:.1f} s for {stats.engines_started} engine(s)")
    print(f"{len(batches)} batches, {requests} requests (the team's own rollouts), best of {repeat}")
    print(f"{'':10s}{'tokens':>10s}{'seconds':>10s}{'tokens/s':>10s}{'s/batch':>10s}")
    for name, (tokens, seconds, _) in sides.items():
        print(f"{name:10s}{tokens:>10d}{seconds:>10.2f}{tokens / seconds:>10.1f}{seconds / len(batches):>10.3f}")
    (vt, vs, _), (ht, hs, _) = sides["vllm"], sides["hf"]
    print(f"vLLM / hf tokens per second: {(vt / vs) / (ht / hs):.2f}")
    if parity:
        for name, (_, _, results) in sides.items():
            diffs = []
            for reqs, outs in zip(batches, results):
                by_policy: dict[str, list] = {}
                for q, r in zip(reqs, outs):
                    by_policy.setdefault(q.policy, []).append((q, r))
                for policy, pairs in by_policy.items():
                    with team.policies[policy].activate() as model:
                        ref = turn_logprobs(model, [(q.prompt_ids, r.completion_ids) for q, r in pairs],
                                            [q.temperature for q, _ in pairs])
                    diffs += [abs(a - b) for (_, r), lp in zip(pairs, ref) for a, b in zip(r.logprobs, lp)]
            diffs.sort()
            print(f"{name} logprobs - learner's recompute: max {diffs[-1]:.3g}, mean {sum(diffs) / len(diffs):.3g}, "
                  f"p99 {diffs[int(0.99 * (len(diffs) - 1))]:.3g} over {len(diffs)} tokens")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default=None, help="override policies' device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: the config's runtime)")
    ap.add_argument("--repeat", type=int, default=1, help="measure each side this many times, keep the fastest")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() once the team is built (see the module docstring)")
    ap.add_argument("--breakdown", action="store_true", help="time the parts of a turn in one more pass (module docstring)")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf",
                    help="vllm: the vLLM backend against the hf backend on the team's batches (module docstring)")
    ap.add_argument("--dtype", default=None, help="override policies' dtype (float32, bfloat16)")
    ap.add_argument("--parity", action="store_true", help="--backend vllm: logprobs against the learner's recompute")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    args = ap.parse_args()
    names = list(load_config(args.config).policies)
    overrides = list(args.set)
    overrides += [f"policies.{p}.device={args.device}" for p in names] if args.device else []
    overrides += [f"policies.{p}.dtype={args.dtype}" for p in names] if args.dtype else []
    overrides += [f"policies.{p}.backend=vllm" for p in names] if args.backend == "vllm" else []
    cfg = load_config(args.config, overrides)
    team = build_team(cfg)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    batches: list[list] = []
    generate = team.backend.generate_batch
    team.backend.generate_batch = lambda reqs, seed=None: (batches.append(list(reqs)), generate(reqs, seed))[1]

    team.engine.rollout(team.env.sample_tasks(cfg.trainer.batch_size), cfg.trainer.group_size, seed=0)  # warm-up
    tasks = [team.env.sample_tasks(cfg.trainer.batch_size) for _ in range(args.steps)]
    if args.backend == "vllm":
        batches.clear()  # the team's own batches, after the warm-up rollout
        for step in range(args.steps):
            team.engine.rollout(tasks[step], cfg.trainer.group_size, seed=step + 1)
        del team.backend.generate_batch  # stop recording
        try:
            print(f"config {args.config}  dtype {cfg.policies[names[0]].dtype}  torch threads {torch.get_num_threads()}")
            backend_side_by_side(team, list(batches), args.repeat, args.parity)
        finally:
            team.close()
        return
    runs = []  # (wall s, cpu s) of each repetition of the same rollouts
    for rep in range(args.repeat):
        batches.clear()
        tokens = turns = 0
        t0, c0 = time.perf_counter(), time.process_time()
        for step in range(args.steps):
            groups = team.engine.rollout(tasks[step], cfg.trainer.group_size, seed=step + 1)
            tokens += sum(len(t.completion_ids) for g in groups for e in g.episodes for t in e.turns)
            turns += sum(len(e.turns) for g in groups for e in g.episodes)
        runs.append((time.perf_counter() - t0, time.process_time() - c0))
    framework_s, framework_cpu = min(w for w, _ in runs), min(c for _, c in runs)
    raws = [raw_generate(team.policies, batches) for _ in range(args.repeat)]
    raw_tokens = raws[0][0]
    raw_s, raw_cpu = min(r[1] for r in raws), min(r[2] for r in raws)

    fw, raw = tokens / framework_s, raw_tokens / raw_s
    device = next(iter(team.policies.values())).device
    print(f"config {args.config}  device {device}  torch threads {torch.get_num_threads()}  "
          f"best of {args.repeat}" + ("  gc frozen after build" if args.gc_freeze else ""))
    print(f"rollouts: {args.steps} x {cfg.trainer.batch_size} tasks x {cfg.trainer.group_size} episodes, "
          f"{turns} turns, {len(batches)} backend batches, {sum(map(len, batches))} requests")
    print(f"{'':24s}{'tokens':>10s}{'seconds':>10s}{'cpu s':>10s}{'tokens/s':>12s}")
    print(f"{'framework rollout':24s}{tokens:>10d}{framework_s:>10.2f}{framework_cpu:>10.2f}{fw:>12.0f}")
    print(f"{'raw model.generate':24s}{raw_tokens:>10d}{raw_s:>10.2f}{raw_cpu:>10.2f}{raw:>12.0f}")
    print(f"ratio framework / raw generate: {fw / raw:.2f} (wall), {(tokens / framework_cpu) / (raw_tokens / raw_cpu):.2f} (cpu)")
    print(f"framework overhead per turn: {(framework_s - raw_s) / turns * 1e3:.3f} ms (wall), "
          f"{(framework_cpu - raw_cpu) / turns * 1e3:.3f} ms (cpu)")
    if args.breakdown:
        breakdown(team, cfg, tasks)


if __name__ == "__main__":
    main()
