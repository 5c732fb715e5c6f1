"""The numbers of a study, from its run directories: curves, the final table, the frontier.

Everything here is a pure function of what the runs wrote (``metrics.jsonl``), so a study can
be re-analysed at any time, and ``study.json`` and ``study.html`` always show the same numbers.

What is ranked (``spec.metric``): the held-out accuracy of the **greedy** team by default, the
policy a user deploys; ``sampled`` ranks by avg@k at the agents' own temperatures instead, and
is labelled so.  Every point also carries the other decodings (sampled avg@k, pass@k) and the
accuracy on a fixed set of training tasks (``trainer.eval_train``), so the table shows the
training-vs-held-out gap under the same decoding (``decoding_summary``).

The noise floor: the baseline's runs evaluate their starting policy twice with two seeds
(``trainer.eval_noise``); |difference| per metric, over seeds (``noise_floor``).  Methods are
compared by paired seeds (the same seed gives the same warm start, tasks and task stream):
per seed the difference of finals from the baseline's, its mean and bootstrap CI, and whether
it is inside the noise (``paired``).

Per run, every held-out evaluation is one point on three axes:

    steps    updates done (0 before training, s + 1 after step s); a run with a format
             warm-up (``trainer.warmup``) starts its RL from the evaluation after the
             warm-up, so that one is its point 0 (the one before the warm-up is left out)
    tokens   generated tokens so far: rollouts + the credit method's own generations
    seconds  training wall time so far: the sum of the step times (evaluations excluded)

Per method and axis, the curve is the mean and std over seeds.  On the steps axis the seeds
share their evaluation points; on the tokens and seconds axes each seed's curve is
interpolated linearly onto the union of the seeds' points, up to the smallest of their last
points, so every mean uses every seed.

The final table, per method (n seeds):
  * final: mean ± std (ddof 1) of the last evaluation, and a percentile bootstrap 95% CI of
    that mean (resampling seeds, 10,000 draws, seeded);
  * to baseline: the steps and generated tokens at which a seed's curve first reaches the
    baseline method's mean final value (mean over the seeds that reach it, and how many
    do), and those as a share of the baseline's own;
  * extra compute: credit tokens / rollout tokens (what the method generates beyond its
    rollouts), and the credit share of step time.
The frontier is one point per method: (extra compute, final − baseline final).

The scaling view (a study over team sizes, or the one size of a one-config study), per method
and team size N (``runner.team_size``):
  * steps to the baseline's final: per seed, the steps at which its held-out curve first
    reaches the baseline method's mean final value at that N; a seed that never does counts
    at the steps it ran (a lower bound, flagged); the mean over seeds and a bootstrap 95% CI;
  * the held-out gain: final minus the start of RL (the evaluation after the format warm-up
    where there is one, else before training), per seed; the mean and a
    bootstrap 95% CI (where the baseline does not improve, steps to its final say little:
    every method is there at step 0, and the gain tells the methods apart);
  * the credit method's cost: its extra generated tokens (% of the rollouts' and per step),
    its seconds per step, and its re-runs per episode (C3's replays, SHARP's coalitions,
    CCPO's removals), with SHARP's planned coalitions per episode (exact Shapley's 2^n - 1 up
    to ``max_exact_players``, Monte-Carlo permutations beyond);
  * the per-agent signal at step 0: each agent's ``designed_signal`` (the correlation of its
    advantages with its own designed correctness, mas/training/metrics.py) in the first step, where the
    env records a designed ground truth; per agent the mean over seeds, then the mean over
    agents.  Undefined values (an agent always right, a step without reward variance) are
    left out and counted.
And, from ``not_applicable.json``, the methods that were left out of the grid, with why.

Verified accuracy (where a turn verifier scored the agents' turns, ``envs/verifiers.py``): per
agent, the mean verifier score of its turns in the held-out evaluation before training and in
the last one, per method the mean over seeds; the team's is the mean over its agents.  It is
measured whatever the credit method: it says whether the agents got better at their own jobs.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from mas.config.loading import read_config_data, validate_config
from mas.credit.shapley import queried_coalitions
from mas.credit.sharp import SharpConfig
from mas.study.runner import DONE_FILE, NA_FILE, SCALING_SPEC_FILE, SPEC_FILE, read_jsonl, step_usage, team_size

AXES = ("steps", "tokens", "seconds")
# The method that sees what the others infer: with a turn verifier, the per-agent signal an
# outcome-only method has to work out (docs/credit.md, `verified`).  Where a study runs it beside
# the baseline, every other method is also measured by the share of its lead that it recovers.
CEILING = "verified"


def lead_share(final: float | None, baseline_final: float | None, ceiling_final: float | None) -> float | None:
    """(final - baseline's) / (ceiling's - baseline's): 1 matches the ceiling, 0 the baseline,
    below 0 is behind the baseline; None where the ceiling is not ahead of the baseline."""
    if None in (final, baseline_final, ceiling_final) or ceiling_final <= baseline_final:
        return None
    return (final - baseline_final) / (ceiling_final - baseline_final)
BOOTSTRAP_DRAWS = 10_000
SURVEY_MIN_SEEDS = 3


# --- one run ----------------------------------------------------------------------------------------


METRICS = ("greedy", "sampled")  # what a study ranks by: the deployed (greedy) team, or the sampled one (avg@k)


def eval_values(record: dict) -> dict[str, float | None]:
    """The held-out numbers of one evaluation record (``mas.training.evaluation``): ``greedy``
    accuracy, ``sampled`` avg@k and ``pass`` pass@k, and on the training tasks ``train`` (greedy)
    and ``train_sampled``.  A record of an older run whose headline was sampled (``decoding:
    sampled``) has only a sampled value."""
    legacy_sampled = record.get("decoding") == "sampled"
    sampled = record.get("sampled") or {}
    train = record.get("train") or {}
    return {
        "greedy": None if legacy_sampled else float(record["accuracy"]),
        "sampled": float(sampled["avg"]) if sampled else (float(record["accuracy"]) if legacy_sampled else None),
        "pass": float(sampled["pass"]) if sampled else None,
        "train": float(train["accuracy"]) if "accuracy" in train else None,
        "train_sampled": float(train["sampled"]["avg"]) if train.get("sampled") else None,
    }


def run_points(rows: list[dict], metric: str = "greedy") -> dict[str, Any]:
    """The evaluation points of one run's metrics.jsonl records, and what it spent.

    Returns {"points": [{"steps", "tokens", "seconds", "value", "verified", **eval_values}], "noise",
    "steps", "tokens", "rollout_tokens", "credit_tokens", "seconds", "credit_seconds"}.  ``value`` is
    the ``metric`` (``METRICS``); an evaluation without it is left out.  ``noise`` is the second
    evaluation of the start with another seed (``trainer.eval_noise``), its ``eval_values``, or None.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown study metric {metric!r}; valid: {list(METRICS)}")
    steps = sorted((r for r in rows if "eval" not in r and "step" in r), key=lambda r: r["step"])
    cum: dict[int, dict[str, float]] = {}
    total = {"steps": 0.0, "tokens": 0.0, "seconds": 0.0}
    rollout = credit = credit_s = 0.0
    for r in steps:
        for k, v in step_usage(r).items():
            total[k] += v
        gen = r.get("generated") or {}
        rollout += float(gen.get("rollout_tokens", 0))
        credit += float(gen.get("credit_tokens", 0))
        credit_s += float((r.get("time") or {}).get("credit", 0.0))
        cum[int(r["step"])] = dict(total)
    points = []
    start = "warmup" if any(r.get("eval") == "warmup" for r in rows) else "before"  # RL starts from the warm-up
    for r in rows:
        if r.get("eval") == start:
            at = {"steps": 0.0, "tokens": 0.0, "seconds": 0.0}
        elif r.get("eval") == "periodic" and int(r["step"]) in cum:
            at = cum[int(r["step"])]
        else:
            continue
        values = eval_values(r)
        if values[metric] is not None:
            points.append({**at, **values, "value": values[metric], "verified": verified_of(r)})
    points.sort(key=lambda p: p["steps"])
    noise = next((eval_values(r) for r in rows if r.get("eval") == "noise"), None)
    # with a warm-up, RL starts (point 0) after it; the team before the warm-up is kept beside, so that
    # the study reads before -> after warm-up -> after RL, with RL's gain from the warm-up
    before = next((eval_values(r) for r in rows if r.get("eval") == "before"), None) if start == "warmup" else None
    return {"points": points, "noise": noise, "before_warmup": before, **total, "rollout_tokens": rollout, "credit_tokens": credit,
            "credit_seconds": credit_s}


def verified_of(record: dict) -> dict[str, float]:
    """Each agent's verified accuracy in one evaluation record ({} where no verifier scored)."""
    agents = record.get("agents") or {}
    return {a: float(m["verified_accuracy"]) for a, m in agents.items() if isinstance(m, dict) and "verified_accuracy" in m}


def run_costs(rows: list[dict]) -> dict[str, Any]:
    """Per step of one run: the credit method's generated tokens and seconds, its re-runs and
    SHARP's coalition evaluations per episode; and each agent's ``designed_signal`` at step 0."""
    steps = [r for r in rows if "eval" not in r and "step" in r]

    def mean(value) -> float:  # over the run's steps
        return statistics.fmean(float(value(r)) for r in steps) if steps else 0.0

    def per_episode(r: dict, count: float) -> float:
        return count / max(int((r.get("episodes") or {}).get("count", 0)), 1)

    first = next((r for r in steps if r["step"] == 0), None)
    return {
        "credit_tokens_per_step": mean(lambda r: (r.get("generated") or {}).get("credit_tokens", 0)),
        "credit_seconds_per_step": mean(lambda r: (r.get("time") or {}).get("credit", 0.0)),
        "reruns_per_episode": mean(lambda r: per_episode(r, sum((r.get("credit_cost") or {}).get(k, 0)
                                                                for k in ("replays", "interventions")))),
        "coalitions_per_episode": mean(lambda r: per_episode(r, (r.get("credit") or {}).get("coalition_evals", 0.0))),
        "signal": {a: m["designed_signal"] for a, m in ((first or {}).get("agents") or {}).items() if "designed_signal" in m},
    }


def planned_coalitions(credit: dict, size: int) -> str | None:
    """SHARP's coalition re-runs per episode over its players, as a run's credit section
    configures them (credit/sharp.py), in words; None for another method or λ_s = 0."""
    if credit.get("method") != "sharp":
        return None
    cfg = SharpConfig.model_validate(credit)
    if cfg.lambda_s == 0:
        return None
    n = size - (1 if cfg.exclude is None else len(cfg.exclude))  # None: whoever speaks last is not a player
    count = len(queried_coalitions(n, cfg.marginal, permutations=cfg.mc_permutations, seed=cfg.seed,
                                   max_exact_players=cfg.max_exact_players)) - 1  # the grand coalition is the episode itself
    if cfg.marginal == "loo":
        how = "leave-one-out masking"
    elif cfg.marginal == "exact" and n <= cfg.max_exact_players:
        how = f"exact Shapley over {n} players (2^{n} - 1)"
    else:
        how = f"Monte-Carlo Shapley over {n} players, {cfg.mc_permutations} orderings"
    return f"{how}: {count} coalitions per episode"


def first_reach(points: list[dict], target: float) -> dict[str, float] | None:
    """The first evaluation point whose value reaches ``target`` (None if none does)."""
    for p in points:
        if p["value"] >= target - 1e-12:
            return p
    return None


# --- across seeds -----------------------------------------------------------------------------------


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def curve(runs: list[list[dict]], axis: str) -> dict[str, list[float]]:
    """Mean ± std over seeds of the value against ``axis`` (module docstring)."""
    runs = [p for p in runs if p]
    if not runs:
        return {"x": [], "mean": [], "std": [], "n": []}
    if axis == "steps":
        xs = sorted({p[axis] for pts in runs for p in pts})
        out: dict[str, list[float]] = {"x": [], "mean": [], "std": [], "n": []}
        for x in xs:
            vals = [p["value"] for pts in runs for p in pts if p[axis] == x]
            m, s = _mean_std(vals)
            out["x"].append(x), out["mean"].append(m), out["std"].append(s), out["n"].append(len(vals))
        return out
    limit = min(pts[-1][axis] for pts in runs)
    xs = sorted({p[axis] for pts in runs for p in pts if p[axis] <= limit})
    table = np.array([np.interp(xs, [p[axis] for p in pts], [p["value"] for p in pts]) for pts in runs])  # [seeds, X]
    std = table.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(len(xs))
    return {"x": [float(x) for x in xs], "mean": table.mean(axis=0).tolist(), "std": std.tolist(), "n": [len(runs)] * len(xs)}


def bootstrap_ci(values: list[float], draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% CI of the mean of ``values`` (resampling them with replacement)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    v = np.asarray(values, dtype=np.float64)
    means = v[rng.integers(0, len(v), size=(draws, len(v)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def _mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def method_row(method: str, runs: list[dict], target: float | None, baseline_row: dict | None) -> dict[str, Any]:
    """The final-table row of one method from its runs (``run_points`` dicts)."""
    finals = [r["points"][-1]["value"] for r in runs if r["points"]]
    mean, std = _mean_std(finals) if finals else (math.nan, math.nan)
    reach = [first_reach(r["points"], target) for r in runs] if target is not None else []
    hit = [p for p in reach if p is not None]
    row: dict[str, Any] = {
        "method": method,
        "seeds": len(runs),
        "final_mean": mean,
        "final_std": std,
        "ci95": list(bootstrap_ci(finals)),
        "finals": finals,
        "steps_to_baseline": _mean_or_none([p["steps"] for p in hit]),
        "tokens_to_baseline": _mean_or_none([p["tokens"] for p in hit]),
        "reached_baseline": len(hit),
        "steps": statistics.fmean(r["steps"] for r in runs) if runs else 0.0,
        "tokens": statistics.fmean(r["tokens"] for r in runs) if runs else 0.0,
        "seconds": statistics.fmean(r["seconds"] for r in runs) if runs else 0.0,
        "rollout_tokens": statistics.fmean(r["rollout_tokens"] for r in runs) if runs else 0.0,
        "credit_tokens": statistics.fmean(r["credit_tokens"] for r in runs) if runs else 0.0,
    }
    ratios = [r["credit_tokens"] / r["rollout_tokens"] for r in runs if r["rollout_tokens"] > 0]
    row["extra_compute"] = statistics.fmean(ratios) if ratios else 0.0
    row["verified"] = verified_summary(runs)
    row["decodings"] = decoding_summary(runs)
    shares = [r["credit_seconds"] / r["seconds"] for r in runs if r["seconds"] > 0]
    row["credit_time_share"] = statistics.fmean(shares) if shares else 0.0
    for key in ("steps_to_baseline", "tokens_to_baseline"):
        base = baseline_row.get(key) if baseline_row else None
        row[key.replace("_to_baseline", "_share_of_baseline")] = row[key] / base if row[key] is not None and base else None
    return row


def decoding_summary(runs: list[dict]) -> dict[str, Any]:
    """Every decoding at the start of RL (after the warm-up where there was one; the greedy team
    before the warm-up is ``before_warmup``) and at the last evaluation, mean over seeds: greedy, sampled
    (avg@k), pass@k, the training tasks (greedy), and the training-minus-held-out gap under greedy
    decoding (positive: the training tasks are easier for the team, e.g. memorised)."""
    out: dict[str, Any] = {}
    for when, index in (("start", 0), ("final", -1)):
        pts = [r["points"][index] for r in runs if r["points"] and (when == "final" or r["points"][0]["steps"] == 0)]
        row = {}
        for key in ("greedy", "sampled", "pass", "train", "train_sampled"):
            vals = [p[key] for p in pts if p.get(key) is not None]
            row[key] = statistics.fmean(vals) if vals else None
        gaps = [p["train"] - p["greedy"] for p in pts if p.get("train") is not None and p.get("greedy") is not None]
        row["gap"] = statistics.fmean(gaps) if gaps else None
        out[when] = row
    before = [r["before_warmup"]["greedy"] for r in runs if (r.get("before_warmup") or {}).get("greedy") is not None]
    if before:  # the start is after a warm-up: the team before it, greedy, mean over seeds
        out["before_warmup"] = {"greedy": statistics.fmean(before)}
    return out


def verified_summary(runs: list[dict]) -> dict[str, Any]:
    """Verified accuracy before training and at the last evaluation (module docstring): per agent,
    each the mean over seeds; {} where none was scored.  The team's figure is the mean over the
    agents scored at both times (``team_agents``), so that before and final compare the same
    agents: an agent that never spoke before training (no verified turn) would otherwise enter
    only the final mean.  Where no agent was scored at both, each time averages its own."""
    per_when: dict[str, dict[str, float]] = {}
    for when, index in (("before", 0), ("final", -1)):
        per_agent: dict[str, list[float]] = {}
        for r in runs:
            pts = r["points"]
            if not pts or (when == "before" and pts[0]["steps"] != 0):
                continue
            for a, v in (pts[index].get("verified") or {}).items():
                per_agent.setdefault(a, []).append(v)
        if per_agent:
            per_when[when] = {a: statistics.fmean(v) for a, v in per_agent.items()}
    both = sorted(set.intersection(*(set(a) for a in per_when.values()))) if len(per_when) == 2 else []
    out: dict[str, Any] = {}
    for when, agents in per_when.items():
        names = both or sorted(agents)
        out[when] = {"agents": agents, "team": statistics.fmean(agents[a] for a in names), "team_agents": names}
    return out


# --- the study -----------------------------------------------------------------------------------------


def steps_to_target(runs: list[dict], target: float | None) -> dict[str, Any]:
    """Steps to ``target`` over seeds (module docstring: a seed that never reaches it counts at
    the steps it ran): the mean, a bootstrap 95% CI, and how many seeds reached it."""
    if target is None or not runs:
        return {"mean": None, "ci95": [None, None], "reached": 0, "seeds": len(runs), "values": []}
    values, reached = [], 0
    for r in runs:
        p = first_reach(r["points"], target)
        values.append(p["steps"] if p is not None else r["steps"])
        reached += p is not None
    return {"mean": statistics.fmean(values), "ci95": list(bootstrap_ci(values)), "reached": reached, "seeds": len(runs),
            "values": values}


def signal_summary(seeds: list[dict[str, float | None]]) -> dict[str, Any]:
    """The per-agent signal at step 0 over seeds (module docstring); None where nothing is defined."""
    agents = sorted({a for s in seeds for a in s}, key=lambda a: (len(a), a))
    per_agent: dict[str, float | None] = {}
    undefined = 0
    for a in agents:
        vals = [s[a] for s in seeds if a in s and s[a] is not None]
        undefined += sum(1 for s in seeds if a in s and s[a] is None)
        per_agent[a] = statistics.fmean(vals) if vals else None
    defined = [v for v in per_agent.values() if v is not None]
    return {"agents": per_agent, "mean": statistics.fmean(defined) if defined else None,
            "min": min(defined) if defined else None, "max": max(defined) if defined else None,
            "undefined": undefined, "seeds": seeds}


def scaling_point(n: int | None, method: str, runs: list[dict], costs: list[dict], row: dict, target: float | None,
                  planned: str | None) -> dict[str, Any]:
    """One method at one team size: steps to the baseline's final, cost, signal (module docstring)."""
    cost = lambda k: statistics.fmean(c[k] for c in costs) if costs else 0.0  # noqa: E731
    gains = [r["points"][-1]["value"] - r["points"][0]["value"] for r in runs if r["points"] and r["points"][0]["steps"] == 0]
    return {
        "n": n, "method": method, "target": target, "steps_to_target": steps_to_target(runs, target),
        "final_mean": row["final_mean"], "extra_compute": row["extra_compute"],
        "gain": {"mean": statistics.fmean(gains) if gains else None, "ci95": list(bootstrap_ci(gains)) if gains else [None, None],
                 "values": gains},
        **{k: cost(k) for k in ("credit_tokens_per_step", "credit_seconds_per_step", "reruns_per_episode", "coalitions_per_episode")},
        "planned": planned, "signal": signal_summary([c["signal"] for c in costs]), "verified": row.get("verified", {}),
    }


def metric_label(config: dict, metric: str = "greedy") -> str:
    """The held-out metric's name: the env's reward (accuracy, or F1 / EM) and how it was decoded:
    ``greedy`` (the deployed team), or ``sampled avg@k`` at the agents' own temperatures."""
    reward = (config.get("env") or {}).get("reward")
    name = {"f1": "F1", "em": "EM"}.get(reward, "accuracy")
    if metric == "greedy":
        return f"{name} (greedy)"
    trainer = config.get("trainer") or {}
    k = trainer.get("eval_sampled_k", 4)
    temps = sorted({float((a.get("sampling") or {}).get("temperature", 1.0)) for a in config.get("agents") or []})
    at = f" at T={'/'.join(f'{t:g}' for t in temps)}" if temps else ""
    return f"{name} (sampled, avg@{k}{at})"


def noise_floor(runs: list[dict]) -> dict[str, Any]:
    """The evaluation's own noise (module docstring): per seed, the start evaluated twice with two
    seeds (``trainer.eval_noise``), |difference| in each metric; the mean and the largest over seeds."""
    out: dict[str, Any] = {}
    for key in ("greedy", "sampled", "pass"):
        diffs = [abs(r["noise"][key] - r["points"][0][key]) for r in runs
                 if r.get("noise") and r["points"] and r["points"][0]["steps"] == 0
                 and r["noise"].get(key) is not None and r["points"][0].get(key) is not None]
        if diffs:
            out[key] = {"mean": statistics.fmean(diffs), "max": max(diffs), "seeds": len(diffs)}
    return out


def paired(runs: dict[str, list[dict]], baseline: str, floor: float | None) -> dict[str, dict[str, Any]]:
    """Each method against the baseline on the same seeds (same seed: the same tasks, warm start and
    task stream): per seed the difference of final values, their mean, a bootstrap 95% CI, and
    whether the difference is inside the noise (the CI spans 0, or |mean| is within ``floor``)."""
    base = {r["seed"]: r["points"][-1]["value"] for r in runs.get(baseline, []) if r["points"]}
    out = {}
    for method, rs in runs.items():
        if method == baseline:
            continue
        diffs = [r["points"][-1]["value"] - base[r["seed"]] for r in rs if r["points"] and r["seed"] in base]
        if not diffs:
            continue
        mean = statistics.fmean(diffs)
        lo, hi = bootstrap_ci(diffs)
        inside = (lo <= 0.0 <= hi) or (floor is not None and abs(mean) <= floor)
        out[method] = {"seeds": len(diffs), "diffs": diffs, "mean": mean, "ci95": [lo, hi], "inside_noise": inside}
    return out


def analyse(out: str | Path) -> dict[str, Any]:
    """Every number of study.json / study.html from the study directory ``out``."""
    out = Path(out)
    spec = json.loads((out / SPEC_FILE).read_text())
    methods, seeds = spec["methods"], spec["seeds"]
    baseline = spec.get("baseline") or ("grpo" if "grpo" in methods else methods[0])
    metric = spec.get("metric") or "greedy"
    label = metric_label({}, metric)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    costs: dict[str, list[dict]] = {m: [] for m in methods}
    configs: dict[str, dict] = {}
    run_list = []
    for m in methods:
        for s in range(seeds):
            run_dir = out / "runs" / m / f"seed_{s}"
            rows = read_jsonl(run_dir / "metrics.jsonl")
            if not rows:
                continue
            config_path = run_dir / "config.yaml"
            config = read_config_data(config_path) if config_path.exists() else {}  # bounded; a damaged one is a ConfigError naming it
            configs.setdefault(m, config)
            label = metric_label(config, metric) if config else label
            pts = {**run_points(rows, metric), "seed": s}
            done = json.loads((run_dir / DONE_FILE).read_text()) if (run_dir / DONE_FILE).exists() else None
            runs[m].append(pts)
            costs[m].append(run_costs(rows))
            run_list.append({"method": m, "seed": s, "run_dir": str(run_dir.relative_to(out)), "finished": done is not None,
                             "budget": (done or {}).get("budget"), "final": pts["points"][-1]["value"] if pts["points"] else None,
                             **{k: pts[k] for k in ("steps", "tokens", "rollout_tokens", "credit_tokens", "seconds", "credit_seconds")},
                             "points": pts["points"]})
    base_runs = runs.get(baseline, [])
    base_finals = [r["points"][-1]["value"] for r in base_runs if r["points"]]
    target = statistics.fmean(base_finals) if base_finals else None
    base_row = method_row(baseline, base_runs, target, None) if base_runs else None
    table = [method_row(m, runs[m], target, base_row) for m in methods if runs[m]]
    curves = {axis: {m: curve([r["points"] for r in runs[m]], axis) for m in methods if runs[m]} for axis in AXES}
    ceiling = next((r["final_mean"] for r in table if r["method"] == CEILING), None) if baseline != CEILING else None
    for r in table:
        r["ceiling_lead_share"] = None if r["method"] in (CEILING, baseline) else lead_share(r["final_mean"], target, ceiling)
    floor = noise_floor(runs.get(baseline, []))
    floor_value = (floor.get("sampled" if metric == "sampled" else "greedy") or {}).get("max")
    pairs = paired(runs, baseline, floor_value)
    for r in table:
        r["paired"] = pairs.get(r["method"])
    frontier = [{"method": r["method"], "extra_compute": r["extra_compute"],
                 "gain": (r["final_mean"] - target) if target is not None else None} for r in table]
    n = _size_of(next(iter(configs.values()), {}))
    rows_by = {r["method"]: r for r in table}
    points = {m: [scaling_point(n, m, runs[m], costs[m], rows_by[m], target,
                                planned_coalitions(configs[m].get("credit") or {}, n) if n else None)]
              for m in methods if runs[m]}
    not_applicable = json.loads((out / NA_FILE).read_text()) if (out / NA_FILE).exists() else {}
    return {
        "spec": spec,
        "size": n,
        "scaling": {"sizes": [n] if n is not None and points else [], "points": points if n is not None else {},
                    "baseline": baseline, "not_applicable": {str(n): not_applicable} if not_applicable else {}},
        "not_applicable": not_applicable,
        "metric": label,
        "metric_kind": metric,
        "noise_floor": floor,
        "baseline": baseline,
        "baseline_final": target,
        "runs": run_list,
        "curves": curves,
        "table": table,
        "frontier": frontier,
        "checklist": checklist(spec, table, run_list, baseline),
    }


def _size_of(config: dict) -> int | None:
    """N of the team a run's resolved config describes (None without one)."""
    if not config:
        return None
    try:
        return team_size(validate_config(config))
    except ValueError:  # a config from another version: the scaling view says the size is unknown
        return None


def analyse_sizes(out: str | Path) -> dict[str, Any]:
    """A study over team sizes (``scaling_spec.json``): every size's own analysis, and the
    scaling view across them (module docstring)."""
    out = Path(out)
    spec = json.loads((out / SCALING_SPEC_FILE).read_text())
    sizes = []
    for size in spec["sizes"]:
        d = out / size["dir"]
        if (d / SPEC_FILE).exists():
            sizes.append({**size, "study": analyse(d)})
    return {"spec": spec, "sizes": sizes, "scaling": combine_scaling([s["study"]["scaling"] for s in sizes]),
            "metric": sizes[0]["study"]["metric"] if sizes else "accuracy"}


def combine_scaling(parts: list[dict]) -> dict[str, Any]:
    """The scaling views of several sizes as one: every method's points in order of N."""
    points: dict[str, list[dict]] = {}
    for part in parts:
        for m, pts in part["points"].items():
            points.setdefault(m, []).extend(pts)
    baselines = sorted({p["baseline"] for p in parts})
    return {"sizes": sorted({n for p in parts for n in p["sizes"]}),
            "points": {m: sorted(pts, key=lambda p: p["n"]) for m, pts in points.items()},
            "baseline": baselines[0] if len(baselines) == 1 else ", ".join(baselines),
            "not_applicable": {k: v for p in parts for k, v in p["not_applicable"].items()}}


def checklist(spec: dict, table: list[dict], runs: list[dict], baseline: str) -> list[dict[str, str]]:
    """The rows of the survey's reporting checklist this study fills."""
    kind, budget = spec["budget_kind"], spec.get("budget")
    if budget is None:  # steps from the config: what the runs were given
        budget = max((r["budget"]["limit"] for r in runs if r.get("budget")), default=0.0)
    rows = []
    has_base = any(r["method"] == baseline for r in table)
    short = [f"{r['method']}/seed_{r['seed']}" for r in runs if r.get("budget") and kind != "steps" and not r["budget"].get("reached")]
    if kind == "tokens":
        matched = f"compute-matched: every run stops once its generated tokens (rollouts and the credit method's own generations) reach {budget:g}"
    elif kind == "seconds":
        matched = f"wall-time matched: every run stops once its training time reaches {budget:g} s (measured on this machine)"
    else:
        extra = max((r["extra_compute"] for r in table), default=0.0)
        matched = (f"steps-matched ({budget:g} steps each), not compute-matched: credit methods generated up to "
                   f"{1 + extra:.2f}x the tokens of their rollouts; run --budget tokens for a compute-matched comparison")
    if short:
        matched += f"; hit trainer.steps before the budget: {', '.join(short)}"
    rows.append({"item": "Episode-level baseline on the same model and compute",
                 "value": (f"{baseline} on the same config; " if has_base else f"no {baseline} run; ") + matched})
    n = spec["seeds"]
    rows.append({"item": "Variance over seeds",
                 "value": f"{n} seeds per method (mean ± std and a bootstrap 95% CI); "
                 + ("meets the survey's minimum of 3" if n >= SURVEY_MIN_SEEDS else f"fewer than the survey's minimum of {SURVEY_MIN_SEEDS}")})
    overhead = "; ".join(f"{r['method']}: +{100 * r['extra_compute']:.0f}% generated tokens, {100 * r['credit_time_share']:.0f}% of step time"
                         for r in table)
    rows.append({"item": "Credit-specific overhead", "value": overhead or "no runs yet"})
    return rows


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def write_study_json(study: dict, path: Path) -> Path:
    path.write_text(json.dumps(_json_safe(study), indent=2, allow_nan=False))
    return path
