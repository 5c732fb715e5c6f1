"""Long evaluations show their progress: the engine reports each episode's end, and a held-out
evaluation draws a bar of its episodes (greedy, sampled, the training probe) on stderr."""

from __future__ import annotations

from team_helpers import team_config

from mas.config.loading import validate_config
from mas.training.evaluation import evaluate
from mas.training.team import build_team
from mas.types import Task


def test_the_engine_calls_done_once_per_episode_as_each_ends(tiny_model_dir):
    cfg = validate_config(team_config(tiny_model_dir, "orchestrator"), "team")
    with build_team(cfg) as team:
        ended = []
        tasks = [Task(f"t{i}", f"{i}+1", str(i + 1)) for i in range(3)]
        groups = team.engine.rollout(tasks, 2, seed=0, done=lambda: ended.append(1))
        assert len(ended) == sum(len(g.episodes) for g in groups) == 6


def test_an_evaluation_with_progress_draws_a_bar_of_every_episode_it_plays(tiny_model_dir, capfd):
    data = team_config(tiny_model_dir, "orchestrator")
    data["trainer"].update(eval_sampled_k=2, eval_train=True)
    cfg = validate_config(data, "team")
    with build_team(cfg) as team:
        evaluate(team, 3, seed=0, progress=True, label="eval before training")
        err = capfd.readouterr().err
        bars = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("eval before training")]
        # 3 greedy, 3 x 2 sampled, 3 on the training probe (the bar is redrawn at most every 0.1 s and
        # cleared at the end, so its last state need not show; the engine's test counts every end)
        assert bars and all("/12 " in line for line in bars), err
        evaluate(team, 3, seed=0)
        assert "eval" not in capfd.readouterr().err
