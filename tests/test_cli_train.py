"""`mas train`, `mas train --resume` and `mas eval` through the command line entry point."""

from __future__ import annotations

import json

import pytest
import yaml
from team_helpers import team_config, varied_reward

from mas.cli import main


def write_config(tmp_path, model_dir, **sections):
    cfg = team_config(model_dir, "orchestrator", **sections)
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_writes_a_complete_run_directory(tmp_path, tiny_model_dir, capsys):
    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=2", "trainer.eval_size=4", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "held-out team accuracy: before" in out and str(run) in out
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["trainer"]["steps"] == 2 and resolved["policies"]["main"]["optim"]["micro_batch_size"] == 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    assert [r["step"] for r in steps] == [0, 1] and {r["eval"] for r in rows if "eval" in r} == {"before", "after"}
    m = steps[0]
    assert set(m["agents"]["lead"]) >= {"reward", "credit_share", "advantage", "turns", "invalid", "parse_failures",
                                        "completion_tokens", "tool_calls"}
    assert set(m["policies"]["main"]) >= {"loss", "kl", "grad_norm", "clip_frac", "entropy", "lr", "tokens"}
    assert set(m["time"]) == {"rollout", "credit", "credit_replays", "credit_interventions", "credit_critic",
                              "credit_assign", "update", "update/main", "sync", "step"} and m["tokens"] > 0
    assert 0 < m["time"]["update/main"] <= m["time"]["update"]  # the policy's own update, inside the phase
    assert m["policies"]["main"]["staleness_max"] == 0.0  # every rollout used the newest weights
    shares = [a["credit_share"] for a in m["agents"].values()]
    assert sum(shares) == pytest.approx(1.0) if m["advantage"]["max"] > 0 else shares == [None] * len(shares)
    info = json.loads((run / "run_info.json").read_text())
    assert info["policies"]["main"]["parameters"] > 0 and info["credit"]["method"] == resolved["credit"]["method"]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all("credit" in t and "text" in t for t in episodes[0]["turns"])
    ckpt = run / "checkpoints" / "step_000001" / "policies" / "main"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "tokenizer.json").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary) == {"eval_before", "eval_after", "held_out"}  # held_out: the phases, RL's gain from its start

    assert main(["eval", str(cfg), "--checkpoint", str(run), "--size", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 3 and 0.0 <= result["accuracy"] <= 1.0


def test_resume_continues_from_the_last_checkpoint(tmp_path, tiny_model_dir):
    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=4", "--run-dir", str(run), "--stop-after", "2"]) == 0
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"
    assert main(["train", "--resume", str(run)]) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    assert (run / "checkpoints" / "latest").read_text() == "step_000003"


def test_train_reports_config_errors_without_a_traceback(tmp_path, tiny_model_dir, capsys):
    cfg = write_config(tmp_path, tiny_model_dir)
    assert main(["train", str(cfg), "trainer.stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "trainer.stepz" in err and "steps" in err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2


def test_bad_models_devices_and_checkpoints_give_a_message_not_a_traceback(tmp_path, tiny_model_dir, capsys):
    cfg = write_config(tmp_path, tiny_model_dir)
    assert main(["train", str(cfg), f"policies.main.model={tmp_path / 'missing'}"]) == 2
    assert "policies.main.model: local path does not exist" in capsys.readouterr().err  # before anything loads
    assert main(["train", str(cfg), "policies.main.device=cuda:7"]) == 2 or __import__("torch").cuda.is_available()
    assert main(["train", str(cfg), "policies.main.kind=lora", "policies.main.lora.target_modules=[nope]"]) == 2
    assert "cannot add a LoRA adapter" in capsys.readouterr().err
    assert main(["eval", str(cfg), "--checkpoint", str(tmp_path / "nowhere"), "--size", "2"]) == 2
    assert "no policy weights" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(cfg.read_text())
    assert main(["train", "--resume", str(tmp_path / "run")]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_step_metrics_are_written_as_tensorboard_scalars(tmp_path, tiny_model_dir, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mas.envs.math.synthetic import SyntheticMathEnv

    monkeypatch.setattr(SyntheticMathEnv, "score", lambda self, ep: varied_reward(ep))  # credit to share
    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=2", "--run-dir", str(run)]) == 0
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"reward/team", "agents/lead/reward", "agents/lead/credit_share", "agents/lead/advantage/mean",
            "agents/lead/advantage/std", "agents/lead/parse_failures", "agents/lead/completion_tokens",
            "policies/main/loss", "policies/main/kl", "policies/main/clip_frac", "policies/main/entropy",
            "policies/main/grad_norm", "policies/main/lr", "time/rollout", "time/credit", "time/credit_assign",
            "time/update", "time/sync", "credit_cost/extra_generations"} <= tags
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "step" in json.loads(line)]
    logged = [(e.step, e.value) for e in events.Scalars("policies/main/loss")]
    assert [s for s, _ in logged] == [0, 1]
    assert [v for _, v in logged] == [pytest.approx(r["policies"]["main"]["loss"], abs=1e-6) for r in rows]


def test_an_eval_size_larger_than_the_held_out_split_is_a_clear_error(tmp_path, tiny_model_dir, capsys):
    from mas.cli import main as mas

    cfg = team_config(tiny_model_dir, "chain", env={"name": "gsm8k", "source": "sample"})
    cfg["trainer"]["eval_size"] = 500  # the shipped GSM8K sample holds out 100 problems
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert mas(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "trainer.eval_size: 500 is too many" in err and "has 100" in err
    assert mas(["eval", str(path), "--size", "101"]) == 2
    assert "--size: 101 is too many" in capsys.readouterr().err
    assert mas(["eval", str(path), "trainer.eval_size=0", "--size", "2"]) == 0


def test_resume_after_a_crash_leaves_no_duplicate_steps_in_the_logs(tmp_path, tiny_model_dir):
    """Steps logged after the last checkpoint are dropped from metrics.jsonl and TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=4", "trainer.save_every=1", "--run-dir", str(run), "--stop-after", "2"]) == 0
    (run / "checkpoints" / "latest").write_text("step_000000")  # as if it crashed after logging step 1
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "rew')  # and half-wrote a line
    assert main(["train", "--resume", str(run)]) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/team")] == [0, 1, 2, 3]


def test_a_run_stopped_after_its_warm_up_resumes_without_warming_up_again(tmp_path, tiny_model_dir, monkeypatch):
    import mas.training.trainer as trainer

    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"agent": "lead", "messages": [{"role": "user", "content": f"{a}+1"}],
                                         "completion": f"ANSWER: {a + 1}"}) + "\n" for a in range(4)))
    cfg = write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    warm = ["trainer.warmup.steps=2", "trainer.warmup.batch_size=2", f"trainer.warmup.demonstrations={demos}"]
    assert main(["train", str(cfg), "trainer.steps=2", *warm, "--run-dir", str(run), "--stop-after", "0"]) == 0
    assert (run / "checkpoints" / "latest").read_text() == "step_-00001"  # the warm-up's weights, before step 0
    warmed = json.loads((run / "checkpoints" / "step_-00001" / "trainer_state.json").read_text())["summary"]["warmup"]

    def again(*a, **k):
        raise AssertionError("the resumed run warmed up again")

    monkeypatch.setattr(trainer, "warm_up", again)
    assert main(["train", "--resume", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["warmup"] == warmed
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("kind") == "step"] == [0, 1]
    assert sum(r.get("kind") == "warmup" for r in rows) == 1
