"""A policy sharded over its workers (``sharding: fsdp``) against one worker: the same update, and
what each worker holds.  One process trains unsharded, then N processes (gloo) train sharded, on
the same batch of turns and from the same weights, side by side.

The policy is trained as mas trains it (``PolicyHandle`` and ``Learner``: one PPO update).  Per
process the script records the update's loss and gradient norm, the weights after the step (the
sharded ones gathered), and the bytes it holds in the model's parameters, their gradients (just
before the optimizer step) and the optimizer state (each worker's shards where sharded), with the
process's resident set.

    python bench/sharding.py --model smollm2-135m-instruct --kind full --dtype float32   # memory (target <= 0.6)
    python bench/sharding.py --model embedded --kind full                                 # equality
    python bench/sharding.py --model smollm2-135m-instruct --kind lora --dtype bfloat16   # equality

Prints the equality (|loss - loss'|, |grad norm - grad norm'|, the largest weight difference
against the largest weight change) and one row of memory per worker.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch


def tensor_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this worker's shard
    return local.numel() * local.element_size()


def batch(vocab: int, n: int = 16, seed: int = 0):
    from mas.learning.learner import TrainSample

    g = torch.Generator().manual_seed(seed)
    return [TrainSample(torch.randint(5, vocab, (24,), generator=g).tolist(), torch.randint(5, vocab, (16,), generator=g).tolist(),
                        (-3 * torch.rand(16, generator=g)).tolist(), float(torch.randn(1, generator=g)), 1.0)
            for _ in range(n)]


def measure(rank: int, world: int, port: int, model: str, kind: str, dtype: str, out: str) -> None:
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    torch.set_num_threads(1)
    from mas.agents.policy import build_policies
    from mas.config.schema import OptimConfig, PolicyConfig
    from mas.learning.learner import Learner
    from mas.process.memory import peak_rss_mb, rss_mb

    handle = build_policies({"p": PolicyConfig(kind=kind, model=model, dtype=dtype, device="cpu")})["p"]
    lr = 1e-4 if kind == "lora" or model == "embedded" else 1e-5
    learner = Learner(handle, OptimConfig(lr=lr, micro_batch_tokens=256), 10, 0.2, 0.2, 0.0, "token_mean")
    before = {n: p.detach().clone() for n, p in handle.model.named_parameters() if p.requires_grad}
    samples = batch(handle.model.config.vocab_size)
    if world > 1:
        import torch.distributed as dist

        from mas.runtime.data_parallel import TorchDistributedSync
        from mas.runtime.sharding import shard_model

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        learner.sync = TorchDistributedSync(world)
        shard_model(handle.model)
        learner.sharded(world)
        samples = samples[rank::world]
    grads = {}

    def count_gradients(optimizer, args, kwargs):  # the gradients as the optimizer sees them
        grads["bytes"] = sum(tensor_bytes(p.grad) for p in learner.params if p.grad is not None)

    learner.optimizer.register_step_pre_hook(count_gradients)
    metrics = learner.update(samples, seed=0)
    params = sum(tensor_bytes(p) for p in handle.model.parameters())
    optim = sum(tensor_bytes(v) for s in learner.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
    row = {"rank": rank, "world": world, "parameters": params, "gradients": grads["bytes"], "optimizer": optim,
           "rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb(), "loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}
    after = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in handle.model.named_parameters()
             if n in before}
    if rank == 0:
        torch.save({n: after[n] - before[n].to(after[n].device) for n in before}, Path(out, f"steps-of{world}.pt"))
        row["moved"] = max(float((after[n].float() - before[n].float()).abs().max()) for n in before)
    Path(out, f"rank{rank}-of{world}.json").write_text(json.dumps(row))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--kind", default="full", choices=("full", "lora"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(measure, args=(1, 0, args.model, args.kind, args.dtype, out), nprocs=1)
        mp.spawn(measure, args=(args.workers, free_port(), args.model, args.kind, args.dtype, out), nprocs=args.workers)
        rows = [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"))]
        s1, sn = (torch.load(Path(out, f"steps-of{w}.pt")) for w in (1, args.workers))  # each weight's change
    one = next(r for r in rows if r["world"] == 1)
    sharded = next(r for r in rows if r["world"] == args.workers and r["rank"] == 0)
    diff = max(float((s1[n].float() - sn[n].float()).abs().max()) for n in s1)
    rel = (sum(float((s1[n].float() - sn[n].float()).pow(2).sum()) for n in s1)
           / max(sum(float(s1[n].float().pow(2).sum()) for n in s1), 1e-30)) ** 0.5
    print(f"{args.model}, kind {args.kind}, {args.dtype}, one update of 16 turns: 1 worker against {args.workers} sharded")
    print(f"  loss {one['loss']:.8f} vs {sharded['loss']:.8f} (|diff| {abs(one['loss'] - sharded['loss']):.2e}); "
          f"grad norm {one['grad_norm']:.8f} vs {sharded['grad_norm']:.8f} (|diff| {abs(one['grad_norm'] - sharded['grad_norm']):.2e})")
    print(f"  weights after the step: largest |diff| {diff:.2e}, against a largest change of {one['moved']:.2e} "
          f"({diff / one['moved']:.1%} of it); the two steps differ by {rel:.2%} of the step (L2)")
    mib = 2**20
    print(f"per worker after the update (MiB)")
    print("| workers | rank | parameters | gradients | AdamW state | sum | sum / unsharded | RSS now | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["world"], r["rank"])):
        total = r["parameters"] + r["gradients"] + r["optimizer"]
        base = one["parameters"] + one["gradients"] + one["optimizer"]
        print(f"| {r['world']} | {r['rank']} | {r['parameters'] / mib:,.1f} | {r['gradients'] / mib:,.1f} | "
              f"{r['optimizer'] / mib:,.1f} | {total / mib:,.1f} | {total / base:.2f} | {r['rss_mb']:,.0f} | {r['peak_rss_mb']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
