"""``mas audit RUN_DIR``: how faithful is a run's credit to each agent's true contribution?

The ground truth is each agent's exact Shapley value in each audited episode, measured by
re-running the episode with every coalition of agents (the game SHARP trains on, through the
same machinery: ``credit.sharp.plan_sharp`` plans one ``InterventionRequest`` per coalition,
``Engine.execute`` runs them, ``credit.sharp.coalition_marginals`` turns the results into φ):

    v(S)  = the reward of the episode re-run with every player outside S masked, the players
            in S keeping their recorded outputs, and the non-players (by default the agent that
            gives the final answer) re-sampled after the first masked message;
    φ_k   = exact Shapley value over the players (at most ``max_exact`` = 8 players: 2^n − 1
            re-runs per episode), else the Monte-Carlo permutation estimate with P orderings.

When the run trained with SHARP, its own ``exclude`` and ``mask_mode`` define the game, so the
audit measures exactly what its estimator (LOO, MC or exact) approximated.

The run's credit of agent k in an episode is the mean advantage of k's turns there: what the
learner was given.  Episodes come from ``episodes.jsonl`` (the stored samples nearest before the
checkpoint; their credit is the one computed at training time, from the group they were drawn
in) or, with ``fresh``, from new rollouts of the checkpoint's policies, credited by the run's
own method on full task groups.  Either way the Shapley re-runs use the checkpoint's policies.

Reported (``fidelity``): Spearman's ρ between credit and φ per agent (over the episodes where it
is a player) and pooled over all (episode, agent) pairs, each with a percentile bootstrap 95% CI
(resampling episodes), and the rank agreement: the share of episodes with two or more players
whose players the credit orders exactly as φ does (ties must match).  C3 (arXiv 2603.06859)
reports a fidelity of 0.270 for its method.  The cost (coalition re-runs and an upper bound on
the generations they need) is printed before anything runs; ``max_generations`` bounds it by
auditing fewer episodes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mas.types import Episode, EpisodeGroup, InterventionRequest, Turn
from mas.topologies import kind_of

BOOTSTRAP_DRAWS = 2000
C3_PUBLISHED_FIDELITY = 0.270


class AuditError(ValueError):
    """An audit that cannot run as asked (no checkpoint, no episodes, budget too small)."""


# --- statistics ---------------------------------------------------------------------------------------


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), dtype=np.float64)
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        r[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float | None:
    """Spearman's ρ (Pearson correlation of average ranks); None when either side is constant."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / math.sqrt((ra * ra).sum() * (rb * rb).sum()))


