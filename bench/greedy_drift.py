"""Why does RL lower a parts team's greedy held-out accuracy while its sampled accuracy rises?

Trains a parts team (``team_relay``, ``team_conjunctive``: each specialist answers its own part,
either at once, ``ANSWER: 5``, or worked out, ``3+4=7 7-2=5 ANSWER: 5``) and, before training
and every ``--every`` steps, measures the same policy four ways on two fixed task sets:

* decoding: greedy, and sampled at each agent's own temperature (``--k`` seeded passes, avg@k);
* tasks: ``--size`` held-out tasks, and ``--size`` training tasks drawn once from the run's own
  stream before training (the train-vs-held-out gap under the same decoding).

For every specialist turn it records which branch the turn took (at once or worked), whether
its part was right, the completion length, and, from one forward pass over the turn's prompt,
the probability the policy puts on the at-once branch (the first token of ``ANSWER``).  So a
greedy drop can be read as: the decision moved (more at-once answers), the worked arithmetic got
worse (worked answers right less often), the format drifted (length, parse failures), or only
training tasks improved (memorisation).  Per step it also prints the training reward and each
policy's entropy, KL (when on) and clip fraction from ``metrics.jsonl``.

    python bench/greedy_drift.py configs/team_relay_n8.yaml --steps 40 --every 10 --out runs/drift \\
        [key=value overrides, e.g. trainer.kl_coef=0.1 agents.s1.sampling.temperature=0.6]

Prints one table per evaluation point and writes ``OUT/drift.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import mas
from mas.envs import build_env
from mas.envs.team.relay import first_word, right
from mas.training.trainer import train as train_run
from mas.training.warmup import warm_up

BRANCH = "ANSWER"


def at_once(text: str) -> bool:
    """The at-once branch: the reply opens with the answer marker (no worked step before it)."""
    return text.lstrip().upper().startswith(BRANCH)


@torch.no_grad()
def p_at_once(team, turns) -> list[float]:
    """P(first completion token = the first token of ``ANSWER``) for each turn's prompt."""
    out = []
    for turn in turns:
        handle = team.policies[turn.policy]
        first = handle.tokenizer(BRANCH, add_special_tokens=False)["input_ids"][0]
        ids = torch.tensor([turn.prompt_ids], device=handle.device)
        logits = handle.model(input_ids=ids).logits[0, -1].float()
        out.append(float(torch.softmax(logits, -1)[first]))
    return out


def measure(team, tasks, seed: int, sample: bool) -> dict:
    episodes = team.engine.evaluate(tasks, seed=seed, sample=sample)
    team.engine.take_faults()
    turns, rights, branch = [], [], []
    for ep in episodes:
        gold = ep.task.meta["answers"]
        for t, g in zip(sorted(ep.turns, key=lambda t: t.index), gold):
            turns.append(t)
            rights.append(right(first_word(t.parsed.get("answer")), g))
            branch.append(at_once(t.text))
    worked = [r for r, b in zip(rights, branch) if not b]
    once = [r for r, b in zip(rights, branch) if b]
    return {
        "team": statistics.fmean(ep.reward for ep in episodes),
        "parts": statistics.fmean(rights),
        "at_once": statistics.fmean(branch),
        "worked_right": statistics.fmean(worked) if worked else None,
        "at_once_right": statistics.fmean(once) if once else None,
        "tokens": statistics.fmean(len(t.completion_ids) for t in turns),
        "unparsed": statistics.fmean(not t.parsed.get("valid", True) for t in turns),
        "_turns": turns,
    }


def point(team, heldout, train_tasks, k: int, seed: int) -> dict:
    row = {}
    for name, tasks in (("heldout", heldout), ("train", train_tasks)):
        g = measure(team, tasks, seed, sample=False)
        probs = p_at_once(team, g.pop("_turns"))
        g["p_at_once"] = statistics.fmean(probs)
        g["p_at_once_gt_half"] = statistics.fmean(p > 0.5 for p in probs)
        row[f"{name}/greedy"] = g
        samples = [measure(team, tasks, seed + 1000 * (i + 1), sample=True) for i in range(k)]
        for s in samples:
            s.pop("_turns")
        row[f"{name}/sampled"] = {key: (statistics.fmean(s[key] for s in samples if s[key] is not None)
                                        if any(s[key] is not None for s in samples) else None)
                                  for key in samples[0]}
    return row


