"""One learner pass of SmolLM2, its resident memory and time under three allocator settings.

Scores a packed row of ``--tokens`` positions (one path, or with ``--tree`` two replies sharing a
prompt, the tree mask) with a LoRA adapter on SmolLM2-135M-Instruct (float32, decoder layers
checkpointed, the head in chunks of 1,024: what ``auto`` chooses on the CPU for these sizes), as
the learner does (``mas.learning.logprobs.token_logprobs_packed``), then backward.  Each setting
runs in a fresh process, one torch thread, so torch reads its allocator setting as it loads:

    glibc 4 MiB   glibc's mmap threshold fixed at 4 MiB (``keep_large_blocks_off_the_heap``), torch's
                  allocator as it comes (64-byte aligned)
    + THP         the same, and ``THP_MEM_ALLOC_ENABLE=1`` (``huge_pages_for_large_tensors``): what
                  the mas command sets
    256 KiB       glibc's mmap threshold at 256 KiB: every activation its own mapping

Per pass: the kernel's high-water mark of the resident set (``VmHWM``, reset before the pass)
less the resident set before it, and the seconds.  The first pass also pages the weights in, so
the table shows the later ones.  The plan's estimate of the same pass is printed beside it.

    python bench/pass_memory.py --tokens 1024 2048 [--tree] [--passes 3]

Linux only.  Nothing is asserted: the numbers go to docs/benchmarks/memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = {
    "glibc 4 MiB": {},
    "+ THP": {"THP_MEM_ALLOC_ENABLE": "1"},
    "256 KiB": {"MALLOC_MMAP_THRESHOLD_": "262144"},
}


def child(tokens: int, tree: bool, passes: int) -> dict:
    """Runs in the fresh process: the passes, as JSON."""
    import ctypes
    import time

    from mas.process.memory import keep_large_blocks_off_the_heap

    keep_large_blocks_off_the_heap()  # a no-op where MALLOC_MMAP_THRESHOLD_ is set (the 256 KiB row)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mas.learning.logprobs import pack, passes as make_passes, split_model, token_logprobs_packed
    from mas.learning.memory_plan import checkpointed_bytes, enable_checkpointing, logits_bytes
    from mas.models.sources import gguf_folder

    torch.set_num_threads(1)

    def status_mb(key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))

    model = AutoModelForCausalLM.from_pretrained(gguf_folder("smollm2-135m-instruct", "float32"), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    enable_checkpointing(model)
    model.train()
    g = torch.Generator().manual_seed(0)
    if tree:  # two replies of 3/8 of the row each to one prompt of a quarter of it
        prompt = torch.randint(10, 40000, (tokens // 4,), generator=g).tolist()
        seqs = [prompt + torch.randint(10, 40000, (tokens * 3 // 8,), generator=g).tolist() for _ in range(2)]
        starts = [tokens // 4] * 2
    else:  # one conversation: a prompt of half the row, a reply of the other half
        seqs, starts = [torch.randint(10, 40000, (tokens,), generator=g).tolist()], [tokens // 2]
    batch = make_passes(pack(seqs, starts, tokens, share=True), max_tokens=tokens, pad_id=0)[0]
    heads = split_model(model)
    trim = ctypes.CDLL(None).malloc_trim
    rows = []
    for _ in range(passes):
        trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start, t0 = status_mb("VmRSS"), time.perf_counter()
        logp, _ = token_logprobs_packed(model, batch, torch.ones(batch.targets.shape[0]), chunk=1024, heads=heads)
        logp.sum().backward()
        rows.append({"rise_mb": status_mb("VmHWM") - start, "seconds": time.perf_counter() - t0})
        model.zero_grad(set_to_none=True)
        del logp
    k = int(batch.targets.shape[0])
    plan = (checkpointed_bytes(model, tokens) + logits_bytes(model, min(k, 1024))) / 2**20
    return {"passes": rows, "plan_mb": plan, "completion_tokens": k}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--tree", action="store_true", help="two replies to one prompt (the tree mask)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.tokens[0], args.tree, args.passes)))
        return 0
    base = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "MALLOC_MMAP_THRESHOLD_")}
    base.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    print("| tokens | setting | rise per pass after the first (MiB) | seconds per pass | plan (MiB) |")
    print("|---|---|---|---|---|")
    for tokens in args.tokens:
        for name, env in SETTINGS.items():
            cmd = [sys.executable, __file__, "--child", "--tokens", str(tokens), "--passes", str(args.passes)]
            done = subprocess.run(cmd + (["--tree"] if args.tree else []), env={**base, **env},
                                  capture_output=True, text=True, check=True)
            got = json.loads(done.stdout.strip().splitlines()[-1])
            later = got["passes"][1:] or got["passes"]
            rise = ", ".join(f"{p['rise_mb']:,.0f}" for p in later)
            secs = ", ".join(f"{p['seconds']:.1f}" for p in later)
            print(f"| {tokens}{' (tree)' if args.tree else ''} | {name} | {rise} | {secs} | {got['plan_mb']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