def bootstrap_spearman(a: list[float], b: list[float], groups: list[int], draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile 95% CI of ρ, resampling ``groups`` (episodes) with replacement; draws where ρ is
    undefined are left out.  (None, None) when fewer than 2 groups or no draw is defined."""
    a, b, g = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), np.asarray(groups)
    uniq = np.unique(g)
    if len(uniq) < 2:
        return None, None
    members = [np.nonzero(g == u)[0] for u in uniq]
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(draws):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(uniq), size=len(uniq))])
        rho = spearman(a[idx], b[idx])
        if rho is not None:
            vals.append(rho)
    if not vals:
        return None, None
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def same_order(credit: list[float], phi: list[float]) -> bool:
    """Whether ``credit`` orders the players exactly as ``phi`` does (pairwise, ties included)."""
    n = len(credit)
    return all(np.sign(credit[i] - credit[j]) == np.sign(phi[i] - phi[j]) for i in range(n) for j in range(i + 1, n))


@dataclass
class Fidelity:
    """The audit's numbers."""

    per_agent: dict[str, dict[str, Any]]  # agent -> {"n", "spearman", "ci95"}
    pooled: dict[str, Any]  # {"n", "spearman", "ci95"}
    rank_agreement: dict[str, Any]  # {"episodes", "agree", "share"}
    pairs: list[dict[str, Any]] = field(default_factory=list)  # {"episode", "agent", "credit", "shapley"}


def fidelity(pairs: list[dict[str, Any]], seed: int = 0) -> Fidelity:
    """Spearman per agent and pooled (bootstrap CIs over episodes) and rank agreement, from
    (episode, agent, credit, shapley) pairs."""
    per_agent = {}
    for agent in sorted({p["agent"] for p in pairs}):
        sel = [p for p in pairs if p["agent"] == agent]
        c, s, e = [p["credit"] for p in sel], [p["shapley"] for p in sel], [p["episode"] for p in sel]
        per_agent[agent] = {"n": len(sel), "spearman": spearman(c, s), "ci95": list(bootstrap_spearman(c, s, e, seed=seed))}
    c, s, e = [p["credit"] for p in pairs], [p["shapley"] for p in pairs], [p["episode"] for p in pairs]
    pooled = {"n": len(pairs), "spearman": spearman(c, s), "ci95": list(bootstrap_spearman(c, s, e, seed=seed))}
    by_episode: dict[int, list[dict]] = {}
    for p in pairs:
        by_episode.setdefault(p["episode"], []).append(p)
    multi = [ps for ps in by_episode.values() if len(ps) >= 2]
    agree = sum(same_order([p["credit"] for p in ps], [p["shapley"] for p in ps]) for ps in multi)
    ranking = {"episodes": len(multi), "agree": agree, "share": agree / len(multi) if multi else None}
    return Fidelity(per_agent, pooled, ranking, pairs)


# --- episodes -----------------------------------------------------------------------------------------


_TURN_FIELDS = set(Turn.__dataclass_fields__)


def episode_from_record(record: dict) -> tuple[Episode, list[float]]:
    """An Episode from an episodes.jsonl record, and its turns' stored credit.

    The record keeps token counts instead of ids (``prompt_ids`` etc. are lengths), so the
    rebuilt turns have empty id lists: a coalition re-run keeps a player's recorded *text*
    (what the other agents read), and the re-sampled agents generate afresh.
    """
    turns = []
    for t in record["turns"]:
        d = {k: v for k, v in t.items() if k in _TURN_FIELDS}
        d["prompt_ids"], d["completion_ids"], d["logprobs"] = [], [], []
        turns.append(Turn.from_dict(d))
    ep = Episode.from_dict({k: record[k] for k in ("task", "group_id", "sample_id", "seed", "answer", "reward", "status", "error")} | {"turns": []})
    ep.turns = turns
    return ep, [float(t.get("credit", 0.0)) for t in record["turns"]]


def stored_episodes(run_dir: Path, step: int, n: int) -> list[tuple[Episode, list[float]]]:
    """Up to ``n`` stored episodes of steps <= ``step``, the latest first, that have turns."""
    from mas.study.runner import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "episodes.jsonl") if r.get("step", -1) <= step and r.get("turns")]
    rows.sort(key=lambda r: -r["step"])
    return [episode_from_record(r) for r in rows[:n]]


def agent_credit(episode: Episode, credits: list[float]) -> dict[str, float]:
    """Mean credit of each agent's turns in the episode."""
    acc: dict[str, list[float]] = {}
    for t, c in zip(episode.turns, credits):
        acc.setdefault(t.agent, []).append(c)
    return {a: sum(v) / len(v) for a, v in acc.items()}


# --- the audit ----------------------------------------------------------------------------------------


def audit_game(credit_cfg: Any, exclude: tuple[str, ...] | None, permutations: int, max_exact: int):
    """The SHARP config that defines the coalition game (module docstring)."""
    from mas.credit.sharp import SharpConfig

    game = dict(marginal="exact", max_exact_players=max_exact, mc_permutations=permutations, lambda_s=1.0, lambda_p=0.0)
    if getattr(credit_cfg, "method", None) == "sharp":
        game.update(exclude=credit_cfg.exclude, mask_mode=credit_cfg.mask_mode)
    if exclude is not None:
        game["exclude"] = exclude
    return SharpConfig(**game)


def expected_generations(req: InterventionRequest) -> int:
    """About how many generations one coalition re-run needs: the turns after the first masked
    message by the agents that are re-sampled there (kept and masked turns need none)."""
    turns = req.source.turns
    first = next((i for i, t in enumerate(turns) if t.agent in req.agents), len(turns))
    return sum(1 for t in turns[first + 1 :] if t.agent in req.resample or not req.keep_others)


def turn_limit(cfg) -> int:
    """Most generations one episode of this team can take: the topology's turn limit, times the
    generations a tool-using agent may spend per invocation.  Bounds any coalition re-run."""
    turns = kind_of(cfg.topology).turn_limit(cfg.topology)
    per_call = max((a.max_tool_calls + 1 if a.tools else 1) for a in cfg.agents)
    return turns * per_call


