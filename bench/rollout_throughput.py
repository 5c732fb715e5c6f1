"""Rollout throughput: the framework's engine against raw ``model.generate`` on the same batches.

Runs the quickstart team (embedded model) for a few rollouts and records every batch the
engine sent to the backend.  Then it replays exactly those batches as plain left-padded
``model.generate`` calls (same prompts, same max_new_tokens, same sampling) and compares
completion tokens per second, measured side by side in one process.  The ratio is the cost
of everything around generation: LangGraph execution, batching, prompt rendering, parsing
and bookkeeping.

    python bench/rollout_throughput.py [--config configs/quickstart.yaml] [--steps 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from mas.config import load_config
from mas.team import build_team


def raw_generate(policies, batches) -> tuple[int, float]:
    tokens, seconds = 0, 0.0
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
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids.to(handle.device), attention_mask=mask.to(handle.device),
                                     do_sample=True, temperature=rs[0].temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=max(r.max_new_tokens for r in rs),
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            seconds += time.perf_counter() - t0
            new = out[:, width:]
            # count up to and including the first EOS, like the framework does
            for row in new.tolist():
                tokens += (row.index(tok.eos_token_id) + 1) if tok.eos_token_id in row else len(row)
    return tokens, seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default=None, help="override policies' device (cpu, cuda)")
    args = ap.parse_args()
    overrides = [f"policies.{p}.device={args.device}" for p in load_config(args.config).policies] if args.device else []
    cfg = load_config(args.config, overrides)
    team = build_team(cfg)
    batches: list[list] = []
    generate = team.backend.generate_batch
    team.backend.generate_batch = lambda reqs, seed=None: (batches.append(list(reqs)), generate(reqs, seed))[1]

    team.engine.rollout(team.env.sample_tasks(cfg.trainer.batch_size), cfg.trainer.group_size, seed=0)  # warm-up
    batches.clear()
    tokens, t0 = 0, time.perf_counter()
    for step in range(args.steps):
        groups = team.engine.rollout(team.env.sample_tasks(cfg.trainer.batch_size), cfg.trainer.group_size, seed=step + 1)
        tokens += sum(len(t.completion_ids) for g in groups for e in g.episodes for t in e.turns)
    framework_s = time.perf_counter() - t0
    raw_tokens, raw_s = raw_generate(team.policies, batches)

    fw, raw = tokens / framework_s, raw_tokens / raw_s
    device = next(iter(team.policies.values())).device
    print(f"config {args.config}  device {device}  torch threads {torch.get_num_threads()}")
    print(f"rollouts: {args.steps} x {cfg.trainer.batch_size} tasks x {cfg.trainer.group_size} episodes, "
          f"{len(batches)} backend batches, {sum(map(len, batches))} requests")
    print(f"{'':24s}{'tokens':>10s}{'seconds':>10s}{'tokens/s':>12s}")
    print(f"{'framework rollout':24s}{tokens:>10d}{framework_s:>10.2f}{fw:>12.0f}")
    print(f"{'raw model.generate':24s}{raw_tokens:>10d}{raw_s:>10.2f}{raw:>12.0f}")
    print(f"ratio framework / raw generate: {fw / raw:.2f}")


if __name__ == "__main__":
    main()
