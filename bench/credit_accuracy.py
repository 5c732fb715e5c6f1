"""Credit accuracy against known ground truth.

Five team designs whose true per-agent contribution is known exactly.  Agents are scripted
(mas.rollout.backends.scripted), so every episode, replay, intervention and critique runs through
the real engine and topology, and the exact Shapley value of each episode's game can be
computed from the script.  Team: chain worker1 -> worker2 -> aggregator; the aggregator
reads the workers' visible messages ("[masked]" when a coalition leaves one out) and answers.

| design      | what it is                                                     | phi(worker1), phi(worker2) per episode |
|-------------|----------------------------------------------------------------|-----------------------------------------|
| free-rider  | worker2's message is ignored by the final answer               | c1, 0                                   |
| saboteur    | worker2 corrupts the answer with probability p                 | c1(1 - s/2), -c1 s/2                    |
| pivotal     | worker2's answer, when visible, decides the outcome            | c1/2, c2 - c1/2                         |
| redundant   | both workers give the same answer; either one suffices         | c/2, c/2                                |
| and-game    | each worker gives half of the answer; both are needed          | c1 c2/2, c1 c2/2                        |

(c1, c2: whether the worker's own message is right in that episode; s: worker2 sabotaged.)
The aggregator is the synthesiser, never a player: SHARP re-runs it on every coalition.

A sixth design is the relay task itself (``envs/team/relay.py``) at several team sizes N: a
parts chain of N scripted specialists, each right on its own part with probability 0.7, the
team right only if all are.  Its ground truth is designed, not Shapley: in an AND game every
player's Shapley value is R/N whoever was right, so the table scores each method's per-agent
credit against the env's ``info["designed"]`` (did the agent get its own part right), as
rank correlation (Spearman, pooled over episodes and agents) and as the per-agent signal of
the step metrics (``designed_signal``: Pearson of the advantage with it, mean over agents).

For every method the table reports the Spearman correlation between the method's per-agent
credit (per episode, workers only) and the exact Shapley value, the free-rider detection
rate (groups in which the free-rider gets strictly less credit than the contributor), the
extra generations, coalition evaluations and critic calls per group, and wall time.

    python bench/credit_accuracy.py [--groups 16] [--group-size 4] [--relay-sizes 2,4,8] [--relay-groups 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from mas.agents.agent import build_agents
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import validate_config
from mas.credit import build_credit_batch, credit_names, run_credit
from mas.credit.registry import plan_credit
from mas.rollout.engine import Engine
from mas.rollout.script import MASK_TEXT
from mas.training.metrics import credit_cost
from mas.models.tiny import train_tokenizer
from mas.topologies import build_topology
from mas.types import Episode, Task

WORKERS = ("worker1", "worker2")
AGENTS = WORKERS + ("aggregator",)


# ------------------------------------------------------------------------------------------------
# designs: what each scripted agent says, and how the aggregator reads the visible messages
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Design:
    name: str
    worker: Callable[[str, Task, random.Random], str]  # (agent, task, rng) -> message
    aggregate: Callable[[dict[str, str], Task], str]  # visible worker messages -> the team's answer


def right(task: Task) -> str:
    return task.answer


def wrong(task: Task) -> str:
    return str(int(task.answer) + 1)


def answer_of(msg: str | None) -> str | None:
    return msg.split("ANSWER:")[1].strip() if msg and "ANSWER:" in msg else None


def guess(task: Task, rng: random.Random, p: float = 0.5) -> str:
    return f"ANSWER: {right(task) if rng.random() < p else wrong(task)}"


def free_rider() -> Design:
    def worker(agent, task, rng):
        return guess(task, rng) if agent == "worker1" else "Looks fine to me."  # worker2 adds nothing used

    return Design("free-rider", worker, lambda vis, task: answer_of(vis.get("worker1")) or "0")


def saboteur(p: float = 0.5) -> Design:
    def worker(agent, task, rng):
        if agent == "worker1":
            return guess(task, rng, 0.8)
        return "CORRUPT" if rng.random() < p else "OK"

    def aggregate(vis, task):
        return wrong(task) if vis.get("worker2") == "CORRUPT" else (answer_of(vis.get("worker1")) or "0")

    return Design("saboteur", worker, aggregate)


def pivotal() -> Design:
    def aggregate(vis, task):  # worker2's choice, when visible, decides
        return answer_of(vis.get("worker2")) or answer_of(vis.get("worker1")) or "0"

    return Design("pivotal", lambda agent, task, rng: guess(task, rng), aggregate)


def redundant() -> Design:
    def worker(agent, task, rng):  # both carry the same (right) answer: substitutes
        return f"ANSWER: {right(task)}" if rng.random() < 0.8 else "I am not sure."

    def aggregate(vis, task):
        return answer_of(vis.get("worker1")) or answer_of(vis.get("worker2")) or "0"

    return Design("redundant", worker, aggregate)


def and_game() -> Design:
    def worker(agent, task, rng):  # each holds one half of the answer
        half = task.answer[: len(task.answer) // 2] if agent == "worker1" else task.answer[len(task.answer) // 2 :]
        return f"PART: {half}" if rng.random() < 0.8 else "PART: ?"

    def aggregate(vis, task):
        parts = [vis.get(w, "").removeprefix("PART: ") for w in WORKERS]
        return "".join(parts) if all(p and p != "?" for p in parts) else "0"

    return Design("and-game", worker, aggregate)


DESIGNS = [free_rider(), saboteur(), pivotal(), redundant(), and_game()]


def coalition_value(design: Design, episode: Episode, coalition: frozenset) -> float:
    """Exact v(S): the aggregator's answer from the realised messages of the players in S."""
    msgs = {t.agent: t.text for t in episode.turns if t.agent in WORKERS}
    return float(design.aggregate({k: m for k, m in msgs.items() if k in coalition}, episode.task) == episode.task.answer)


