"""The per-agent gradient signal on designed team tasks: the correlation between an agent's
advantages and its own designed correctness (``info["designed"]``), in the step metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mas.credit.batch import build_credit_batch
from mas.training.metrics import pearson, step_metrics
from mas.types import Credit, Episode, EpisodeGroup, Task, Turn


def turn(agent: str, index: int) -> Turn:
    return Turn(agent=agent, policy=agent, index=index, parent=None, messages=[], prompt_ids=[1], completion_ids=[2],
                logprobs=[0.0], text="ANSWER: 1", parsed={"answer": "1"})


def group(designed: list[dict[str, float] | None], agents=("a", "b", "r")) -> EpisodeGroup:
    task = Task("t", "q", "1")
    episodes = []
    for i, d in enumerate(designed):
        ep = Episode(task, 0, i, 0, turns=[turn(name, k) for k, name in enumerate(agents)], reward=float(i % 2 == 0))
        if d is not None:
            ep.info["designed"] = d
        episodes.append(ep)
    return EpisodeGroup(task, episodes)


def metrics(groups, advantages, train_mask=None):
    batch = build_credit_batch(groups, ["a", "b", "r"])
    credit = Credit(advantages=torch.tensor(advantages, dtype=torch.float32), train_mask=train_mask)
    return step_metrics(0, groups, batch, credit, {}, {})


# four episodes, turns a, b, r in each: flattened advantages [a0, b0, r0, a1, b1, r1, ...]
A = [1.0, -1.0, 0.5, -0.5]  # a's advantages
DESIGNED = [{"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 1.0}]  # r has no designed job


def flat(a: list[float]) -> list[float]:
    return [x for k in range(4) for x in (a[k], 0.3 * k, 0.0)]


def test_signal_is_the_pearson_correlation_of_advantage_and_designed_correctness():
    """a: x = [1, -1, .5, -.5] (mean 0), y = [1, 0, 1, 0] (mean .5):
    sxy = .5 + .5 + .25 + .25 = 1.5, sxx = 2.5, syy = 1, r = 1.5 / sqrt(2.5) = 3 / sqrt(10)."""
    m = metrics([group(DESIGNED)], flat(A))
    assert m["agents"]["a"]["designed_signal"] == pytest.approx(3 / math.sqrt(10))
    # b was right in every episode: its correctness is constant, the correlation undefined -> None, not NaN
    assert m["agents"]["b"]["designed_signal"] is None
    assert "designed_signal" not in m["agents"]["r"]  # no designed job: no key at all
    json.dumps(m, allow_nan=False)  # what metrics.jsonl writes


def test_only_trained_turns_count():
    """The method leaves a's last turn out (train_mask): x = [1, -1, .5], y = [1, 0, 1]:
    dx = [5/6, -7/6, 1/3], dy = [1/3, -2/3, 1/3], sxy = 7/6, sxx = 13/6, syy = 2/3,
    r = (7/6) / sqrt(13/9) = 7 / (2 sqrt(13))."""
    mask = torch.ones(12, dtype=torch.bool)
    mask[9] = False  # a's turn in episode 3
    m = metrics([group(DESIGNED)], flat(A), train_mask=mask)
    assert m["agents"]["a"]["designed_signal"] == pytest.approx(7 / (2 * math.sqrt(13)))


def test_a_broadcast_advantage_gives_the_others_luck_as_noise():
    """GRPO's picture on an AND of two parts: every agent gets the episode's advantage, so a's
    signal is the correlation of its correctness with the team's outcome, not 1."""
    designed = [{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 0.0, "b": 0.0}]
    team = [1.0, 0.0, 0.0, 0.0]
    adv = [(r - 0.25) for r in team]  # one group-relative advantage per episode, shared by its turns
    groups = [group(designed)]
    m = metrics(groups, [adv[k] for k in range(4) for _ in range(3)])
    # x = [.75, -.25, -.25, -.25], y = [1, 1, 0, 0]: sxy = .375 + (-.125) + .125 + .125 = .5,
    # sxx = .75, syy = 1: r = .5 / sqrt(.75) = 1 / sqrt(3)
    assert m["agents"]["a"]["designed_signal"] == pytest.approx(1 / math.sqrt(3))
    assert m["agents"]["b"]["designed_signal"] == pytest.approx(1 / math.sqrt(3))
    m = metrics(groups, [0.0] * 12)  # a group without reward variance: zero advantages, no signal
    assert m["agents"]["a"]["designed_signal"] is None


def test_episodes_without_a_designed_task_have_no_signal():
    m = metrics([group([None] * 4)], flat(A))
    assert all("designed_signal" not in a for a in m["agents"].values())


def test_pearson_edge_cases():
    assert pearson([], []) is None and pearson([1.0], [1.0]) is None
    assert pearson([1.0, 2.0], [3.0, 3.0]) is None
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="different lengths"):
        pearson([1.0], [1.0, 2.0])
