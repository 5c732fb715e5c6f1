"""Held-out evaluation: the policy a user deploys first, the one RL samples beside it.

One evaluation of ``size`` held-out tasks (``evaluate``) measures:

* **greedy** (the headline): every agent decodes greedily, one episode per task.  ``accuracy``
  is its mean reward (a math team's accuracy, a research team's F1 or EM), with the env's named
  scores, each agent's turns, parse failures and verified accuracy, and ``tasks``: each task's
  reward, in task order, for paired comparisons (the same tasks every time);
* **sampled**, where the team trains by sampling (an agent of a trainable policy has a
  temperature above 0) and ``trainer.eval_sampled_k`` > 0: k episodes per task, every agent at
  its own sampling settings, seeded.  ``avg`` is avg@k (the mean reward over the k·size
  episodes), ``pass`` is pass@k (per task the best of its k rewards, averaged: for a 0/1 reward
  the share of tasks solved at least once), as Dr. MAS reports avg@16 / pass@16 and C3 avg@k;
* **training tasks** (``trainer.eval_train``): the greedy accuracy on ``size`` training tasks drawn
  once from the start of the run's own task stream (the tasks its first steps train on), so a
  gap between training and held-out accuracy under the same (deployed) decoding shows memorised
  tasks.

The start of a run (the evaluation before RL, or after the format warm-up) is what later
evaluations are compared with: ``regression`` says whether an evaluation's greedy accuracy is
below the start's by more than the noise of a paired comparison on these tasks, the guard
against the greedy regression RL can cause while its sampled accuracy rises.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from mas.envs import build_env
from mas.process.memory import release_freed_memory
from mas.training.metrics import eval_metrics

PAIRED_Z = 2.0  # standard errors of the paired difference that make a drop more than noise


def trains_by_sampling(cfg) -> bool:
    """Whether some agent of a trainable policy samples (temperature > 0) in training rollouts."""
    trainable = {name for name, p in cfg.policies.items() if p.kind != "frozen"}
    return any(a.sampling.temperature > 0 for a in cfg.agents if a.policy in trainable)


def sampled_k(cfg) -> int:
    """Sampled episodes per task in an evaluation: ``trainer.eval_sampled_k`` where the team trains by sampling, else 0."""
    return cfg.trainer.eval_sampled_k if trains_by_sampling(cfg) else 0


def training_probe(team, size: int) -> list:
    """``size`` training tasks from the start of the run's own task stream (a fresh env of the same
    config, so the run's stream is not moved), drawn once per team."""
    probe = getattr(team, "train_probe", None)
    if probe is None or len(probe) != size:
        probe = build_env(team.cfg.env).sample_tasks(size)
        team.train_probe = probe
    return probe


def evaluate(team, size: int, seed: int, abort: Callable[[], bool] | None = None, progress: bool = False,
             label: str = "eval") -> dict[str, Any]:
    """One held-out evaluation of ``size`` tasks (module docstring).  ``progress``: a bar of its
    episodes on stderr (``label``, done / all, time left), gone when it ends."""
    cfg = team.cfg
    tool_agents = [a.name for a in cfg.agents if a.tools]
    k = sampled_k(cfg)
    total = size * (1 + k + (1 if cfg.trainer.eval_train else 0))  # greedy, k sampled each, the training probe
    with tqdm(total=total, desc=label, unit="episode", file=sys.stderr, dynamic_ncols=True, leave=False,
              disable=not progress) as bar:
        def done() -> None:
            bar.update(1)

        out = measure(team, team.env.eval_tasks(size), seed, k, tool_agents, abort, done)
        if cfg.trainer.eval_train:  # greedy only: the gap under the deployed decoding, at a third of the cost
            train = measure(team, training_probe(team, size), seed, 0, tool_agents, abort, done)
            out["train"] = {"accuracy": train["accuracy"]}
    faults, _ = team.engine.take_faults()
    # the evaluation's generate calls (KV caches and logits of up to hundreds of rows) leave a
    # fragmented heap that glibc keeps; without this, the warm-up or evaluation that follows
    # grows on top of it (docs/benchmarks/memory.md, "Soak")
    release_freed_memory()
    return {**out, "faults": faults}


def measure(team, tasks: list, seed: int, k: int, tool_agents: list[str], abort=None,
            done: Callable[[], None] | None = None) -> dict[str, Any]:
    """Greedy results on ``tasks`` (with ``decoding`` and per-task ``tasks`` rewards), and ``sampled``
    (k episodes per task) where k > 0; ``done`` is called as each episode ends."""
    greedy = team.engine.evaluate(tasks, seed=seed, abort=abort, done=done)
    out = {**eval_metrics(greedy, tool_agents=tool_agents), "decoding": "greedy", "tasks": [ep.reward for ep in greedy]}
    if k:
        groups = team.engine.rollout(tasks, k, seed, greedy=False, abort=abort, done=done)
        out["sampled"] = sampled_metrics([g.episodes for g in groups], tool_agents)
        out["sampled"]["temperature"] = {a.name: a.sampling.temperature for a in team.cfg.agents}
    return out


def sampled_metrics(per_task: list[list], tool_agents: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """avg@k and pass@k over k sampled episodes per task (``per_task[i]``: task i's episodes),
    with the env's scores and each agent's counts over all of them (``eval_metrics``)."""
    episodes = [ep for eps in per_task for ep in eps]
    k = min((len(eps) for eps in per_task), default=0)
    m = eval_metrics(episodes, tool_agents=tool_agents)
    best = [max(ep.reward for ep in eps) for eps in per_task if eps]
    return {**{key: v for key, v in m.items() if key != "accuracy"}, "k": k, "avg": m["accuracy"],
            "pass": statistics.fmean(best) if best else 0.0}


def paired_drop(start: list[float], now: list[float]) -> dict[str, float] | None:
    """The mean per-task change from ``start`` to ``now`` (the same tasks, in order), its standard
    error, and the noise floor ``PAIRED_Z`` standard errors (at least one task's worth, 1/n); None
    when the two do not cover the same tasks."""
    if not start or len(start) != len(now):
        return None
    d = [b - a for a, b in zip(start, now)]
    n = len(d)
    se = statistics.stdev(d) / math.sqrt(n) if n > 1 else 0.0
    return {"change": statistics.fmean(d), "se": se, "floor": max(PAIRED_Z * se, 1.0 / n), "tasks": n}


def regression(start: dict[str, Any], now: dict[str, Any]) -> dict[str, float] | None:
    """Where ``now``'s greedy accuracy is below ``start``'s by more than the noise floor of a paired
    comparison on the same tasks (``paired_drop``): the start, now, the change and the floor; else None."""
    drop = paired_drop(start.get("tasks") or [], now.get("tasks") or [])
    if drop is None or drop["change"] >= -drop["floor"]:
        return None
    return {"start": start["accuracy"], "now": now["accuracy"], **drop}
