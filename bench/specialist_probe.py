"""Can the specialists do their own sums?  Each specialist of an orchestrator team, asked every
held-out sub-problem of its operation directly, greedy, as the orchestrator would ask it.

A team's held-out evaluation scores a specialist only on the calls its orchestrator made, so a
warm-up that answers at once leaves the specialists almost unmeasured, and a trained one that
always delegates measures them on other sub-problems.  This probe asks each specialist the same
questions every time: the left-to-right steps of the first ``--tasks`` held-out tasks whose
operation its name says (``adder``: ``+``, ``subtractor``: ``-``), with the message the
orchestrator topology sends it (the sub-problem alone, ``a+b``), greedy, and scores the answer
with the turn verifier (``envs/math/turns.py``): the specialist's verified accuracy on held-out
sub-problems.

    python bench/specialist_probe.py CONFIG --warmup [--seed S]        # after the config's warm-up
    python bench/specialist_probe.py CONFIG --run RUN_DIR              # a run's last checkpoint
        [--tasks 100] [--threads 1] [key.sub=value ...]

The warm-up is the run's own (``trainer.warmup``, seeded by ``trainer.seed``), so ``--warmup
--seed S`` gives what a study's seed S started its RL from.  Prints one line per specialist
and, with ``--json``, writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).parents[1]


@dataclass
class Outcome:  # what a topology returns (mas.rollout.engine.Outcome's fields)
    answer: str | None
    truncated: bool = False


class AskOne:
    """A one-turn topology: the specialist gets the sub-problem as the orchestrator topology sends it."""

    def __init__(self, agent: str):
        self.agent = agent

    async def run(self, ctx) -> Outcome:
        turn = await ctx.call(self.agent, ctx.agents[self.agent].messages(ctx.task.prompt), parent=None)
        return Outcome(turn.parsed.get("answer"))


OPS = {"add": "+", "sub": "-", "mul": "*"}


def sub_problems(env, n_tasks: int, op: str) -> list:
    """Each distinct held-out step ``a op b`` as a one-step task (its own steps, for the verifier)."""
    from mas.envs.math.synthetic import make_task

    seen, out = set(), []
    for task in env.eval_tasks(n_tasks):
        for a, o, b, _ in task.meta["steps"]:
            if o == op and (a, b) not in seen:
                seen.add((a, b))
                out.append(make_task([a, b], [o]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--warmup", action="store_true", help="run the config's warm-up, then probe")
    where.add_argument("--run", help="probe the last checkpoint of this run directory")
    ap.add_argument("--seed", type=int, default=None, help="trainer.seed (the warm-up's seed)")
    ap.add_argument("--tasks", type=int, default=100, help="held-out tasks whose steps are asked")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import torch

    from mas.training.checkpoint import latest_checkpoint, load_checkpoint
    from mas.config.schema import load_config
    from mas.training.team import build_team
    from mas.training.warmup import warm_up

    torch.set_num_threads(args.threads)
    overrides = list(args.overrides) + ([f"trainer.seed={args.seed}"] if args.seed is not None else [])
    if args.run:
        cfg = load_config(Path(args.run) / "config.yaml", overrides)
    else:
        cfg = load_config(args.config, overrides)
    team = build_team(cfg)
    if args.run:
        ckpt = latest_checkpoint(Path(args.run))
        if ckpt is None:
            raise SystemExit(f"{args.run}: no checkpoint")
        load_checkpoint(ckpt, team)
        where = f"{args.run} ({ckpt.name})"
    else:
        if cfg.trainer.warmup.steps:
            warm_up(team, lambda msg: print(msg, file=sys.stderr))
        where = f"after the warm-up (seed {cfg.trainer.seed})"
    results = {}
    for name in cfg.topology.specialists:
        op = next((o for hint, o in OPS.items() if hint in name.lower()), None)
        if op is None:
            continue
        tasks = sub_problems(team.env, args.tasks, op)
        team.engine.topology = AskOne(name)
        episodes = team.engine.evaluate(tasks, seed=cfg.trainer.seed)
        right = [float(t.extra_rewards.get("verified", 0.0)) for ep in episodes for t in ep.turns]
        results[name] = {"questions": len(tasks), "verified_accuracy": sum(right) / max(len(right), 1)}
        print(f"{name}: {results[name]['verified_accuracy']:.3f} verified accuracy on {len(tasks)} held-out "
              f"'{op}' sub-problems, {where}")
    team.runtime.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"where": where, "specialists": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
