"""env: custom: tasks from a JSONL file or a loader, a Python reward, a held-out split, and
reward failures that mark the episode (the step goes on)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: team_helpers, test_engine

from team_helpers import team_config  # noqa: E402
from test_engine import chain_respond, scripted_engine  # noqa: E402

from mas.config.schema import ConfigError, validate_config  # noqa: E402
from mas.envs import build_env  # noqa: E402
from mas.envs.custom import CustomEnvConfig  # noqa: E402
from mas.types import Episode, Task  # noqa: E402

CALLS: list[tuple[str, str | None]] = []


def score(task, answer, episode):
    """Exact match, with a second named score."""
    CALLS.append((task.task_id, answer))
    return {"reward": float(answer == task.answer), "spoke": float(len(episode.turns))}


def broken(task, answer, episode):
    if task.prompt == "1+1":
        raise ValueError(f"cannot grade {answer!r}")
    return 1.0


def nan_reward(task, answer, episode):
    return float("nan")


def load():
    return [{"prompt": f"{i}+1", "answer": str(i + 1), "level": "easy"} for i in range(6)]


@pytest.fixture()
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"{i}+1", "answer": str(i + 1), "source": "unit"} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def env_of(**section):
    return build_env(CustomEnvConfig(name="custom", **section))


def test_jsonl_tasks_are_split_into_train_and_held_out(tasks_file):
    env = env_of(tasks=str(tasks_file), reward="test_custom_env:score", heldout_fraction=0.2)
    held = env.eval_tasks(2)
    train = env.sample_tasks(8)
    assert len(held) == 2 and {t.task_id for t in held}.isdisjoint({t.task_id for t in train})
    assert sorted(t.task_id for t in train) == sorted(f"q{i}" for i in range(10) if f"q{i}" not in {t.task_id for t in held})
    assert train[0].meta == {"source": "unit"}
    with pytest.raises(ValueError, match="asked for 3 eval tasks"):
        env.eval_tasks(3)
    again = env_of(tasks=str(tasks_file), reward="test_custom_env:score", heldout_fraction=0.2)
    assert [t.task_id for t in again.eval_tasks(2)] == [t.task_id for t in held]  # a stable split


def test_a_loader_function_and_a_separate_eval_set(tasks_file):
    env = env_of(tasks="test_custom_env:load", eval_tasks=str(tasks_file), reward="test_custom_env:score")
    assert len(env.sample_tasks(6)) == 6 and env.eval_tasks(10)[0].task_id == "q0"
    assert env.sample_tasks(1)[0].meta == {"level": "easy"}


def test_the_reward_function_gets_task_answer_and_episode_and_named_scores_are_kept(tasks_file):
    env = env_of(tasks=str(tasks_file), reward="test_custom_env:score")
    CALLS.clear()
    ep = Episode(Task("q3", "3+1", "4"), 0, 0, 0, answer="4")
    assert env.score(ep) == 1.0 and CALLS == [("q3", "4")] and ep.info["scores"] == {"spoke": 0.0}


def test_a_reward_that_raises_or_is_nan_fails_that_episode_with_the_reason_and_the_rest_go_on(tasks_file, tiny_tokenizer):
    cfg = team_config("m", "chain", env={"name": "custom", "tasks": "test_custom_env:load", "reward": "test_custom_env:broken"})
    env = build_env(validate_config(cfg).env)
    engine, _ = scripted_engine(cfg, chain_respond, tiny_tokenizer, score=env.score)
    groups = engine.rollout([Task("a", "0+1", "1"), Task("b", "1+1", "2")], 2, seed=0)
    assert [(e.status, e.reward) for e in groups[0].episodes] == [("ok", 1.0)] * 2
    for ep in groups[1].episodes:
        assert ep.status == "error" and ep.reward == 0.0
        assert ep.error == "score: RewardError: test_custom_env:broken raised ValueError: cannot grade '7'"  # the team's answer
    nan_env = env_of(tasks=str(tasks_file), reward="test_custom_env:nan_reward")
    with pytest.raises(Exception, match="nan_reward returned nan"):
        nan_env.score(Episode(Task("q", "1", "1"), 0, 0, 0))


@pytest.mark.parametrize("section,needle", [
    ({"tasks": "x.jsonl", "reward": "not a reference"}, "env.reward"),
    ({"tasks": "x.jsonl", "reward": "a.b:c", "heldout_fraction": 1.5}, "env.heldout_fraction"),
    ({"reward": "a.b:c"}, "env.tasks: missing"),
])
def test_custom_env_config_errors_name_the_path(section, needle):
    with pytest.raises(ConfigError) as info:
        validate_config(team_config("m", "chain", env={"name": "custom", **section}))
    assert any(line.startswith(needle.split(":")[0]) and needle.split(": ")[-1] in line for line in info.value.lines), info.value.lines


def test_data_problems_say_where(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1", "answer": "2"}\n{"question": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no 'prompt' string"):
        env_of(tasks=str(bad), reward="test_custom_env:score")
    with pytest.raises(ValueError, match="env.reward: .*has no attribute 'nope'"):
        env_of(tasks=str(bad), reward="test_custom_env:nope")
    assert math.isclose(env_of(tasks="test_custom_env:load", reward="test_custom_env:score", heldout_fraction=0.5)
                        .splits.held_out.__len__(), 3)
