"""Step metrics and the run directory writer (metrics.jsonl, episodes.jsonl, progress bar).

Run directory layout (docs/report.md says what each file holds):
    config.yaml        the resolved config (config.<N>.yaml: an earlier segment's, when a resume changed it)
    metrics.jsonl      one JSON object per line, in the order written; ``kind`` says which:
                       "eval" (a held-out evaluation, named by "eval": the "before" one, where
                       there is one, is the first line), "warmup" (the format warm-up) and
                       "step" (one per training step).  Runs written before ``kind`` existed
                       tell them apart by the "eval" and "warmup" keys (``record_kind``).
    episodes.jsonl     sample episodes with each turn's credit
    warnings.jsonl     the run's warnings, one {"step", "kind", "message"} per line; created
                       empty at the start, so it is there in a run without warnings
    checkpoints/       see mas.training.checkpoint
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

from mas.config.schema import RunConfig, dump_config
from mas.process.memory import peak_rss_mb, rss_mb
from mas.training.rundir import write_keeping_earlier
from mas.errors import MissingDependencyError  # still importable from here
from mas.envs.base import DESIGNED
from mas.envs.verifiers import VERIFIED
from mas.types import FAILURE, Credit, CreditBatch, Episode, EpisodeGroup, flatten_turns


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
    generated: dict[str, int] | None = None,
    faults: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One step's record for metrics.jsonl and TensorBoard.

    Per agent: reward (mean outcome of the episodes it spoke in), credit share (its summed
    positive credit over the team's; None when no turn got positive credit) and the part of it
    its unparsed turns earned, advantage statistics, turns, completion tokens, parse
    failures, tool calls and tool-call validity (where turns carry a ``tool_valid`` signal).
    Where a turn verifier scored its turns (``turn.extra_rewards["verified"]``,
    ``envs/verifiers.py``), ``verified_accuracy``: the mean verifier score of its scored turns,
    and ``verified_turns``: how many were scored.  On a designed team task (``info["designed"]``,
    ``envs/base.py``), ``designed_accuracy``: the share of the episodes it spoke in where it did
    its designed part right, and ``designed_episodes``: how many such episodes had a judgement.
    The per-agent signal ``designed_signal``: the gradient signal the agent actually got, as the
    Pearson correlation between its advantages and its own correctness over its trained turns
    of the step.  Its correctness is the designed ground truth on a designed team task
    (episodes carrying ``info["designed"]``, ``envs/base.py``: one value per agent and episode),
    else the verifier's score of each turn, wherever the agent has scored turns.  None, not
    NaN, where it is undefined: fewer than two such turns, or either side constant, e.g. an
    agent that was right every time or a group without reward variance everywhere.
    Per policy: the learner's loss, KL, clip fraction, entropy, gradient norm and learning rate.
    ``lengths`` keeps every episode's turns and completion tokens for the length distribution.
    ``generated``: completion tokens the engine generated this step, by phase (``rollout_tokens``,
    ``credit_tokens`` for the credit method's replays, coalitions, removal runs and critic
    replies) and ``total``: the compute ``mas study --budget tokens`` matches.
    ``faults`` counts what went wrong in the step's rollouts and extra evaluations, by kind
    (``mas.rollout.faults.FAULT_KINDS``: agent/backend/tool/critic errors, timeouts, bad rewards); the
    step went on regardless.
    """
    episodes = [ep for g in groups for ep in g.episodes]
    flat = flatten_turns(groups)
    adv = credit.advantages.to(torch.float64)  # [N]
    team_positive = float(adv.clamp(min=0).sum())
    trained = batch.trainable if credit.train_mask is None else batch.trainable & credit.train_mask  # [N]
    agents: dict[str, Any] = {}
    for k, name in enumerate(batch.agent_names):
        sel = batch.agent_ids == k  # [N]
        n = int(sel.sum())
        if n == 0:
            continue
        turns = [t for (_, t), s in zip(flat, sel.tolist()) if s]
        spoke = sorted(set(batch.episode_ids[sel].tolist()))
        tool_valid = [t.extra_rewards["tool_valid"] for t in turns if "tool_valid" in t.extra_rewards]
        tokens = sum(len(t.completion_ids) for t in turns)
        unparsed = torch.tensor([not t.valid and not t.tool_calls for t in turns], dtype=torch.bool)  # [n]
        agents[name] = {
            "reward": float(batch.episode_rewards[spoke].mean()),
            # None (not logged) when no turn got positive credit: a share of nothing is no signal
            "credit_share": float(adv[sel].clamp(min=0).sum()) / team_positive if team_positive > 0 else None,
            # the part of that share earned by its unparsed turns (output not in the agent's format)
            "unparsed_credit_share": float(adv[sel][unparsed].clamp(min=0).sum()) / team_positive if team_positive > 0 else None,
            "advantage": _stats(credit.advantages[sel]),
            "turns": n,
            "completion_tokens": tokens,
            "completion_tokens_mean": tokens / n,
            # a turn whose tool calls failed is invalid too, but counts under tool_valid, not here
            "parse_failures": sum(not t.valid and not t.tool_calls for t in turns),
            "invalid": float(batch.invalid[sel].float().mean()),
            "tool_calls": sum(len(t.tool_calls) for t in turns),
            **({"tool_valid": statistics.fmean(tool_valid)} if tool_valid else {}),
        }
        verified = [t.extra_rewards[VERIFIED] for t in turns if VERIFIED in t.extra_rewards]
        if verified:
            agents[name]["verified_accuracy"] = statistics.fmean(verified)
            agents[name]["verified_turns"] = len(verified)
        designed = [episodes[e].info[DESIGNED][name] for e in spoke if name in episodes[e].info.get(DESIGNED, {})]
        if designed:
            agents[name]["designed_accuracy"] = statistics.fmean(designed)
            agents[name]["designed_episodes"] = len(designed)
        if any(name in ep.info.get(DESIGNED, {}) for ep in episodes):  # designed truth, one value per agent and episode
            judged = [(a, ep.info[DESIGNED][name]) for (ep, _), a, s, kept in zip(flat, adv.tolist(), sel.tolist(), trained.tolist())
                      if s and kept and name in ep.info.get(DESIGNED, {})]
            agents[name]["designed_signal"] = pearson([a for a, _ in judged], [d for _, d in judged])
        elif verified:  # else the verifier's score of each turn
            judged = [(a, t.extra_rewards[VERIFIED]) for (_, t), a, s, kept in zip(flat, adv.tolist(), sel.tolist(), trained.tolist())
                      if s and kept and VERIFIED in t.extra_rewards]
            agents[name]["designed_signal"] = pearson([a for a, _ in judged], [d for _, d in judged])
    return {
        "kind": "step",  # a metrics.jsonl line: "step", "eval" or "warmup" (record_kind)
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
        "lengths": {  # per episode, for the trajectory-length distribution of the report
            "turns": [len(ep.turns) for ep in episodes],
            "tokens": [sum(len(t.completion_ids) for t in ep.turns) for ep in episodes],
        },
        "policies": updates,
        "credit_cost": cost or {},
        "credit": {k: float(v) for k, v in credit.breakdown.items() if v.dim() == 0},  # scalar diagnostics
        "tokens": sum(len(t.completion_ids) for _, t in flat),
        "generated": generated or {},
        "faults": dict(faults or {}),
        "time": timings,
        "memory": memory_metrics(updates),
    }