@dataclass
class AuditPlan:
    episodes: list[tuple[Episode, list[float]]]
    requests: list[InterventionRequest]
    bound: int  # at most this many generations (every re-run within the topology's turn limit)
    expected: int  # about this many (the re-sampled agents' recorded turns)
    dropped: int  # episodes left out to stay within max_generations


def plan_audit(episodes: list[tuple[Episode, list[float]]], game, limit: int, max_generations: int | None) -> AuditPlan:
    """Coalition requests of the episodes, keeping whole episodes while the bound stays within
    ``max_generations`` (``limit``: generations one re-run can take at most)."""
    from mas.credit.sharp import plan_sharp

    kept: list[tuple[Episode, list[float]]] = []
    bound = 0
    for ep, credits in episodes:
        n = len(plan_sharp([EpisodeGroup(ep.task, [ep])], game))
        if max_generations is not None and bound + n * limit > max_generations:
            break
        kept.append((ep, credits))
        bound += n * limit
    requests = plan_sharp([EpisodeGroup(ep.task, [ep]) for ep, _ in kept], game)
    return AuditPlan(kept, requests, bound, sum(expected_generations(r) for r in requests), len(episodes) - len(kept))


def shapley_pairs(team, plan: AuditPlan, game, seed: int) -> list[dict[str, Any]]:
    """Run the coalition re-runs and pair each player's credit with its Shapley value."""
    from mas.credit import build_credit_batch
    from mas.credit.sharp import coalition_marginals

    groups = [EpisodeGroup(ep.task, [ep]) for ep, _ in plan.episodes]
    results = team.engine.execute(plan.requests, seed=seed) if plan.requests else {}
    batch = build_credit_batch(groups, list(team.agents))
    marg = coalition_marginals(batch, game, results)
    pairs = []
    for e, (ep, credits) in enumerate(plan.episodes):
        per_agent = agent_credit(ep, credits)
        for k, agent in enumerate(batch.agent_names):
            if bool(marg.is_player[e, k]):
                pairs.append({"episode": e, "agent": agent, "credit": per_agent[agent], "shapley": float(marg.phi[e, k])})
    return pairs


def fresh_episodes(team, n: int, seed: int) -> list[tuple[Episode, list[float]]]:
    """n new episodes from the loaded policies, credited by the run's own method on full task groups."""
    from mas.credit import build_credit_batch, plan_credit, run_credit
    from mas.credit.registry import followup_credit

    cfg = team.cfg
    g = cfg.trainer.group_size
    tasks = team.env.sample_tasks(max(1, math.ceil(n / g)))
    groups = team.engine.rollout(tasks, g, seed=seed)
    requests = plan_credit(groups, cfg.credit)
    results = team.engine.execute(requests, seed=seed + 1) if requests else None
    more = followup_credit(groups, cfg.credit, results)
    if more:
        results.update(team.engine.execute(more, seed=seed + 2))
    credit = run_credit(build_credit_batch(groups, list(team.agents)), cfg.credit, results)
    advs = credit.advantages.tolist()  # [N], in flatten order: group, episode, turn
    out, pos = [], 0
    for ep in (ep for grp in groups for ep in grp.episodes):
        out.append((ep, advs[pos : pos + len(ep.turns)]))
        pos += len(ep.turns)
    return [(ep, c) for ep, c in out if ep.turns and ep.status != "error"][:n]


def checkpoint_dir(run_dir: Path, step: int | None) -> Path:
    from mas.training.checkpoint import latest_checkpoint

    if step is None:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise AuditError(f"{run_dir}: no complete checkpoint (checkpoints/latest is missing); audit a run that saved one")
        return ckpt
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    if not ckpt.is_dir():
        have = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*") if p.is_dir() and not p.name.endswith((".tmp", ".old")))
        raise AuditError(f"{run_dir}: no checkpoint for step {step}; available: {have}")
    return ckpt


def load_team(run_dir: Path, ckpt: Path):
    """The run's team with the checkpoint's weights in its trainable policies."""
    from mas.config.schema import load_config
    from mas.training.team import build_team

    cfg = load_config(run_dir / "config.yaml")
    team = build_team(cfg)
    team.runtime.load_policies(ckpt, list(team.learners), learner_state=False)  # wherever the runtime holds them
    return team