def show(step, row) -> None:
    print(f"\n== after step {step} ==" if step >= 0 else "\n== warm start ==")
    cols = ("team", "parts", "at_once", "at_once_right", "worked_right", "p_at_once", "p_at_once_gt_half", "tokens", "unparsed")
    print("| set/decoding | " + " | ".join(cols) + " |")
    for name, m in row.items():
        print(f"| {name} | " + " | ".join("-" if m.get(c) is None else f"{m[c]:.3f}" for c in cols) + " |")
    sys.stdout.flush()


class Probe:
    def __init__(self, team, heldout, train_tasks, every: int, k: int, seed: int, out: dict):
        self.team, self.heldout, self.train_tasks, self.every, self.k, self.seed, self.out = \
            team, heldout, train_tasks, every, k, seed, out

    def on_step_end(self, step, metrics, groups, credit):
        pol = {n: {k: p.get(k) for k in ("entropy", "kl", "clip_frac", "grad_norm")} for n, p in metrics["policies"].items()}
        self.out["steps"].append({"step": step, "reward": metrics["reward"]["team"], "policies": pol})
        ent = statistics.fmean(p["entropy"] for p in pol.values() if p["entropy"] is not None)
        print(f"step {step}: train reward {metrics['reward']['team']:.3f}, mean entropy {ent:.3f}")
        if (step + 1) % self.every == 0:
            row = point(self.team, self.heldout, self.train_tasks, self.k, self.seed)
            self.out["points"].append({"step": step, **row})
            show(step, row)
        return False


def shuffle_advantages() -> None:
    """Wrap the trainer's credit call so each step's advantages are permuted among its turns
    (seeded by the step's RNG, which the trainer reseeds every step)."""
    import mas.training.trainer as trainer

    credit_of = trainer.run_credit

    def shuffled(batch, cfg, results):
        credit = credit_of(batch, cfg, results)
        credit.advantages = credit.advantages[torch.randperm(credit.advantages.numel())]
        return credit

    trainer.run_credit = shuffled


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=40, help="RL steps (0: measure the start only)")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--size", type=int, default=100, help="held-out and training tasks measured")
    ap.add_argument("--k", type=int, default=4, help="sampled passes per evaluation (avg@k)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shuffle-advantages", action="store_true",
                    help="the noise control: each step's advantages, randomly reassigned among its turns (same values, "
                         "no relation to what a turn did)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.shuffle_advantages:
        shuffle_advantages()
    team = mas.load_team(args.config, [*args.overrides, f"trainer.steps={args.steps}", "trainer.eval_size=0",
                                       "trainer.save_every=0", "logging.progress=false"])
    heldout = team.env.eval_tasks(args.size)
    train_tasks = build_env(team.cfg.env).sample_tasks(args.size)  # the run's own stream, from its start
    seed = team.cfg.trainer.seed
    if team.cfg.trainer.warmup.steps:  # the format warm-up first, so the first point measures its result
        warm_up(team, print)
        trainer_cfg = team.cfg.trainer.model_copy(update={"warmup": type(team.cfg.trainer.warmup)()})
        team.cfg = team.cfg.model_copy(update={"trainer": trainer_cfg})
    out = {"config": args.config, "overrides": args.overrides, "steps": [], "points": []}
    row = point(team, heldout, train_tasks, args.k, seed)
    out["points"].append({"step": -1, **row})
    show(-1, row)
    if args.steps:
        train_run(team, args.out, callbacks=[Probe(team, heldout, train_tasks, args.every, args.k, seed, out)])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "drift.json").write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out / 'drift.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
