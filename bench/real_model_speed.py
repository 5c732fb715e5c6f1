"""Real-model speed and memory: the four numbers of a step on SmolLM2, before and after.

Runs one team config (default ``configs/smol_orchestrator.yaml``, SmolLM2-135M-Instruct with a
LoRA adapter per policy) and prints, side by side in one run:

1. **tokens per update against distinct tokens**: token positions the learner runs through
   the model in one update (``forward_tokens``, padding included), over the batch's distinct
   token positions (the nodes of the prefix tree of its turns; ``distinct_tokens``).  Before:
   one sequence per turn (``packing: false``); after: the prefix-tree packing.
2. **learner against a hand-written PPO-clip loop** over the same token positions: the same
   packed forward passes, written as the few lines anyone would write (whole-model forward,
   ``log_softmax``, gather, clipped surrogate, backward, AdamW step), timed against
   ``Learner.update`` on the same samples in the same process.
3. **peak RSS** of a training run of the team (2 steps, ``mas train`` in a fresh process each,
   read from the run's ``memory.peak_rss_mb``): before (packing, chunked log-probabilities and
   gradient checkpointing off, the micro-batch of 16 turns that was tried by hand) and after
   (the config as shipped).
4. **rollout against raw generate**: the engine's rollout against plain batched
   ``model.generate`` calls on exactly the batches the engine sent (``bench/rollout_throughput.py``).

    python bench/real_model_speed.py [--config configs/smol_orchestrator.yaml] [--steps 2] [--json out.json]
                                     [--set policies.planner.device=cuda ...] [--skip-runs]

On CUDA each side of (2) runs once untimed first (kernel and allocator set-up), and both are
timed to a synchronised device.  Each learner's ``memory_plan`` (which memory savers its
``auto`` settings chose, and the estimate) is printed with its timing.

Nothing here is asserted: the numbers go to docs/benchmarks/memory.md with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from rollout_throughput import raw_generate  # noqa: E402  (the same replay of the engine's batches)

from mas.config.schema import load_config  # noqa: E402
from mas.learning.learner import PAD_ID  # noqa: E402
from mas.learning.logprobs import pack, passes  # noqa: E402
from mas.training.team import build_team  # noqa: E402
from mas.training.trainer import rollout, training_batches  # noqa: E402

BEFORE = {"packing": "false", "logprob_chunk": "null", "gradient_checkpointing": "false", "micro_batch_size": "16"}


def overrides_for(cfg, switches: dict[str, str]) -> list[str]:
    return [f"policies.{name}.optim.{k}={v}" for name, p in cfg.policies.items() if p.kind != "frozen" for k, v in switches.items()]


def run_peak(config: str, extra: list[str], steps: int) -> dict:
    """A fresh ``mas train`` of ``steps`` steps; its peak RSS, step time and update tokens."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "mas.cli", "train", config, f"trainer.steps={steps}", "trainer.eval_size=0",
               "trainer.save_every=0", "logging.progress=false", "trainer.warmup.steps=0", *extra, "--run-dir", str(run)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps_rows = [r for r in rows if "step" in r and "eval" not in r]
        last = steps_rows[-1]
        return {
            "peak_rss_mb": max(r["memory"]["peak_rss_mb"] for r in steps_rows),
            "step_s": [round(r["time"]["step"], 1) for r in steps_rows],
            "update_s": [round(r["time"]["update"], 1) for r in steps_rows],
            "rollout_s": [round(r["time"]["rollout"], 1) for r in steps_rows],
            "forward_tokens": {n: p["forward_tokens"] for n, p in last["policies"].items()},
            "distinct_tokens": {n: p["distinct_tokens"] for n, p in last["policies"].items()},
            "wall_s": round(wall, 1),
        }


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def raw_ppo_loop(handle, samples, micro_batch_tokens: int, lr: float, clip: float = 0.2, sync: bool = False) -> float:
    """The hand-written reference: the same packed passes, whole-model logits, log_softmax,
    gather, PPO-clip, backward, one AdamW step.  Returns its seconds."""
    model, dev = handle.model, handle.device
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    packing = pack(seqs, [len(s.prompt_ids) for s in samples], micro_batch_tokens)
    old = torch.tensor([samples[i].old_logprobs[j] for i, j in zip(packing.sample, packing.index)])
    adv = torch.tensor([samples[i].advantage for i in packing.sample])
    old, adv = old.to(dev), adv.to(dev)
    params = handle.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=lr)
    t0 = time.perf_counter()
    with handle.activate():
        model.train()
        for g in passes(packing, max_tokens=micro_batch_tokens, pad_id=PAD_ID):
            mask = g.attention_mask.to(dev)
            if mask.dim() == 4:
                mask = torch.zeros(mask.shape, device=dev).masked_fill_(~mask, torch.finfo(torch.float32).min)
            logits = model(input_ids=g.input_ids.to(dev), position_ids=g.position_ids.to(dev), attention_mask=mask,
                           use_cache=False).logits
            pair_row, pair_pos, targets = g.pair_row.to(dev), g.pair_pos.to(dev), g.targets.to(dev)
            logp = torch.log_softmax(logits[pair_row, pair_pos].float(), -1).gather(-1, targets[:, None]).squeeze(-1)
            pairs = g.pairs.to(dev)
            ratio = torch.exp(logp - old[pairs])
            a = adv[pairs]
            loss = -torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a).sum() / len(packing.sample)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()
    _sync(sync)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/smol_orchestrator.yaml")
    ap.add_argument("--steps", type=int, default=2, help="training steps of each peak-RSS run")
    ap.add_argument("--skip-before-run", action="store_true", help="skip the slow 'before' training run (peak RSS)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, repeatable (e.g. policies.planner.device=cuda)")
    ap.add_argument("--skip-runs", action="store_true", help="skip the peak-RSS training runs (1 and 3) altogether")
    args = ap.parse_args()
    cfg = load_config(args.config, ["trainer.warmup.steps=0", *args.set])
    out: dict = {"config": args.config, "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}

    # 4. rollout against raw generate, and the samples every learner below scores
    team = build_team(cfg)
    batches: list[list] = []
    generate = team.backend.generate_batch
    team.backend.generate_batch = lambda reqs, seed=None: (batches.append(list(reqs)), generate(reqs, seed))[1]
    if any(h.device.type == "cuda" for h in team.policies.values()):
        rollout(team, 0)  # untimed: CUDA's first-call set-up (context, kernels) is in neither timing
        batches.clear()
    t0 = time.perf_counter()
    done = rollout(team, 0)
    framework_s = time.perf_counter() - t0
    tokens = sum(len(t.completion_ids) for g in done.groups for e in g.episodes for t in e.turns)
    raw_tokens, raw_s, _ = raw_generate(team.policies, batches)  # (tokens, wall s, CPU s)
    out["rollout"] = {"tokens": tokens, "seconds": round(framework_s, 2), "raw_tokens": raw_tokens, "raw_seconds": round(raw_s, 2),
                      "ratio": round((tokens / framework_s) / (raw_tokens / raw_s), 3), "batches": len(batches)}
    from mas.credit import build_credit_batch, run_credit

    credit = run_credit(build_credit_batch(done.groups, list(team.agents)), cfg.credit, None)
    samples, _ = training_batches(team, done.groups, credit, team.learners)

    # 2. the learner against the hand-written loop (same samples, same packed passes, same process)
    out["update"] = {}
    cuda = any(h.device.type == "cuda" for h in team.policies.values())
    for name, learner in team.learners.items():
        handle = team.policies[name]
        start = [p.detach().clone() for p in learner.params]
        kept = [p.detach().clone() for p in start]
        moments = learner.optimizer.state_dict()
        todo = [s for s in samples[name] if s.completion_ids]
        lr = learner.optimizer.param_groups[0]["lr"] or 1e-4
        if cuda:  # each side once untimed first: CUDA's first-call set-up (kernels, allocator) is in neither timing
            learner.update(samples[name])
            raw_ppo_loop(handle, todo, learner.micro_batch_tokens, lr=lr)
            learner.optimizer.load_state_dict(moments)
        for p, v in zip(learner.params, kept):
            p.data.copy_(v)
        _sync(cuda)
        t = time.perf_counter()
        metrics = learner.update(samples[name])
        _sync(cuda)
        learner_s = time.perf_counter() - t
        for p, v in zip(learner.params, start):  # the same starting weights for the loop
            p.data.copy_(v)
        raw_s = raw_ppo_loop(handle, todo, learner.micro_batch_tokens, lr=lr, sync=cuda)
        plan = learner.memory_plan
        out["update"][name] = {"turns": len(samples[name]), "learner_seconds": round(learner_s, 3),
                               "raw_loop_seconds": round(raw_s, 3), "learner_over_raw": round(raw_s / learner_s, 3),
                               "forward_tokens": metrics["forward_tokens"], "distinct_tokens": metrics["distinct_tokens"],
                               "checkpointing": learner.checkpointing, "logprob_chunk": learner.logprob_chunk,
                               "memory_plan": plan.reason}
    team.close()
    if args.skip_runs:
        print(json.dumps(out, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
        return

    # 1 + 3. tokens per update and peak RSS of a whole run (fresh processes), before and after
    out["run_after"] = run_peak(args.config, [], args.steps)
    if not args.skip_before_run:
        out["run_before"] = run_peak(args.config, overrides_for(cfg, BEFORE), args.steps)

    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
