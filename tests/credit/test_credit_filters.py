"""Zero-variance groups (credit/filters.py, CREDIT_SPEC.md §8c): which groups are constant, that
dropping them leaves every other group's credit alone, and what the update then divides by."""

from __future__ import annotations

import pytest
import torch
from credit_reference import make_group, random_groups

from mas.credit import build_credit_batch, run_credit
from mas.credit.baselines import GRPOConfig
from mas.credit.dr_mas import DrMasConfig
from mas.credit.filters import constant_groups, drop_constant_groups
from mas.learning.learner import loss_norm
from mas.types import Credit

AGENTS = ["solver", "verifier"]


def batch_with_one_constant_group():
    groups = [make_group([["solver", "verifier"]] * 3, [1.0, 0.0, 1.0], group_id=0),
              make_group([["solver"], ["solver", "verifier"], ["solver"]], [0.0, 0.0, 0.0], group_id=1),  # constant
              make_group([["solver", "verifier"]] * 3, [0.5, 1.0, 0.0], group_id=2)]
    return groups, build_credit_batch(groups, AGENTS)


def test_the_constant_group_is_found_by_hand():
    _, batch = batch_with_one_constant_group()
    assert constant_groups(batch).tolist() == [False, True, False]


@pytest.mark.parametrize("cfg", [GRPOConfig(method="grpo"), DrMasConfig(method="dr_mas")])
def test_dropping_it_masks_only_its_turns_and_changes_no_advantage(cfg):
    _, batch = batch_with_one_constant_group()
    credit = run_credit(batch, cfg)
    kept, dropped = drop_constant_groups(batch, credit)
    assert dropped == 1
    assert torch.equal(kept.advantages, credit.advantages) and kept.breakdown is credit.breakdown
    assert kept.train_mask.tolist() == (batch.group_ids != 1).tolist()  # its 4 turns are out, every other turn in
    assert credit.advantages[batch.group_ids == 1].abs().max() == 0  # its advantages were 0 already (constant rule)
    # so what changes is the divisor: token_mean over the kept turns' tokens (the learner drops masked turns)
    lengths = batch.completion_lengths.tolist()
    kept_lengths = [n for n, k in zip(lengths, kept.train_mask.tolist()) if k]
    assert loss_norm(kept_lengths, "token_mean") == sum(lengths) - sum(n for n, g in zip(lengths, batch.group_ids.tolist()) if g == 1)


@pytest.mark.parametrize("seed", range(5))
def test_other_groups_credit_is_unchanged_on_random_batches(seed):
    """Dropping constant groups gives the same advantages as crediting the other groups alone."""
    groups = random_groups(seed, num_groups=6, group_size=4, max_turns=3, agent_names=AGENTS, min_turns=1)
    groups[seed % 6] = make_group([["solver"]] * 4, [0.5] * 4, group_id=seed % 6)  # at least one constant group
    batch = build_credit_batch(groups, AGENTS)
    credit = run_credit(batch, GRPOConfig(method="grpo"))
    kept, dropped = drop_constant_groups(batch, credit)
    constant = constant_groups(batch)
    assert dropped == int(constant.sum()) >= 1
    others = [g for b, g in enumerate(groups) if not constant[b]]
    alone = run_credit(build_credit_batch(others, AGENTS), GRPOConfig(method="grpo"))
    assert torch.allclose(kept.advantages[kept.train_mask], alone.advantages)


def test_an_existing_train_mask_is_kept():
    _, batch = batch_with_one_constant_group()
    mask = torch.ones(batch.num_turns, dtype=torch.bool)
    mask[0] = False  # the method had left turn 0 out already
    kept, _ = drop_constant_groups(batch, Credit(torch.zeros(batch.num_turns), train_mask=mask))
    assert kept.train_mask[0].item() is False and kept.train_mask.sum() == int((batch.group_ids != 1).sum()) - 1


def test_a_group_of_one_episode_is_constant():
    batch = build_credit_batch([make_group([["solver"]], [0.7])], AGENTS)
    assert constant_groups(batch).tolist() == [True]