def exact_shapley(v: Callable[[frozenset], float], players: tuple[str, ...]) -> dict[str, float]:
    n = len(players)
    phi = dict.fromkeys(players, 0.0)
    for k in players:
        others = [p for p in players if p != k]
        for r in range(n):
            for S in itertools.combinations(others, r):
                w = math.factorial(r) * math.factorial(n - r - 1) / math.factorial(n)
                phi[k] += w * (v(frozenset(S) | {k}) - v(frozenset(S)))
    return phi


# ------------------------------------------------------------------------------------------------
# the team, run through the real engine with scripted agents
# ------------------------------------------------------------------------------------------------


TEAM = {
    "team": {"name": "credit-bench"},
    "policies": {"workers": {"model": "scripted"}, "synth": {"model": "scripted"}, "judge": {"kind": "frozen", "model": "scripted"}},
    "agents": [
        {"name": "worker1", "policy": "workers", "role": "You are worker1.", "parser": "raw"},
        {"name": "worker2", "policy": "workers", "role": "You are worker2.", "parser": "raw"},
        {"name": "aggregator", "policy": "synth", "role": "You give the team's answer.", "parser": "answer"},
    ],
    "topology": {"kind": "chain", "sequence": list(AGENTS)},
    "env": {"name": "synthetic_math", "num_ops": 1},
    "credit": {"method": "grpo"},
}


def visible_workers(req) -> dict[str, str]:
    """Worker messages the aggregator can read in its prompt ('worker: text' lines, masked ones dropped)."""
    out = {}
    for line in req.messages[-1]["content"].splitlines():
        name, _, text = line.partition(": ")
        if name in WORKERS and text != MASK_TEXT:
            out[name] = text
    return out


def scripted_team(design: Design, tokenizer, seed: int) -> tuple[Engine, ScriptedBackend, dict[str, Task]]:
    cfg = validate_config(TEAM)
    tasks: dict[str, Task] = {}
    rng = random.Random(seed)  # consumed in the engine's fixed batch order: runs are reproducible

    def respond(req):
        if req.agent.startswith("critic:"):
            return scripted_critic(req)
        task = tasks[req.messages[-1]["content"].splitlines()[0].removeprefix("Task: ")]
        if req.agent in WORKERS:
            return design.worker(req.agent, task, rng)
        return f"ANSWER: {design.aggregate(visible_workers(req), task)}"

    backend = ScriptedBackend(respond, {p: tokenizer for p in cfg.policies})
    engine = Engine(build_topology(cfg.topology), build_agents(cfg.agents, cfg.team.name),
                    {p: tokenizer for p in cfg.policies}, {p: p != "judge" for p in cfg.policies}, backend,
                    score=lambda ep: float(ep.answer == ep.task.answer))
    return engine, backend, tasks


