"""Step metrics and the run directory writer (metrics.jsonl, episodes.jsonl, progress bar).

Run directory layout:
    config.yaml        the resolved config
    metrics.jsonl      one JSON object per step (and one per evaluation, with "eval": name)
    episodes.jsonl     sample episodes with each turn's credit
    checkpoints/       see mas.checkpoint
    summary.json       held-out accuracy before/after and the final step
    tensorboard/       the same step metrics as TensorBoard scalars (torch's SummaryWriter):
                       reward/team, agents/<name>/<metric>, policies/<name>/<metric>, time/<phase>, ...
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mas.config import RunConfig, dump_config
from mas.types import Credit, CreditBatch, Episode, EpisodeGroup, flatten_turns


def _stats(x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    return {
        "mean": float(x.mean()),
        "std": float(x.std(unbiased=False)),
        "min": float(x.min()),
        "max": float(x.max()),
    }


def step_metrics(
    step: int,
    groups: list[EpisodeGroup],
    batch: CreditBatch,
    credit: Credit,
    updates: dict[str, dict[str, float]],
    timings: dict[str, float],
    cost: dict[str, int] | None = None,
) -> dict[str, Any]:
    episodes = [ep for g in groups for ep in g.episodes]
    turn_reward = batch.episode_rewards[batch.episode_ids]  # [N]
    agents: dict[str, Any] = {}
    flat = flatten_turns(groups)
    for k, name in enumerate(batch.agent_names):
        sel = batch.agent_ids == k  # [N]
        n = int(sel.sum())
        if n == 0:
            continue
        agents[name] = {
            "reward": float(turn_reward[sel].mean()),
            "advantage": _stats(credit.advantages[sel]),
            "turns": n,
            "invalid": float(batch.invalid[sel].float().mean()),
            "completion_tokens": sum(len(t.completion_ids) for (_, t), s in zip(flat, sel.tolist()) if s),
        }
    return {
        "step": step,
        "reward": {"team": statistics.fmean(ep.reward for ep in episodes)},
        "agents": agents,
        "advantage": _stats(credit.advantages),
        "episodes": {
            "count": len(episodes),
            "errors": sum(ep.status == "error" for ep in episodes),
            "truncated": sum(ep.status == "truncated" for ep in episodes),
            "turns": statistics.fmean(len(ep.turns) for ep in episodes),
        },
        "policies": updates,
        "credit_cost": cost or {},
        "credit": {k: float(v) for k, v in credit.breakdown.items() if v.dim() == 0},  # scalar diagnostics
        "tokens": sum(len(t.completion_ids) for _, t in flat),
        "time": timings,
    }


def credit_cost(requests: list, results: dict | None) -> dict[str, int]:
    """Credit-specific overhead of a step: evaluations planned and generations they took."""
    from mas.types import CritiqueRequest, InterventionRequest, ReplayRequest

    keys = {r.key: r for r in requests}  # equal keys are evaluated once
    sampled = 0
    for items in (results or {}).values():
        for ep in items:
            if isinstance(ep, Episode):
                sampled += sum(1 for t in ep.turns if not t.replayed and t.finish_reason not in ("masked", "removed"))
    return {
        "replays": sum(isinstance(r, ReplayRequest) for r in keys.values()),
        "interventions": sum(isinstance(r, InterventionRequest) for r in keys.values()),
        "critiques": sum(isinstance(r, CritiqueRequest) for r in keys.values()),
        "extra_generations": sampled,
    }


def eval_metrics(episodes: list[Episode]) -> dict[str, Any]:
    return {
        "accuracy": statistics.fmean(ep.reward for ep in episodes) if episodes else 0.0,
        "episodes": len(episodes),
        "errors": sum(ep.status == "error" for ep in episodes),
        "truncated": sum(ep.status == "truncated" for ep in episodes),
    }


def episode_record(step: int, ep: Episode, advantages: list[float]) -> dict[str, Any]:
    d = ep.to_dict()
    d.pop("info", None)
    d["step"] = step
    for t, a in zip(d["turns"], advantages):
        t["credit"] = a
        for k in ("prompt_ids", "completion_ids", "logprobs"):
            t[k] = len(t[k])  # lengths only: the text is what people read
    return d


class RunLogger:
    def __init__(self, run_dir: Path, cfg: RunConfig, show_progress: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.episodes_path = self.run_dir / "episodes.jsonl"
        self.show_progress = show_progress
        self.bar: tqdm | None = None
        self.tb = _tensorboard_writer(self.run_dir / "tensorboard")

    # -- files -------------------------------------------------------------------------------

    def _append(self, path: Path, record: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (written after the last checkpoint of a crashed run)."""
        for path in (self.metrics_path, self.episodes_path):
            if path.exists():
                keep = [line for line in path.read_text().splitlines() if json.loads(line).get("step", -1) <= step]
                path.write_text("".join(line + "\n" for line in keep))

    def log_step(self, metrics: dict, groups: list[EpisodeGroup], credit: Credit, n_samples: int) -> None:
        _check_finite(metrics)
        self._append(self.metrics_path, metrics)
        if self.tb is not None:
            for tag, value in _scalars(metrics):
                self.tb.add_scalar(tag, value, metrics["step"])
            self.tb.flush()
        advs = credit.advantages.tolist()
        pos = 0
        written = 0
        for g in groups:
            for ep in g.episodes:
                n = len(ep.turns)
                if written < n_samples and ep.sample_id == 0:
                    self._append(self.episodes_path, episode_record(metrics["step"], ep, advs[pos : pos + n]))
                    written += 1
                pos += n
        if self.bar is not None:
            post = {"team": f"{metrics['reward']['team']:.2f}"}
            post.update({name: f"{a['reward']:.2f}" for name, a in metrics["agents"].items()})
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def log_eval(self, name: str, metrics: dict) -> None:
        self._append(self.metrics_path, {"eval": name, **metrics})

    def write_summary(self, summary: dict) -> None:
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))

    # -- terminal ----------------------------------------------------------------------------

    def start_progress(self, total: int, initial: int) -> None:
        if self.show_progress:
            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)

    def close_progress(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.tb is not None:
            self.tb.close()

    def info(self, msg: str) -> None:
        (self.bar.write if self.bar is not None else print)(msg)


def _tensorboard_writer(path: Path):
    """torch's SummaryWriter, or None (with a note) if the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("tensorboard is not installed: writing metrics.jsonl only (pip install tensorboard)", file=sys.stderr)
        return None
    return SummaryWriter(log_dir=str(path))


def _scalars(metrics: dict, prefix: str = ""):
    """(tag, value) for every number in a nested step-metrics dict; the step itself is the x axis."""
    for k, v in metrics.items():
        tag = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _scalars(v, tag + "/")
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
            yield tag, float(v)


def _check_finite(metrics: dict, path: str = "") -> None:
    for k, v in metrics.items():
        if isinstance(v, dict):
            _check_finite(v, f"{path}{k}.")
        elif isinstance(v, float) and not math.isfinite(v):
            raise FloatingPointError(f"step {metrics.get('step', '?')}: metric {path}{k} is {v}")
