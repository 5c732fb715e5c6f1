"""The local runtime: everything in the driver; an update's gradients are computed when it is
started, its optimizer steps when its handle's result is asked for."""

from __future__ import annotations

import os

import pytest
from team_helpers import team_config

from mas.config.schema import validate_config
from mas.learning.learner import TrainSample
from mas.training.team import build_team


def test_start_update_returns_a_handle_that_steps_at_its_result_with_where_and_when(tiny_model_dir):
    with build_team(validate_config(team_config(tiny_model_dir, "chain"))) as team:
        assert team.runtime.can_overlap is False and team.runtime.can_abandon_updates and set(team.learners) == {"main"}
        learner = team.learners["main"]
        sample = TrainSample([5, 6, 7], [8, 9], [-1.0, -1.0], 1.0)
        handle = learner.start_update([sample], seed=0)
        assert handle.span is None and learner.version == 0  # gradients in, no step yet
        assert handle.result()["samples"] == 1.0 and learner.version == 1
        assert handle.span.pid == os.getpid() and handle.span.end >= handle.span.start
        broken = learner.start_update([TrainSample([5], [8, 9], [-1.0], 1.0)])  # logprobs do not match the tokens
        with pytest.raises(ValueError, match="old_logprobs"):
            broken.result()  # the error comes out of result(), as a remote learner's does


def test_policies_are_reachable_only_where_they_live(tiny_model_dir):
    with build_team(validate_config(team_config(tiny_model_dir, "chain"))) as team:
        assert team.policies["main"].model is team.backend.policies["main"].model
        info = team.runtime.describe()
        assert info["main"]["trainable_parameters"] > 0 and info["judge"]["trainable_parameters"] == 0