# Prompts the scripted critic below can read (credit.prompt overrides the default templates).
MAPPA_BENCH_PROMPT = "ROLE={agent_role}\nOUTPUT={agent_output}\nGive PROCESS_SCORE: 0-10."
MCA_BENCH_PROMPT = "R={outcome}\nKEYS={json_example}\n{transcript}"


def substance(text: str) -> float:
    """How much a message gives the team, as a careful judge would read it (no ground truth)."""
    if text.startswith("CORRUPT"):
        return 0.0
    if ("ANSWER:" in text) or (text.startswith("PART:") and "?" not in text):
        return 1.0
    return 0.2


def scripted_critic(req) -> str:
    """A stand-in for an LLM critic (none runs offline): it judges each message by its substance.

    MAPPA mode: one PROCESS_SCORE per action.  LLM-MCA mode: splits R over the workers'
    messages in proportion to their substance, as JSON.  This measures the credit methods'
    plumbing and maths with a sensible judge; it says nothing about a real LLM's judgement.
    """
    text = req.messages[-1]["content"]
    if text.startswith("ROLE="):
        role = text.split("\n")[0].removeprefix("ROLE=")
        output = text.split("OUTPUT=", 1)[1].rsplit("\nGive", 1)[0]
        return f"PROCESS_SCORE: {10 * substance(output) if role in WORKERS else 5:.0f}"
    r = float(text.split("\n")[0].removeprefix("R="))
    keys = json.loads(text.split("KEYS=", 1)[1].split("\n")[0])
    said: dict[str, list[str]] = {}
    lines = text.split("\n")
    for i, line in enumerate(lines):
        for agent in keys:
            if line.startswith("[") and f"] {agent} (" in line and i + 1 < len(lines):
                said.setdefault(agent, []).append(lines[i + 1].strip())
    weights = {a: [substance(m) if a in WORKERS else 0.0 for m in said.get(a, [])] for a in keys}
    total = sum(sum(w) for w in weights.values()) or 1.0
    return json.dumps({a: [r * w / total for w in ws] for a, ws in weights.items()})


# ------------------------------------------------------------------------------------------------
# measuring
# ------------------------------------------------------------------------------------------------


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    def ranks(a):
        order = a.argsort(kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a))
        for v in np.unique(a):  # average ranks for ties
            r[a == v] = r[a == v].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


# (label, credit config, which per-turn quantity is the method's credit to an agent)
METHODS: list[tuple[str, dict, str]] = [
    ("exact Shapley (SHARP coalitions)", {"method": "sharp", "marginal": "exact", "exclude": ["aggregator"]}, "marginal"),
    ("SHARP exact", {"method": "sharp", "marginal": "exact", "exclude": ["aggregator"]}, "agent_reward"),
    ("SHARP Monte-Carlo (P=64)", {"method": "sharp", "marginal": "mc", "exclude": ["aggregator"]}, "agent_reward"),
    ("SHARP leave-one-out", {"method": "sharp", "marginal": "loo", "exclude": ["aggregator"]}, "agent_reward"),
    ("C3 (reward_only)", {"method": "c3"}, "advantage"),
    ("CCPO v2", {"method": "ccpo"}, "advantage"),
    ("M-GRPO", {"method": "m_grpo", "main_agent": "aggregator"}, "advantage"),
    ("critic: MAPPA (scripted critic)", {"method": "critic", "critic": "judge", "prompt": MAPPA_BENCH_PROMPT}, "critic_score"),
    ("critic: LLM-MCA (scripted critic)", {"method": "critic", "critic": "judge", "mode": "llm_mca",
                                           "prompt": MCA_BENCH_PROMPT}, "critic_score"),
    ("Dr. MAS", {"method": "dr_mas"}, "advantage"),
    ("GRPO", {"method": "grpo"}, "advantage"),
    ("RLOO", {"method": "rloo"}, "advantage"),
    ("REINFORCE++", {"method": "reinforce_pp"}, "advantage"),
    ("MAGRPO (mean)", {"method": "magrpo"}, "advantage"),
]


