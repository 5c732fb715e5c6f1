"""The format warm-up as a phase of `mas train`: its progress bar, its checkpoint as soon as it
ends (before the evaluations that follow it), and a stop between its steps."""

from __future__ import annotations

import json

import pytest
import yaml
from team_helpers import team_config

import mas.training.trainer as trainer
from mas.cli import main
from mas.types import StepAbandoned


def write_team(tmp_path, model_dir):
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"agent": "lead", "messages": [{"role": "user", "content": f"{a}+1"}],
                                         "completion": f"ANSWER: {a + 1}"}) + "\n" for a in range(4)))
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(team_config(model_dir, "orchestrator")))
    return path, ["trainer.warmup.steps=3", "trainer.warmup.batch_size=2", f"trainer.warmup.demonstrations={demos}"]


def test_the_warm_up_shows_a_bar_with_its_steps_and_loss(tmp_path, tiny_model_dir, capfd):
    cfg, warm = write_team(tmp_path, tiny_model_dir)
    assert main(["train", str(cfg), "trainer.steps=1", "trainer.eval_size=0", "logging.progress=true", *warm,
                 "--run-dir", str(tmp_path / "run")]) == 0
    err = capfd.readouterr().err
    bars = [part for part in err.replace("\r", "\n").splitlines() if part.startswith("warm-up main")]
    assert bars, err
    assert "3/3" in bars[-1] and "loss " in bars[-1]  # every step counted, with the last loss


def test_without_progress_the_warm_up_prints_no_bar(tmp_path, tiny_model_dir, capfd):
    cfg, warm = write_team(tmp_path, tiny_model_dir)
    assert main(["train", str(cfg), "trainer.steps=1", "trainer.eval_size=0", "logging.progress=false", *warm,
                 "--run-dir", str(tmp_path / "run")]) == 0
    assert "warm-up main" not in capfd.readouterr().err


def test_a_finished_warm_up_is_saved_before_the_evaluation_after_it_and_resumes_from_there(tmp_path, tiny_model_dir,
                                                                                              monkeypatch):
    cfg, warm = write_team(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    evaluate = trainer.evaluate
    calls = []

    def crash_after_the_warm_up(team, *a, **k):
        calls.append("eval")
        if len(calls) == 2:  # the first after the warm-up (the one before it is the start)
            raise RuntimeError("killed")
        return evaluate(team, *a, **k)

    monkeypatch.setattr(trainer, "evaluate", crash_after_the_warm_up)
    with pytest.raises(RuntimeError, match="killed"):
        main(["train", str(cfg), "trainer.steps=1", "trainer.eval_size=2", *warm, "--run-dir", str(run)])
    assert (run / "checkpoints" / "latest").read_text() == "step_-00001"  # written before the crash
    monkeypatch.setattr(trainer, "evaluate", evaluate)
    monkeypatch.setattr(trainer, "warm_up", lambda *a, **k: pytest.fail("the resumed run warmed up again"))
    assert main(["train", "--resume", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval"] for r in rows if r.get("kind") == "eval"].count("warmup") == 1  # evaluated once, after resuming
    assert sum(r.get("kind") == "warmup" for r in rows) == 1
    assert "eval_warmup" in json.loads((run / "summary.json").read_text())


def test_a_stop_between_warm_up_steps_ends_it_and_drops_its_optimizer(tiny_model_dir):
    from mas.config.loading import validate_config
    from mas.training.team import build_team
    from mas.training.warmup import supervised_phase

    cfg = validate_config(team_config(tiny_model_dir, "orchestrator"), "team")
    with build_team(cfg) as team:
        w = cfg.trainer.warmup.model_copy(update={"steps": 5, "batch_size": 1})
        tok = team.runtime.tokenizers["main"]
        demos = [(tok.encode(f"{a}+1"), tok.encode(f"ANSWER: {a + 1}")) for a in range(3)]
        asked = []

        def abort():
            asked.append(1)
            return len(asked) > 2  # stop before the third step

        taken = []
        steps = team.runtime.warm_up_steps
        team.runtime.warm_up_steps = lambda name, n: taken.append(n) or steps(name, n)
        with pytest.raises(StepAbandoned, match="before step 3 of 5"):
            supervised_phase(team.runtime, "main", demos, w, seed=0, abort=abort, progress=False)
        assert taken == [1, 1] and team.runtime.worker.warmups == {}  # two steps taken; its optimizer is gone


def quickstart_warm(*overrides: str):
    from mas.config.schema import load_config
    from ray_helpers import REPO

    return load_config(REPO / "configs" / "quickstart.yaml",
                       ["logging.progress=false", "trainer.steps=1", "trainer.eval_size=0", "trainer.warmup.steps=4",
                        "trainer.warmup.episodes=4", "trainer.warmup.batch_size=2", *overrides])


@pytest.mark.parametrize("stop_at", [3, 6])  # in the first policy's warm-up; in the second's, the first done
def test_a_warm_up_stopped_part_way_resumes_from_its_next_step_as_if_never_stopped(tmp_path, stop_at):
    """A stop (Ctrl-C) between warm-up steps checkpoints the weights and where the warm-up stood
    (its AdamW moments and draw); the resumed run takes the remaining steps, and its losses and
    final weights are those of a run never stopped."""
    from safetensors.torch import load_file

    from mas.training.callbacks import RunControl
    from mas.training.team import build_team
    from mas.training.trainer import train

    whole, parted = tmp_path / "whole", tmp_path / "parted"
    with build_team(quickstart_warm()) as team:
        train(team, whole)
    control, taken = RunControl(), []
    with build_team(quickstart_warm()) as team:
        steps = team.runtime.warm_up_steps

        def counted(name, n):
            taken.append(name)
            if len(taken) == stop_at - 1:  # asked for at the next step's start
                control.request_stop("test", abandon=True)
            return steps(name, n)

        team.runtime.warm_up_steps = counted
        summary = train(team, parted, control=control)
    assert summary["stopped"]["after_step"] == -2 and "warmup" not in summary
    assert (parted / "checkpoints" / "latest").read_text() == "step_-00002"
    assert len(taken) == stop_at - 1
    with build_team(quickstart_warm()) as team:
        resumed_steps = team.runtime.warm_up_steps
        after = []
        team.runtime.warm_up_steps = lambda name, n: after.append(name) or resumed_steps(name, n)
        train(team, parted, resume=True)
    assert len(after) == 8 - (stop_at - 1)  # only the steps not taken before the stop
    a = json.loads((whole / "summary.json").read_text())["warmup"]["policies"]
    b = json.loads((parted / "summary.json").read_text())["warmup"]["policies"]
    assert set(a) == set(b) == {"planner", "workers"}
    for name in a:
        assert len(b[name]["losses"]) == 4
        assert max(abs(x - y) for x, y in zip(a[name]["losses"], b[name]["losses"])) < 1e-6, name
    for policy in ("planner", "workers"):
        wa = load_file(next((whole / "checkpoints" / "step_000000" / "policies" / policy).glob("*.safetensors")))
        wb = load_file(next((parted / "checkpoints" / "step_000000" / "policies" / policy).glob("*.safetensors")))
        assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6, policy