def run_audit(run_dir: str | Path, step: int | None = None, episodes: int = 32, max_generations: int | None = None,
              fresh: bool = False, exclude: tuple[str, ...] | None = None, permutations: int = 64, max_exact: int = 8,
              seed: int = 0, log=print) -> dict[str, Any]:
    """The whole audit (module docstring); returns what it writes to RUN_DIR/audit/step_N.json."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise AuditError(f"{run_dir}: no config.yaml there; give a run directory written by `mas train`")
    ckpt = checkpoint_dir(run_dir, step)
    ckpt_step = int(json.loads((ckpt / "trainer_state.json").read_text())["step"])
    team = load_team(run_dir, ckpt)
    game = audit_game(team.cfg.credit, exclude, permutations, max_exact)
    source = "fresh" if fresh else "stored"
    eps = fresh_episodes(team, episodes, seed) if fresh else stored_episodes(run_dir, ckpt_step, episodes)
    if not eps:
        raise AuditError(f"{run_dir}: no stored episodes with turns up to step {ckpt_step} in episodes.jsonl; use --fresh")
    limit = turn_limit(team.cfg)
    plan = plan_audit(eps, game, limit, max_generations)
    players = max((len({t.agent for t in ep.turns}) for ep, _ in plan.episodes), default=0)
    estimator = "exact Shapley" if players <= max_exact else f"Monte-Carlo Shapley, P = {permutations} orderings"
    log(f"audit: {run_dir} at step {ckpt_step} ({ckpt.name}), credit {team.cfg.credit.method}, {len(plan.episodes)} {source} episodes; "
        f"ground truth: {estimator} (players per episode <= {players})")
    log(f"audit cost: {len(plan.requests)} coalition re-runs, about {plan.expected} generations, at most {plan.bound} "
        f"({limit} per re-run: the topology's turn limit)" + (f"; --max-generations {max_generations}" if max_generations is not None else ""))
    if plan.dropped:
        log(f"audit: {plan.dropped} of {len(eps)} episodes left out to stay within --max-generations {max_generations}")
    if not plan.episodes:
        raise AuditError(f"--max-generations {max_generations} is smaller than one episode's coalition re-runs; raise it")
    gen0 = team.engine.stats["requests"]
    pairs = shapley_pairs(team, plan, game, seed + 3)
    fid = fidelity(pairs, seed)
    spent = team.engine.stats["requests"] - gen0
    report = {
        "run_dir": str(run_dir),
        "checkpoint_step": ckpt_step,
        "credit_method": team.cfg.credit.method,
        "source": source,
        "episodes": len(plan.episodes),
        "game": {"exclude": list(game.exclude) if game.exclude is not None else None, "mask_mode": game.mask_mode,
                 "estimator": estimator, "max_exact_players": max_exact, "permutations": permutations},
        "cost": {"coalition_reruns": len(plan.requests), "generations_expected": plan.expected, "generations_bound": plan.bound,
                 "generations": spent, "max_generations": max_generations},
        "per_agent": fid.per_agent,
        "pooled": fid.pooled,
        "rank_agreement": fid.rank_agreement,
        "c3_published_fidelity": C3_PUBLISHED_FIDELITY,
        "pairs": fid.pairs,
    }
    out = run_dir / "audit"
    out.mkdir(exist_ok=True)
    (out / f"step_{ckpt_step:06d}.json").write_text(json.dumps(report, indent=2))
    return report


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.3f}"


def summary_lines(report: dict) -> list[str]:
    """The audit for the terminal."""
    lines = [f"credit fidelity of {report['credit_method']} (Spearman ρ between its credit and exact Shapley values; "
             f"C3 reports {C3_PUBLISHED_FIDELITY:.3f} for its method):"]
    for agent, row in report["per_agent"].items():
        lo, hi = row["ci95"]
        lines.append(f"  {agent:<16} ρ = {_fmt(row['spearman'])}  95% CI [{_fmt(lo)}, {_fmt(hi)}]  over {row['n']} episodes")
    p = report["pooled"]
    lines.append(f"  {'pooled':<16} ρ = {_fmt(p['spearman'])}  95% CI [{_fmt(p['ci95'][0])}, {_fmt(p['ci95'][1])}]  over {p['n']} (episode, agent) pairs")
    r = report["rank_agreement"]
    share = "n/a" if r["share"] is None else f"{100 * r['share']:.0f}%"
    lines.append(f"  ranks the agents as the audit does in {r['agree']} of {r['episodes']} episodes with two or more players ({share})")
    if any(row["spearman"] is None for row in report["per_agent"].values()) or p["spearman"] is None:
        lines.append("  n/a: the credit or the Shapley values are constant there, so no correlation is defined")
    return lines