def credit_view(view: str, credit, cfg) -> torch.Tensor:
    """The per-turn credit a method gives an agent: its advantage, or the raw signal before normalisation."""
    b = credit.breakdown
    if view == "advantage":
        return credit.advantages
    if view == "agent_reward":  # SHARP: broadcast outcome + lambda_s * marginal (+ tool term), before normalisation
        out = b["broadcast"] + cfg.lambda_s * b["marginal"]
        return out + cfg.lambda_p * b["tool"] if "tool" in b else out
    return b[view]


def per_episode_worker_credit(batch, values: torch.Tensor) -> dict[tuple[int, str], float]:
    out: dict[tuple[int, str], list[float]] = {}
    for e, a, v in zip(batch.episode_ids.tolist(), batch.agent_ids.tolist(), values.tolist()):
        name = batch.agent_names[a]
        if name in WORKERS:
            out.setdefault((e, name), []).append(v)
    return {k: sum(v) / len(v) for k, v in out.items()}


def run_method(design: Design, groups, engine, cfg_dict: dict, view: str, seed: int) -> dict:
    cfg = validate_config({**TEAM, "credit": cfg_dict}).credit
    episodes = [ep for g in groups for ep in g.episodes]
    batch = build_credit_batch(groups, list(AGENTS))
    t0 = time.perf_counter()
    requests = plan_credit(groups, cfg)
    results = engine.execute(requests, seed=seed) if requests else None
    credit = run_credit(batch, cfg, results)
    wall = time.perf_counter() - t0
    credit_of = per_episode_worker_credit(batch, credit_view(view, credit, cfg))
    xs, ys = [], []
    phis: dict[tuple[int, str], float] = {}
    for e, ep in enumerate(episodes):
        phi = exact_shapley(lambda S, ep=ep: coalition_value(design, ep, S), WORKERS)
        phis.update({(e, w): phi[w] for w in WORKERS})
        for w in WORKERS:
            if (e, w) in credit_of:
                xs.append(credit_of[(e, w)])
                ys.append(phi[w])
    detected, contributed = 0, 0
    G = len(groups[0].episodes)
    for b in range(len(groups)):
        # only groups where worker1 did contribute (phi > 0 in some episode) have a free rider to find
        if not any(phis[(b * G + i, "worker1")] > 0 for i in range(G)):
            continue
        contributed += 1
        mean_abs = {w: np.mean([abs(credit_of.get((b * G + i, w), 0.0)) for i in range(G)]) for w in WORKERS}
        detected += mean_abs["worker2"] < mean_abs["worker1"]
    cost = credit_cost(requests, results)
    per_group = {k: v / len(groups) for k, v in cost.items()}
    # does the method ever tell the agents of one episode apart?
    separates = any(abs(credit_of.get((e, "worker1"), 0.0) - credit_of.get((e, "worker2"), 0.0)) > 1e-9
                    for e in range(len(episodes)))
    return {"rho": spearman(np.array(xs), np.array(ys)), "detect": detected / max(contributed, 1),
            "cost": per_group, "wall": wall, "separates": separates}


# ------------------------------------------------------------------------------------------------
# the relay design: N specialists, one part each, right only if all are (designed ground truth)
# ------------------------------------------------------------------------------------------------


P_RIGHT = 0.7  # each scripted specialist's chance to get its own part right


def relay_team(n: int) -> dict:
    specialists = [f"s{k}" for k in range(1, n + 1)]
    return {
        "team": {"name": "relay-bench"},
        "policies": {"workers": {"model": "scripted"}},
        "agents": [{"name": a, "policy": "workers", "role": "You solve your part.", "parser": "answer"} for a in specialists],
        "topology": {"kind": "chain", "sequence": specialists, "parts": True},
        "env": {"name": "team_relay", "size": n},
        "credit": {"method": "grpo"},
    }


