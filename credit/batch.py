"""Build the tensor view (``CreditBatch``) that credit methods see from episode groups.

Turns are flattened in the canonical order of ``mas.types.flatten_turns``: for each group,
for each episode in the group, for each turn in turn order.  ``Credit.advantages`` is
aligned with that order.

Shapes: B task groups, E episodes (all groups), N flattened turns, K agents.
"""

from __future__ import annotations

import torch

from mas.types import CreditBatch, EpisodeGroup


def build_credit_batch(groups: list[EpisodeGroup], agent_names: list[str]) -> CreditBatch:
    """Flatten ``groups`` into a ``CreditBatch``.

    * ``group_ids`` / ``episode_group_ids``: index of the group in ``groups`` (not
      ``Episode.group_id``, which the caller may number differently).
    * ``episode_ids``: running index of the episode over the whole batch (0..E-1).
    * ``turn_ids``: position of the turn in its episode's ``turns`` list.
    * ``agent_ids``: index of ``turn.agent`` in ``agent_names``; an unknown agent is a
      ValueError naming the episode and turn.
    * ``invalid`` = ``not turn.valid``; ``trainable`` = ``turn.trainable``.
    * ``completion_lengths``: completion tokens per turn; ``parent_ids``: position (as in
      ``turn_ids``) of the turn that called this one, -1 for a root turn.
    * ``turn_rewards``: one [N] tensor per key found in any ``turn.extra_rewards``; a turn
      that lacks the key gets 0.0 there [A].  ``turn_reward_present[key]`` ([N] bool) says
      which turns carry the key, so a method can tell a real 0 from that filler (e.g. SHARP's
      tool reward averages ``tool_valid`` over the turns that made tool calls only).
    Episodes without turns still count in E (they take part in per-episode statistics).
    """
    if len(set(agent_names)) != len(agent_names):
        raise ValueError(f"agent_names has duplicates: {agent_names}")
    agent_index = {name: k for k, name in enumerate(agent_names)}

    episode_rewards: list[float] = []
    episode_group_ids: list[int] = []
    episode_ids: list[int] = []
    group_ids: list[int] = []
    agent_ids: list[int] = []
    turn_ids: list[int] = []
    invalid: list[bool] = []
    trainable: list[bool] = []
    extra: list[dict[str, float]] = []
    lengths: list[int] = []
    parents: list[int] = []

    e = 0
    for b, group in enumerate(groups):
        for episode in group.episodes:
            episode_rewards.append(float(episode.reward))
            episode_group_ids.append(b)
            for t, turn in enumerate(episode.turns):
                if turn.agent not in agent_index:
                    raise ValueError(
                        f"turn {t} of episode {e} (group {b}, task {episode.task_id!r}) is by agent "
                        f"{turn.agent!r}, which is not in agent_names {agent_names}"
                    )
                episode_ids.append(e)
                group_ids.append(b)
                agent_ids.append(agent_index[turn.agent])
                turn_ids.append(t)
                invalid.append(not turn.valid)
                trainable.append(bool(turn.trainable))
                extra.append(turn.extra_rewards)
                lengths.append(len(turn.completion_ids))
                parents.append(_position_of(episode, turn.parent))
            e += 1

    keys = sorted({k for d in extra for k in d})
    turn_rewards = {k: torch.tensor([float(d.get(k, 0.0)) for d in extra], dtype=torch.float64) for k in keys}  # [N] each
    turn_reward_present = {k: torch.tensor([k in d for d in extra], dtype=torch.bool) for k in keys}  # [N] each

    return CreditBatch(
        episode_rewards=torch.tensor(episode_rewards, dtype=torch.float64),  # [E] float64: credit arithmetic never rounds to float32
        episode_group_ids=torch.tensor(episode_group_ids, dtype=torch.long),  # [E]
        episode_ids=torch.tensor(episode_ids, dtype=torch.long),  # [N]
        group_ids=torch.tensor(group_ids, dtype=torch.long),  # [N]
        agent_ids=torch.tensor(agent_ids, dtype=torch.long),  # [N]
        turn_ids=torch.tensor(turn_ids, dtype=torch.long),  # [N]
        invalid=torch.tensor(invalid, dtype=torch.bool),  # [N]
        trainable=torch.tensor(trainable, dtype=torch.bool),  # [N]
        agent_names=list(agent_names),
        turn_rewards=turn_rewards,
        turn_reward_present=turn_reward_present,
        completion_lengths=torch.tensor(lengths, dtype=torch.long),  # [N]
        parent_ids=torch.tensor(parents, dtype=torch.long),  # [N]
    )


def _position_of(episode, index: int | None) -> int:
    """Position in ``episode.turns`` of the turn with ``Turn.index == index`` (-1 if none)."""
    if index is None:
        return -1
    return next((i for i, t in enumerate(episode.turns) if t.index == index), -1)
