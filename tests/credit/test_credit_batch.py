"""build_credit_batch: flattening order and every tensor of CreditBatch on hand-built episodes."""

from __future__ import annotations

import pytest
import torch
from credit_reference import make_episode, make_group, make_turn, random_groups

from mas.credit import build_credit_batch
from mas.types import EpisodeGroup, Task, flatten_turns


def _groups():
    g0 = make_group([["solver", "verifier"], ["solver"]], [1.0, 0.0], group_id=0, invalid={1: (0,)})
    g1 = make_group([[], ["verifier", "verifier", "solver"]], [0.5, 0.25], group_id=1)
    g1.episodes[1].turns[2].trainable = False
    g1.episodes[1].turns[0].extra_rewards = {"format": 1.0}
    g0.episodes[0].turns[1].extra_rewards = {"tool": -0.5, "format": 0.5}
    return [g0, g1]


def test_every_field_on_a_hand_built_batch():
    batch = build_credit_batch(_groups(), ["solver", "verifier"])
    assert batch.num_episodes == 4 and batch.num_turns == 6
    assert batch.episode_rewards.tolist() == [1.0, 0.0, 0.5, 0.25]
    assert batch.episode_rewards.dtype == torch.float64  # credit arithmetic is float64 end to end
    assert batch.episode_group_ids.tolist() == [0, 0, 1, 1]
    # turns: g0e0 [solver, verifier], g0e1 [solver], g1e0 [], g1e1 [verifier, verifier, solver]
    assert batch.episode_ids.tolist() == [0, 0, 1, 3, 3, 3]
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.agent_ids.tolist() == [0, 1, 0, 1, 1, 0]
    assert batch.turn_ids.tolist() == [0, 1, 0, 0, 1, 2]
    assert batch.invalid.tolist() == [False, False, True, False, False, False]
    assert batch.trainable.tolist() == [True, True, True, True, True, False]
    assert batch.agent_names == ["solver", "verifier"]
    assert sorted(batch.turn_rewards) == ["format", "tool"]
    assert batch.turn_rewards["format"].tolist() == [0.0, 0.5, 0.0, 1.0, 0.0, 0.0]  # absent -> 0
    assert batch.turn_rewards["tool"].tolist() == [0.0, -0.5, 0.0, 0.0, 0.0, 0.0]
    assert sorted(batch.turn_reward_present) == ["format", "tool"]  # which turns carry the key: a real 0 vs the filler
    assert batch.turn_reward_present["format"].tolist() == [False, True, False, True, False, False]
    assert batch.turn_reward_present["tool"].tolist() == [False, True, False, False, False, False]
    assert batch.turn_reward_present["tool"].dtype == torch.bool
    assert batch.has_turn_reward("tool").tolist() == batch.turn_reward_present["tool"].tolist()
    assert batch.has_turn_reward("judge").tolist() == [False] * 6  # no turn has it
    for name in ("episode_ids", "group_ids", "agent_ids", "turn_ids"):
        assert getattr(batch, name).dtype == torch.long
    assert batch.invalid.dtype == torch.bool and batch.trainable.dtype == torch.bool


def test_group_ids_are_list_positions_not_episode_group_id():
    g = make_group([["a"]], [1.0], group_id=7)
    batch = build_credit_batch([g, g], ["a"])
    assert batch.group_ids.tolist() == [0, 1] and batch.episode_group_ids.tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_order_matches_flatten_turns(seed):
    agents = ["a", "b", "c"]
    groups = random_groups(seed, 4, 3, 5, agents, ragged_groups=True)
    batch = build_credit_batch(groups, agents)
    flat = flatten_turns(groups)
    episodes = [ep for g in groups for ep in g.episodes]
    assert len(flat) == batch.num_turns
    for n, (ep, turn) in enumerate(flat):
        assert batch.agent_names[int(batch.agent_ids[n])] == turn.agent
        assert episodes[int(batch.episode_ids[n])] is ep
        assert ep.turns[int(batch.turn_ids[n])] is turn
        assert bool(batch.invalid[n]) == (not turn.valid)
        assert batch.episode_rewards[batch.episode_ids[n]].item() == ep.reward


def test_unknown_agent_is_a_clear_error():
    groups = [make_group([["solver", "critic"]], [1.0])]
    with pytest.raises(ValueError, match=r"'critic'.*not in agent_names \['solver'\]"):
        build_credit_batch(groups, ["solver"])


def test_duplicate_agent_names_are_an_error():
    with pytest.raises(ValueError, match="duplicates"):
        build_credit_batch([make_group([["a"]], [1.0])], ["a", "a"])


def test_empty_batch():
    batch = build_credit_batch([], ["a"])
    assert batch.num_turns == 0 and batch.num_episodes == 0
    task = Task("t", "q", "a")
    batch = build_credit_batch([EpisodeGroup(task=task, episodes=[make_episode([], 1.0, task=task)])], ["a"])
    assert batch.num_turns == 0 and batch.num_episodes == 1
    assert make_turn("a", 0).prompt_ids  # builders fill the token fields