def relay_methods(n: int, group_size: int) -> list[tuple[str, dict, str]]:
    """The methods that run on a team of specialists, with the study's defaults for one (mas/study/runner.py):
    every specialist a SHARP player, a C3 tree over every specialist with one alternative each."""
    return [
        ("SHARP exact" if n <= 8 else "SHARP (Monte-Carlo beyond 8)", {"method": "sharp", "exclude": []}, "agent_reward"),
        ("SHARP leave-one-out", {"method": "sharp", "marginal": "loo", "exclude": []}, "agent_reward"),
        ("C3 (reward_only)", {"method": "c3", "fanout": [group_size] + [2] * (n - 1)}, "advantage"),
        ("Dr. MAS", {"method": "dr_mas"}, "advantage"),
        ("GRPO", {"method": "grpo"}, "advantage"),
        ("RLOO", {"method": "rloo"}, "advantage"),
        ("MAGRPO (mean)", {"method": "magrpo"}, "advantage"),
    ]


def relay_rows(n: int, groups: int, group_size: int, tokenizer, seed: int) -> dict[str, dict]:
    """Every relay method's agreement with the designed ground truth at team size ``n``."""
    from mas.envs import build_env
    from mas.training.metrics import pearson

    cfg = validate_config(relay_team(n))
    env = build_env(cfg.env)
    rng = random.Random(seed)  # consumed in the engine's fixed batch order: runs are reproducible

    def respond(req):
        part = req.messages[-1]["content"].removeprefix("Task: ")
        truth = sum(int(x) for x in part.replace("-", "+-").split("+") if x)
        return f"ANSWER: {truth if rng.random() < P_RIGHT else truth + 1}"

    backend = ScriptedBackend(respond, {"workers": tokenizer})
    engine = Engine(build_topology(cfg.topology), build_agents(cfg.agents, cfg.team.name), {"workers": tokenizer},
                    {"workers": True}, backend, score=env.score)
    group_list = engine.rollout(env.sample_tasks(groups), group_size, seed=seed)
    episodes = [ep for g in group_list for ep in g.episodes]
    names = [a.name for a in cfg.agents]
    batch = build_credit_batch(group_list, names)
    out = {}
    for label, credit_cfg, view in relay_methods(n, group_size):
        ccfg = validate_config({**relay_team(n), "credit": credit_cfg, "trainer": {"group_size": group_size}}).credit
        t0 = time.perf_counter()
        requests = plan_credit(group_list, ccfg)
        results = engine.execute(requests, seed=seed + 1) if requests else None
        credit = run_credit(batch, ccfg, results)
        wall = time.perf_counter() - t0
        values = credit_view(view, credit, ccfg).tolist()
        xs, ys = [], []
        per_agent: dict[str, tuple[list[float], list[float]]] = {a: ([], []) for a in names}
        for (e, a), v in zip(zip(batch.episode_ids.tolist(), batch.agent_ids.tolist()), values):
            right = episodes[e].info["designed"][names[a]]
            xs.append(v), ys.append(right)
        for (e, a), adv in zip(zip(batch.episode_ids.tolist(), batch.agent_ids.tolist()), credit.advantages.tolist()):
            per_agent[names[a]][0].append(adv), per_agent[names[a]][1].append(episodes[e].info["designed"][names[a]])
        signals = [r for r in (pearson(*per_agent[a]) for a in names) if r is not None]
        cost = credit_cost(requests, results)
        out[label] = {"rho": spearman(np.array(xs), np.array(ys)), "signal": float(np.mean(signals)) if signals else float("nan"),
                      "reruns": (cost["replays"] + cost["interventions"]) / len(episodes),
                      "generations": cost["extra_generations"] / len(episodes), "wall": wall}
    return out


