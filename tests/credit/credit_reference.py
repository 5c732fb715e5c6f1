"""Test helpers: builders of hand-made episodes and slow pure-Python reference implementations.

The references are loops written straight from the formulas in CREDIT_SPEC §1–2 over the
nested ``EpisodeGroup -> Episode -> Turn`` structure; they never touch torch.  Their output
is a flat list in the canonical order of ``mas.types.flatten_turns``.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

from mas.types import Episode, EpisodeGroup, Task, Turn


# --- builders ---------------------------------------------------------------------------


def make_turn(agent: str, index: int, *, valid: bool = True, trainable: bool = True, extra: dict | None = None) -> Turn:
    return Turn(
        agent=agent,
        policy=f"{agent}_policy",
        index=index,
        parent=None if index == 0 else index - 1,
        messages=[{"role": "user", "content": "q"}],
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        text=f"{agent} says something",
        valid=valid,
        trainable=trainable,
        extra_rewards=dict(extra or {}),
    )


def make_episode(
    agents: list[str], reward: float, *, group_id: int = 0, sample_id: int = 0, invalid: tuple[int, ...] = (), task: Task | None = None
) -> Episode:
    """An episode whose turn t is by ``agents[t]``; turns listed in ``invalid`` failed to parse."""
    task = task or Task(task_id=f"task{group_id}", prompt="q", answer="a")
    turns = [make_turn(a, t, valid=t not in invalid) for t, a in enumerate(agents)]
    return Episode(task=task, group_id=group_id, sample_id=sample_id, seed=sample_id, turns=turns, reward=reward)


def make_group(episodes_agents: list[list[str]], rewards: list[float], *, group_id: int = 0, invalid: dict[int, tuple[int, ...]] | None = None) -> EpisodeGroup:
    """A group: episode i has turns by ``episodes_agents[i]`` and reward ``rewards[i]``."""
    task = Task(task_id=f"task{group_id}", prompt="q", answer="a")
    invalid = invalid or {}
    eps = [
        make_episode(agents, r, group_id=group_id, sample_id=i, invalid=invalid.get(i, ()), task=task)
        for i, (agents, r) in enumerate(zip(episodes_agents, rewards))
    ]
    return EpisodeGroup(task=task, episodes=eps)


def random_groups(
    seed: int,
    num_groups: int,
    group_size: int,
    max_turns: int,
    agent_names: list[str],
    *,
    ragged_groups: bool = False,
    min_turns: int = 0,
    p_invalid: float = 0.3,
) -> list[EpisodeGroup]:
    """Random ragged batch: random turns per episode (min_turns..max_turns), a random agent
    per turn, random validity, and rewards mixing a small discrete set (ties, constant
    groups) with continuous values.  With ``ragged_groups`` each group has 1..group_size
    episodes."""
    rng = random.Random(seed)
    discrete = rng.random() < 0.5
    groups = []
    for b in range(num_groups):
        task = Task(task_id=f"task{b}", prompt="q", answer="a")
        size = rng.randint(1, group_size) if ragged_groups else group_size
        episodes = []
        for i in range(size):
            n = rng.randint(min_turns, max_turns)
            turns = [make_turn(rng.choice(agent_names), t, valid=rng.random() >= p_invalid, trainable=rng.random() < 0.8) for t in range(n)]
            reward = rng.choice([0.0, 0.1, 0.5, 0.9, 1.0]) if discrete else rng.uniform(-1.0, 2.0)
            episodes.append(Episode(task=task, group_id=b, sample_id=i, seed=1000 * b + i, turns=turns, reward=reward))
        groups.append(EpisodeGroup(task=task, episodes=episodes))
    return groups


# --- reference statistics -----------------------------------------------------------------


def ref_mean_std(xs: list[float]) -> tuple[float, float]:
    """Per-group statistics: ddof-1 std; a group of one gets its own value as mean and std 0
    (so it normalises to 0, like a constant group)."""
    if len(set(xs)) == 1:  # one value, or all equal: no spread
        return xs[0], 0.0
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))
    return mu, sd


def ref_apply(x: float, mu: float, sd: float, scale_by_std: bool, eps: float) -> float:
    return (x - mu) / (sd + eps) if scale_by_std else x - mu


def ref_normalise(kind: str, values: list[float], group_ids: list[int], agent_ids: list[int], scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """Reference of the five normalisers on flat lists."""
    if kind == "none":
        return list(values)
    if kind == "group_batch_std":  # centre per group, divide by one ddof-1 std over all values
        _, sd = ref_mean_std(values)
        means = {g: ref_mean_std([v for v, h in zip(values, group_ids) if h == g])[0] for g in set(group_ids)}
        return [ref_apply(v, means[g], sd, scale_by_std, eps) for v, g in zip(values, group_ids)]
    if kind == "global":
        keys = [0] * len(values)
    elif kind == "group":
        keys = list(group_ids)
    elif kind == "agent":
        keys = list(zip(group_ids, agent_ids))
    else:
        raise ValueError(kind)
    buckets: dict = defaultdict(list)
    for v, k in zip(values, keys):
        buckets[k].append(v)
    stats = {k: ref_mean_std(vs) for k, vs in buckets.items()}
    return [ref_apply(v, *stats[k], scale_by_std, eps) for v, k in zip(values, keys)]


# --- reference credit methods --------------------------------------------------------------


def ref_episode_score(ep: Episode, invalid_penalty: float) -> float:
    """DrMAS 'vanilla GRPO' trajectory score: mean of the per-row rewards R - p*invalid_t."""
    if not ep.turns:
        return ep.reward
    rows = [ep.reward - invalid_penalty * (0.0 if t.valid else 1.0) for t in ep.turns]
    return sum(rows) / len(rows)


def ref_grpo(groups: list[EpisodeGroup], invalid_penalty: float = 0.0, scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """A_i = (s_i - mean s) / (std s + eps) per group, broadcast to every turn of episode i."""
    out: list[float] = []
    for g in groups:
        scores = [ref_episode_score(ep, invalid_penalty) for ep in g.episodes]
        mu, sd = ref_mean_std(scores)
        for ep, s in zip(g.episodes, scores):
            out += [ref_apply(s, mu, sd, scale_by_std, eps)] * len(ep.turns)
    return out


def ref_dr_grpo(groups: list[EpisodeGroup], invalid_penalty: float = 0.0) -> list[float]:
    """A_i = s_i - mean s (a group of one keeps s_i: verl's mean 0)."""
    return ref_grpo(groups, invalid_penalty, scale_by_std=False)


def ref_rloo(groups: list[EpisodeGroup], invalid_penalty: float = 0.0) -> list[float]:
    """A_i = s_i - (1/(G-1)) * sum_{j != i} s_j; 0 for a group of one."""
    out: list[float] = []
    for g in groups:
        scores = [ref_episode_score(ep, invalid_penalty) for ep in g.episodes]
        G = len(scores)
        for i, ep in enumerate(g.episodes):
            if G == 1:
                a = 0.0
            else:
                a = scores[i] - sum(scores[j] for j in range(G) if j != i) / (G - 1)
            out += [a] * len(ep.turns)
    return out


def ref_dr_mas(groups: list[EpisodeGroup], invalid_penalty: float = 0.1, scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """CREDIT_SPEC §2.3 pseudo-code: per group, per agent, over all that agent's turns."""
    adv: dict[tuple[int, int, int], float] = {}
    for b, g in enumerate(groups):
        rows: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
        for i, ep in enumerate(g.episodes):
            for s, turn in enumerate(ep.turns):
                r = ep.reward - invalid_penalty * (0.0 if turn.valid else 1.0)
                rows[turn.agent].append((i, s, r))
        for _agent, lst in rows.items():
            mu, sd = ref_mean_std([r for *_, r in lst])
            for i, s, r in lst:
                adv[(b, i, s)] = ref_apply(r, mu, sd, scale_by_std, eps)
    return [adv[(b, i, s)] for b, g in enumerate(groups) for i, ep in enumerate(g.episodes) for s in range(len(ep.turns))]


# --- reference credit pipelines (method x normaliser) ------------------------------------------


def ref_raw_scores(groups: list[EpisodeGroup], method: str, invalid_penalty: float) -> tuple[list[list[list[float]]], list[list[float]]]:
    """Raw scores straight from the formulas: (turn[b][i][t], episode[b][i]).

    grpo / dr_grpo: s_i on every turn; rloo: s_i - mean of the other episodes' s_j (0 for a
    group of one) on every turn; dr_mas: R_i - p*invalid_t per turn, s_i per episode."""
    turn: list[list[list[float]]] = []
    episode: list[list[float]] = []
    for g in groups:
        s = [ref_episode_score(ep, invalid_penalty) for ep in g.episodes]
        if method in ("grpo", "dr_grpo"):
            ep_scores = s
        elif method == "rloo":
            G = len(s)
            ep_scores = [0.0 if G == 1 else s[i] - sum(s[j] for j in range(G) if j != i) / (G - 1) for i in range(G)]
        elif method == "dr_mas":
            ep_scores = s
        else:
            raise ValueError(method)
        episode.append(ep_scores)
        if method == "dr_mas":
            turn.append([[ep.reward - invalid_penalty * (0.0 if t.valid else 1.0) for t in ep.turns] for ep in g.episodes])
        else:
            turn.append([[ep_scores[i]] * len(ep.turns) for i, ep in enumerate(g.episodes)])
    return turn, episode


def ref_pipeline(
    groups: list[EpisodeGroup], method: str, normaliser: str, invalid_penalty: float = 0.0, scale_by_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """Per-turn advantages of ``method`` + ``normaliser``, by nested loops.

    none: the raw turn score; group: per task, stats over the episodes' scores, each turn gets
    its episode's value; group_batch_std: the group's mean, the std of every episode score of
    the batch; global: stats over every turn of the batch; agent: per (task, agent)
    stats over that agent's turns.  dr_grpo never divides by the std."""
    if method == "dr_grpo":
        scale_by_std = False
    turn, episode = ref_raw_scores(groups, method, invalid_penalty)
    out: list[float] = []
    if normaliser == "none":
        return [x for b in turn for ep in b for x in ep]
    if normaliser in ("group", "group_batch_std"):
        _, batch_sd = ref_mean_std([x for b in episode for x in b])
        for b, g in enumerate(groups):
            mu, sd = ref_mean_std(episode[b])
            sd = batch_sd if normaliser == "group_batch_std" else sd
            for i, ep in enumerate(g.episodes):
                out += [ref_apply(episode[b][i], mu, sd, scale_by_std, eps)] * len(ep.turns)
        return out
    if normaliser == "global":
        flat = [x for b in turn for ep in b for x in ep]
        if not flat:
            return []
        mu, sd = ref_mean_std(flat)
        return [ref_apply(x, mu, sd, scale_by_std, eps) for x in flat]
    if normaliser == "agent":
        for b, g in enumerate(groups):
            per_agent: dict[str, list[float]] = defaultdict(list)
            for i, ep in enumerate(g.episodes):
                for t, tr in enumerate(ep.turns):
                    per_agent[tr.agent].append(turn[b][i][t])
            stats = {a: ref_mean_std(xs) for a, xs in per_agent.items()}
            for i, ep in enumerate(g.episodes):
                for t, tr in enumerate(ep.turns):
                    out.append(ref_apply(turn[b][i][t], *stats[tr.agent], scale_by_std, eps))
        return out
    raise ValueError(normaliser)