def memory_metrics(updates: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Resident memory of the run (MiB): this process's peak so far and now, and the peak of each
    process that updated a policy in another process (a Ray actor's, taken out of its update
    metrics so that those stay about learning)."""
    out: dict[str, Any] = {"peak_rss_mb": peak_rss_mb(), "rss_mb": rss_mb()}
    actors = {name: u.pop("peak_rss_mb") for name, u in updates.items() if "peak_rss_mb" in u}
    if actors:
        out["actor_peak_rss_mb"] = actors
    return out


def pearson(x: list[float], y: list[float]) -> float | None:
    """Pearson correlation of two equally long samples; None where it is undefined (fewer than
    two points, or either sample constant), never NaN."""
    if len(x) != len(y):
        raise ValueError(f"pearson: samples of different lengths ({len(x)} and {len(y)})")
    if len(x) < 2:
        return None
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = math.fsum((a - mx) ** 2 for a in x), math.fsum((b - my) ** 2 for b in y)
    if sxx <= 0.0 or syy <= 0.0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


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
        "replay_divergences": len(replay_divergences(results)),
    }


def replay_divergences(results: dict | None) -> list[str]:
    """Errors of the re-runs (replays, interventions) that diverged from their recorded episode."""
    return [ep.error for items in (results or {}).values() for ep in items
            if isinstance(ep, Episode) and ep.status == "error" and (ep.error or "").startswith("ReplayDivergence")]


def divergence_warning(results: dict | None) -> str | None:
    """One line for the run's warnings when re-runs diverged: how many, and the first error
    (it names the agent and the turn); None when none did."""
    errors = replay_divergences(results)
    if not errors:
        return None
    return (f"{len(errors)} re-run(s) of the team diverged from their recorded episode and were left out of the "
            f"credit; the first: {errors[0]}")


def _env_scores(episodes: list[Episode]) -> dict[str, float]:
    """Mean of each named score envs record on ``episode.info["scores"]`` (HotpotQA: em, f1).

    An episode without a score (it failed before scoring) counts as 0, as its reward does.
    """
    names = sorted({k for ep in episodes for k in ep.info.get("scores", {})})
    return {k: statistics.fmean(float(ep.info.get("scores", {}).get(k, 0.0)) for ep in episodes) for k in names}


def _tool_calls_per_agent(episodes: list[Episode], tool_agents: list[str] | tuple[str, ...]) -> dict[str, float]:
    """Mean tool calls per episode of each agent in ``tool_agents`` and of any other agent that made one."""
    names = set(tool_agents) | {t.agent for ep in episodes for t in ep.turns if t.tool_calls}
    return {a: statistics.fmean(sum(len(t.tool_calls) for t in ep.turns if t.agent == a) for ep in episodes)
            for a in sorted(names)}


def _parse_counts(episodes: list[Episode]) -> dict[str, dict[str, Any]]:
    """Turns and parse failures of each agent (as in step metrics: failed tool calls are not parse
    failures), and where a verifier scored its turns, ``verified_accuracy`` (their mean score) and
    ``verified_turns``."""
    out: dict[str, dict[str, Any]] = {}
    scores: dict[str, list[float]] = {}
    for t in (t for ep in episodes for t in ep.turns):
        row = out.setdefault(t.agent, {"turns": 0, "parse_failures": 0})
        row["turns"] += 1
        row["parse_failures"] += not t.valid and not t.tool_calls
        if VERIFIED in t.extra_rewards:
            scores.setdefault(t.agent, []).append(t.extra_rewards[VERIFIED])
    for agent, values in scores.items():
        out[agent].update(verified_accuracy=statistics.fmean(values), verified_turns=len(values))
    return dict(sorted(out.items()))


def eval_summary(m: dict[str, Any]) -> str:
    """One line for the terminal: the greedy accuracy (or a research team's F1 / EM), then the
    sampled avg@k and pass@k, the training tasks' accuracy, and tool calls
    (``mas.training.evaluation``).  A record of an older run that sampled its headline
    (``decoding: sampled``) says so."""
    if "f1" in m or "em" in m:
        text = " · ".join(f"{k.upper()} {m[k]:.3f}" for k in ("f1", "em") if k in m)
    else:
        text = f"accuracy {m['accuracy']:.3f}"
    text += f" ({m.get('decoding', 'greedy')})"
    s = m.get("sampled")
    if s:
        temps = sorted(set((s.get("temperature") or {}).values()))
        at = f" at T={'/'.join(f'{t:g}' for t in temps)}" if temps else ""
        text += f" · sampled{at}: avg@{s['k']} {s['avg']:.3f}, pass@{s['k']} {s['pass']:.3f}"
    train = m.get("train")
    if train:
        text += f" · training tasks {train['accuracy']:.3f} (greedy)"
    if m.get("tool_calls"):
        text += " · tool calls per episode: " + ", ".join(f"{a} {v:.2f}" for a, v in m["tool_calls"].items())
    return text


CEILING = 0.9  # a start at or above this held-out score leaves RL little to learn: the summary says so


def held_out_story(before: dict | None, warmup: dict | None, after: dict | None) -> dict[str, Any] | None:
    """The run's held-out result as the phases made it, greedy (the deployed team): before
    training, after the format warm-up (where there was one) and after RL, with RL's gain measured
    from where RL started (after the warm-up, which may lower the start on purpose: it teaches the
    protocol with a deliberate weakness for RL to fix) and the whole run's gain beside it.  None
    without an evaluation after training.  ``summary.json`` (``held_out``), the terminal's summary
    line, the report and ``mas study`` all read this."""
    if not after:
        return None
    start = warmup or before
    story: dict[str, Any] = {
        "decoding": after.get("decoding", "greedy"),
        "before": before["accuracy"] if before else None,
        "after_warmup": warmup["accuracy"] if warmup else None,
        "after": after["accuracy"],
        "rl_start": "warmup" if warmup else ("before" if before else None),
        "rl_gain": after["accuracy"] - start["accuracy"] if start else None,
        "total_gain": after["accuracy"] - before["accuracy"] if before else None,
    }
    if start and start["accuracy"] >= CEILING:
        story["ceiling"] = (f"the team started RL at {start['accuracy']:.3f} held-out, at or near the ceiling: RL has little "
                            "to learn on these tasks, so this run shows that training runs (a smoke test), not that RL helps")
    return story


def story_line(story: dict[str, Any], name: str = "accuracy") -> str:
    """``held_out_story`` as one line: "held-out team accuracy: before B -> after warm-up W -> after
    RL A (RL +x points from the warm-up; +y overall, greedy)", or "... before B -> after A (+x points,
    greedy)" without a warm-up."""
    return f"held-out team {name}: {story_text(story)}"


def story_text(story: dict[str, Any]) -> str:
    """``story_line`` without its "held-out team <metric>: " head (the report's facts name it)."""
    dec, after = story["decoding"], story["after"]
    if story["after_warmup"] is None:
        if story["before"] is None:
            return f"after {after:.3f} ({dec})"
        return f"before {story['before']:.3f} -> after {after:.3f} ({100 * story['total_gain']:+.1f} points, {dec})"
    head = f"before {story['before']:.3f} -> " if story["before"] is not None else ""
    overall = f"; {100 * story['total_gain']:+.1f} overall" if story["total_gain"] is not None else ""
    return (f"{head}after warm-up {story['after_warmup']:.3f} -> after RL {after:.3f} "
            f"(RL {100 * story['rl_gain']:+.1f} points from the warm-up{overall}, {dec})")


def eval_metrics(episodes: list[Episode], tool_agents: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Held-out results of a team: mean reward (``accuracy``; a math team's accuracy, a research
    team's F1 or EM as its env's reward says), the env's named scores (research: ``em``, ``f1``),
    failure counts, ``agents``: each agent's turns and parse failures (and its verified accuracy where
    a verifier scored its turns), and, where agents have tools,
    ``tool_calls``: mean calls per episode by agent (``tool_agents`` are always listed, with 0 if
    they made none)."""
    out: dict[str, Any] = {
        "accuracy": statistics.fmean(ep.reward for ep in episodes) if episodes else 0.0,
        "episodes": len(episodes),
        "errors": sum(ep.status == "error" for ep in episodes),
        "truncated": sum(ep.status == "truncated" for ep in episodes),
    }
    if episodes:
        out.update(_env_scores(episodes))
        out["agents"] = _parse_counts(episodes)
        calls = _tool_calls_per_agent(episodes, tool_agents)
        if calls:
            out["tool_calls"] = calls
    return out


def _json_value(x: Any) -> Any:
    """A breakdown entry as JSON: non-finite floats become None (JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, list):
        return [_json_value(v) for v in x]
    return x


def episode_details(credit: Credit, n_turns: int, n_episodes: int) -> tuple[list[dict], list[dict]]:
    """The method's breakdown split by owner: ([N] per-turn dicts, [E] per-episode dicts).

    A breakdown tensor (or ``notes`` list) of length N belongs to turns, one of length E to
    episodes (when N == E both readings index the same item); scalars are step diagnostics and
    stay in metrics.jsonl; an [E, K] tensor (a value per agent) goes to the episode as a list.
    """
    per_turn: list[dict] = [{} for _ in range(n_turns)]
    per_episode: list[dict] = [{} for _ in range(n_episodes)]
    items: list[tuple[str, list]] = [(k, v.tolist()) for k, v in credit.breakdown.items() if v.dim() >= 1]
    items += [(k, list(v)) for k, v in credit.notes.items()]
    for key, values in items:
        if len(values) == n_turns:
            for d, v in zip(per_turn, values):
                d[key] = _json_value(v)
        elif len(values) == n_episodes:
            for d, v in zip(per_episode, values):
                d[key] = _json_value(v)
    if credit.train_mask is not None:
        for d, kept in zip(per_turn, credit.train_mask.tolist()):
            d["trained"] = bool(kept)
    return per_turn, per_episode


def episode_record(step: int, ep: Episode, advantages: list[float], turn_details: list[dict] | None = None,
                   details: dict | None = None) -> dict[str, Any]:
    """One stored episode: transcript, each turn's credit and the method's breakdown."""
    d = ep.to_dict()
    info = d.pop("info", None) or {}
    if "scores" in info:  # the env's named scores (research: em, f1)
        d["scores"] = info["scores"]
    if FAILURE in info:  # what ended a failed episode (trainer.train_failed)
        d["failure"] = info[FAILURE]
    d["step"] = step
    d["details"] = details or {}
    for i, (t, a) in enumerate(zip(d["turns"], advantages)):
        t["credit"] = a
        t["details"] = turn_details[i] if turn_details else {}
        t["completion_tokens"] = len(t["completion_ids"])
        for k in ("prompt_ids", "completion_ids", "logprobs"):
            t[k] = len(t[k])  # lengths only: the text is what people read
    return d


def sample_episodes(step: int, groups: list[EpisodeGroup], credit: Credit, n: int) -> list[dict]:
    """``n`` episode records of this step, alternating the best and the worst outcome, so the
    browser shows both who earned a reward and who lost one.  Among equal outcomes the episode
    whose turns got the most credit (sum of |advantage|) comes first: an episode whose credit
    is all 0 (a group without reward variance) teaches a reader little.  Ties: batch order."""
    episodes = [ep for g in groups for ep in g.episodes]
    starts, pos = [], 0
    for ep in episodes:
        starts.append(pos)
        pos += len(ep.turns)
    per_turn, per_episode = episode_details(credit, pos, len(episodes))
    advs = credit.advantages.tolist()
    weight = [sum(abs(a) for a in advs[s : s + len(ep.turns)]) for s, ep in zip(starts, episodes)]
    best = sorted(range(len(episodes)), key=lambda i: (-episodes[i].reward, -weight[i], i))
    worst = sorted(range(len(episodes)), key=lambda i: (episodes[i].reward, -weight[i], i))
    chosen: list[int] = []
    for k in range(len(episodes)):
        for i in (best[k], worst[k]):
            if len(chosen) < n and i not in chosen:
                chosen.append(i)
    out = []
    for i in chosen:
        a, b = starts[i], starts[i] + len(episodes[i].turns)
        out.append(episode_record(step, episodes[i], advs[a:b], per_turn[a:b], per_episode[i]))
    return out


class RunLogger:
    def __init__(self, run_dir: Path, cfg: RunConfig, show_progress: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # a resume with overrides keeps the earlier segment's config as config.<N>.yaml
        write_keeping_earlier(self.run_dir / "config.yaml", dump_config(cfg))
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.episodes_path = self.run_dir / "episodes.jsonl"
        (self.run_dir / "warnings.jsonl").touch()  # present, if empty, in a run without warnings
        self.show_progress = show_progress
        self.bar: tqdm | None = None
        self.tb = _tensorboard_writer(self.run_dir / "tensorboard")
        self.wandb = _wandb_run(cfg, self.run_dir)

    # -- files -------------------------------------------------------------------------------

    def _append(self, path: Path, record: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (written after the last checkpoint of a crashed run),
        in the JSONL files (metrics, episodes, warnings) and in TensorBoard (``purge_step``), so a
        resumed run has no duplicates."""
        for path in (self.metrics_path, self.episodes_path, self.run_dir / "warnings.jsonl"):
            if path.exists():
                keep = [line for line in path.read_text().splitlines() if _step_of(line) <= step]
                path.write_text("".join(line + "\n" for line in keep))
        if self.tb is not None:
            self.tb.close()
            self.tb = _tensorboard_writer(self.run_dir / "tensorboard", purge_step=step + 1)

    def drop_evals(self, names: tuple[str, ...]) -> None:
        """Drop the evaluation records named ``names`` from metrics.jsonl: a run resumed from the
        warm-up's checkpoint runs the evaluations that followed it again."""
        if self.metrics_path.exists():
            keep = [line for line in self.metrics_path.read_text().splitlines() if _eval_of(line) not in names]
            self.metrics_path.write_text("".join(line + "\n" for line in keep))

    def write_run_info(self, info: dict) -> None:
        """What the run trained on (models, data, credit method, devices): the report's checklist."""
        write_keeping_earlier(self.run_dir / "run_info.json", json.dumps(info, indent=2))

    def step_records(self) -> list[dict]:
        """The step records metrics.jsonl holds now (a resumed run's earlier steps), in file order."""
        if not self.metrics_path.exists():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line half-written by a crash
                continue
            if isinstance(row, dict) and record_kind(row) == "step":
                rows.append(row)
        return rows

    def log_step(self, metrics: dict, groups: list[EpisodeGroup], credit: Credit, n_samples: int, store_episodes: bool = True,
                 note: dict[str, str] | None = None) -> None:
        """Append the step's record (and, with ``store_episodes``, sample episodes); ``note``: short
        extra entries for the progress line (e.g. agents that have not spoken, with their count)."""
        _check_finite(metrics)
        self._append(self.metrics_path, metrics)
        scalars = dict(_scalars(metrics))
        if self.tb is not None:
            for tag, value in scalars.items():
                self.tb.add_scalar(tag, value, metrics["step"])
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=metrics["step"])
        if store_episodes:
            for record in sample_episodes(metrics["step"], groups, credit, n_samples):
                self._append(self.episodes_path, record)
        if self.bar is not None:
            post = {"team": f"{metrics['reward']['team']:.2f}"}
            post.update({name: f"{a['reward']:.2f}" for name, a in metrics["agents"].items()})
            post.update(note or {})
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)

    def log_eval(self, name: str, metrics: dict) -> None:
        self._append(self.metrics_path, {"kind": "eval", "eval": name, **metrics})

    def log_warmup(self, record: dict) -> None:
        """The format warm-up's record (``mas.training.warmup``): per policy its losses, tokens and time."""
        self._append(self.metrics_path, {"kind": "warmup", "warmup": record})

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
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

    def info(self, msg: str) -> None:
        (self.bar.write if self.bar is not None else print)(msg)

    def warn(self, message: str, kind: str, step: int | None = None) -> None:
        """A warning the user must see: printed now and kept in ``warnings.jsonl``, which
        ``mas report`` shows at the top of the page.  ``kind`` names the check that raised it.
        Printed, a message of several lines (an error a team's framework raised: a pydantic
        ValidationError, DSPy's parse error with the reply in it) is its first line, saying where
        the rest is; ``warnings.jsonl`` keeps it whole."""
        first, _, rest = message.strip().partition("\n")
        self.info(f"warning: {first} [...; whole message in warnings.jsonl]" if rest.strip() else f"warning: {message}")
        self._append(self.run_dir / "warnings.jsonl", {"step": step, "kind": kind, "message": message})


RECORD_KINDS = ("step", "eval", "warmup")


def record_kind(row: dict) -> str | None:
    """What a metrics.jsonl line is: "step", "eval" or "warmup" (None: none of them).  Its
    ``kind`` where it has one; a line of a run written before ``kind`` existed by its keys (an
    evaluation has "eval", the warm-up "warmup", a step "step")."""
    kind = row.get("kind")
    if kind in RECORD_KINDS:
        return kind
    if "eval" in row:
        return "eval"
    if "warmup" in row:
        return "warmup"
    return "step" if "step" in row else None


class Silence:
    """Agents that said nothing in a step and trainable policies that got no samples in it.

    A step's metrics name them (``silent_agents``: agents without a turn in any of the step's
    episodes; ``idle_policies``: policies that updated this step yet had no turn to train on,
    so their weights did not change).  The first step each one is seen is a warning (printed
    and kept in warnings.jsonl); after that it is counted, not warned again: ``brief`` for the
    progress line, ``closing`` for the end of the run, and ``mas report`` counts the steps from
    metrics.jsonl.  ``agent_policy``: each agent's policy, to say why a policy got nothing."""

    def __init__(self, agent_policy: dict[str, str]):
        self.agent_policy = dict(agent_policy)
        self.agents: dict[str, list[int]] = {}  # name -> [first step, steps]
        self.policies: dict[str, list[int]] = {}
        self.steps = 0  # steps observed

    @classmethod
    def from_records(cls, agent_policy: dict[str, str], rows: list[dict]) -> "Silence":
        """The counts of the steps already logged (a resumed run's), without warning again."""
        silence = cls(agent_policy)
        for row in rows:
            silence.observe(row)
        return silence

    def observe(self, metrics: dict) -> list[tuple[str, str]]:
        """Count one step's silent agents and idle policies; (kind, message) warnings for the new ones."""
        self.steps += 1
        step, episodes = metrics["step"], metrics["episodes"]["count"]
        silent = list(metrics.get("silent_agents", []))  # a step record of an older run has neither list
        warnings = []
        for name in silent:
            if self._count(self.agents, name, step):
                warnings.append(("silent_agent", f"agent {name!r} did not speak in any of the {episodes} episodes of step "
                                 f"{step}: it gets no training signal (does the topology reach it? an orchestrator must "
                                 f"call it). Later steps without it are counted on the progress line and in the report, "
                                 f"not warned again"))
        for name in metrics.get("idle_policies", []):
            if self._count(self.policies, name, step):
                agents = [a for a, p in self.agent_policy.items() if p == name]
                why = (f"none of its agents ({', '.join(agents)}) spoke" if agents and set(agents) <= set(silent) else
                       f"its agents' turns ({', '.join(agents) or 'none'}) were all left out of the update (failed "
                       f"episodes, turns without tokens, the credit method's mask or trainer.drop_constant_groups)")
                warnings.append(("no_samples", f"policy {name!r} got no samples in step {step}, so its weights did not "
                                 f"change: {why}. Later steps without samples are counted on the progress line and in "
                                 f"the report, not warned again"))
        return warnings

    @staticmethod
    def _count(seen: dict[str, list[int]], name: str, step: Any) -> bool:
        """Count ``name`` at ``step``; True the first time it is seen."""
        if name in seen:
            seen[name][1] += 1
            return False
        seen[name] = [step, 1]
        return True

    def brief(self) -> dict[str, str]:
        """Progress-line entries: each silent agent and idle policy with its count of steps."""
        out = {}
        if self.agents:
            out["silent"] = ", ".join(f"{a}×{n}" for a, (_, n) in self.agents.items())
        if self.policies:
            out["no samples"] = ", ".join(f"{p}×{n}" for p, (_, n) in self.policies.items())
        return out

    def closing(self) -> list[str]:
        """One line per silent agent and idle policy, for the end of the run."""
        lines = [f"agent {a!r} has not spoken in {n} of {self.steps} steps (first in step {first})"
                 for a, (first, n) in self.agents.items()]
        lines += [f"policy {p!r} got no samples in {n} of {self.steps} steps (first in step {first})"
                  for p, (first, n) in self.policies.items()]
        return lines


def _step_of(line: str) -> int:
    """The step of a JSONL record; a line left half-written by a crash counts as after every step."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return 2**62
    if not isinstance(record, dict):
        return 2**62
    step = record.get("step")
    return step if isinstance(step, int) else -1  # evaluations and run-wide warnings have no step


def _eval_of(line: str) -> str | None:
    """The name of an evaluation record (``log_eval``); None for other lines."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record.get("eval") if isinstance(record, dict) and record.get("kind") == "eval" else None


def _tensorboard_writer(path: Path, purge_step: int | None = None):
    """torch's SummaryWriter, or None (with a note) if the tensorboard package is missing.
    ``purge_step``: events at or after this step, left by an earlier process, are discarded."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("tensorboard is not installed: writing metrics.jsonl only (pip install tensorboard)", file=sys.stderr)
        return None
    return SummaryWriter(log_dir=str(path), purge_step=purge_step)


def _wandb_run(cfg: RunConfig, run_dir: Path):
    """A Weights & Biases run when ``logging.wandb`` is set, else None; wandb is imported only then."""
    w = cfg.logging.wandb
    if w is None:
        return None
    try:
        import wandb
    except ImportError:
        raise MissingDependencyError("logging.wandb is set but the wandb package is not installed: pip install wandb "
                           "(or remove logging.wandb)") from None
    return wandb.init(project=w.project, entity=w.entity, name=w.name or cfg.team.name, mode=w.mode,
                      tags=list(w.tags), dir=str(run_dir), config=cfg.model_dump(mode="json"))


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