def print_relay(tables: dict[int, dict[str, dict]], groups: int, group_size: int) -> None:
    sizes = sorted(tables)
    print(f"\nrelay design (envs/team/relay.py): {groups} groups x {group_size} episodes per size, each specialist right "
          f"with p = {P_RIGHT}; credit against the designed ground truth (own part right), not Shapley (R/N for all in an AND game)")
    print(f"| method | {' | '.join(f'Spearman N={n}' for n in sizes)} | {' | '.join(f'signal N={n}' for n in sizes)} | "
          f"{' | '.join(f're-runs / episode N={n}' for n in sizes)} | {' | '.join(f'wall s N={n}' for n in sizes)} |")
    print("|" + "---|" * (1 + 4 * len(sizes)))

    def fmt(x):
        return "n/a" if math.isnan(x) else f"{x:.2f}"

    for label in tables[sizes[0]]:
        rows = [tables[n][label] for n in sizes]
        reruns = " | ".join(f"{r['reruns']:.1f}" for r in rows)
        walls = " | ".join(f"{r['wall']:.2f}" for r in rows)
        print(f"| {label} | {' | '.join(fmt(r['rho']) for r in rows)} | {' | '.join(fmt(r['signal']) for r in rows)} | "
              f"{reruns} | {walls} |")
    print("\nSpearman: per-agent credit (per episode) against own-part correctness, pooled over episodes and agents. "
          "signal: the step metrics' designed_signal, Pearson of each agent's advantage with its own correctness, mean "
          "over agents. re-runs: replays and coalition re-runs per episode.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=16, help="task groups per design")
    ap.add_argument("--group-size", type=int, default=4, help="episodes per task (C3's first fanout)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--relay-sizes", default="2,4,8", help="team sizes of the relay design ('' to skip it)")
    ap.add_argument("--relay-groups", type=int, default=8, help="task groups per relay size (SHARP's exact Shapley re-runs "
                    "2^N - 1 coalitions per episode)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = train_tokenizer(["worker1 worker2 aggregator ANSWER PART CORRUPT OK Task: q0123456789 masked"], vocab_size=300)
    available = set(credit_names())
    rows: dict[str, dict[str, dict]] = {}
    t_start = time.perf_counter()
    for design in DESIGNS:
        engine, backend, tasks = scripted_team(design, tok, args.seed)
        task_list = [Task(f"t{i}", f"q{i}", str(10 + i)) for i in range(args.groups)]
        tasks.update({t.prompt: t for t in task_list})
        groups = engine.rollout(task_list, args.group_size, seed=args.seed)
        for label, cfg, view in METHODS:
            if cfg["method"] not in available:
                continue
            if cfg["method"] == "c3":
                cfg = {**cfg, "fanout": [args.group_size, 2]}
            rows.setdefault(label, {})[design.name] = run_method(design, groups, engine, cfg, view, args.seed + 1)
    total = time.perf_counter() - t_start

    names = [d.name for d in DESIGNS]
    print(f"credit accuracy: {args.groups} groups x {args.group_size} episodes per design, scripted agents, "
          f"real engine; total {total:.1f} s\n")
    print("Spearman correlation of per-agent credit with the exact Shapley value (pooled over episodes and both")
    print("workers; a method that gives every agent its episode's credit still correlates through the outcome)")
    head = (f"| method | per-agent credit | {' | '.join(names)} | free-rider found | extra generations / group | "
            f"replays + interventions / group | critic calls / group | wall s (5 designs) |")
    print(head)
    print("|" + "---|" * (len(names) + 7))
    for label, by_design in rows.items():
        def fmt(x):
            return "n/a (constant credit)" if math.isnan(x) else f"{x:.2f}"
        cells = [fmt(by_design[n]["rho"]) for n in names]
        fr = by_design["free-rider"]
        cost = fr["cost"]
        wall = sum(r["wall"] for r in by_design.values())
        distinct = "yes" if any(r["separates"] for r in by_design.values()) else "no: same for every agent"
        print(f"| {label} | {distinct} | {' | '.join(cells)} | {100 * fr['detect']:.0f}% | {cost['extra_generations']:.1f} | "
              f"{cost['replays'] + cost['interventions']:.1f} | {cost['critiques']:.1f} | {wall:.2f} |")
    missing = [label for label, cfg, _ in METHODS if cfg["method"] not in available]
    if missing:
        print(f"\nnot registered here (skipped): {', '.join(missing)}")
    print("\nfree-rider found: share of the free-rider design's groups (those where worker1 contributed at least once)"
          "\nin which worker2's mean |credit| is strictly below worker1's; ties, as when every agent gets the same"
          "\ncredit, count as not found. Costs are per group in the free-rider design.")
    sizes = [int(x) for x in args.relay_sizes.split(",") if x.strip()]
    if sizes:
        relay_tok = train_tokenizer(["You solve your part. Task: ANSWER: 0123456789+-"], vocab_size=300)
        tables = {n: relay_rows(n, args.relay_groups, args.group_size, relay_tok, args.seed) for n in sizes}
        print_relay(tables, args.relay_groups, args.group_size)


if __name__ == "__main__":
    main()
