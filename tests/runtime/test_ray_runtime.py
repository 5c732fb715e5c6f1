"""The Ray runtime on one machine: the same run as local, updates in parallel, faults, overlap."""

from __future__ import annotations

import json
import os
import signal

import torch
import yaml
from safetensors.torch import load_file
from team_helpers import dyad_config, team_config, varied_reward

from mas.training.checkpoint import latest_checkpoint, load_checkpoint
from mas.cli import main
from mas.models import sources
from mas.config.schema import PolicyConfig, ResourcesConfig, load_config, validate_config
from mas.runtime.ray_runtime import RayLearner, actor_groups
from mas.training.team import build_team
from mas.models.tiny import tiny_causal_lm
from mas.training.trainer import train, train_step
from mas.types import StepAbandoned
from ray_helpers import REPO

QUICKSTART = REPO / "configs" / "quickstart.yaml"


def quickstart(kind: str, *overrides: str):
    return load_config(QUICKSTART, [f"runtime.kind={kind}", "runtime.num_threads=1", "logging.progress=false", *overrides])


def test_actor_groups_key_policies_by_their_resolved_weights(tiny_model_dir, monkeypatch):
    """A short name and the path of its file are one model, so their LoRA adapters and a frozen
    policy on it share one actor (one base in memory); so are two spellings of one folder."""
    path = str(sources.gguf_file("smollm2-135m-instruct"))
    monkeypatch.chdir(tiny_model_dir.parent)
    policies = {
        "a": PolicyConfig(kind="lora", model="smollm2-135m-instruct"),
        "b": PolicyConfig(kind="lora", model=path),
        "judge": PolicyConfig(kind="frozen", model=path),
        "own": PolicyConfig(kind="full", model="smollm2-135m-instruct"),
        "placed": PolicyConfig(kind="frozen", model=path, resources=ResourcesConfig(num_cpus=2)),  # placed elsewhere
        "bf16": PolicyConfig(kind="lora", model=path, dtype="bfloat16"),
        "tiny": PolicyConfig(kind="lora", model=f"./{tiny_model_dir.name}"),
        "tiny_abs": PolicyConfig(kind="frozen", model=str(tiny_model_dir)),
    }
    assert actor_groups(policies) == [["a", "b", "judge"], ["own"], ["placed"], ["bf16"], ["tiny", "tiny_abs"]]


def metric_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("time")  # wall times differ; everything else is determined by the seed
        r.pop("memory")  # so do the processes' memory (the Ray run's includes its actors')
    return rows


def max_diff(a, b, path: str = "") -> float:
    """Largest absolute difference between two metric records (structure and non-floats must match)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        return max([max_diff(a[k], b[k], f"{path}.{k}") for k in a], default=0.0)
    if isinstance(a, list):
        assert len(a) == len(b), path
        return max([max_diff(x, y, path) for x, y in zip(a, b)], default=0.0)
    if isinstance(a, float):
        return abs(a - b)
    assert a == b, path
    return 0.0


def weights(run_dir, step: int, policy: str) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "policies" / policy / "model.safetensors")


def test_ray_repeats_the_local_run_and_either_runtime_resumes_the_other(tmp_path, ray_instance):
    """The quickstart team, 3 steps, same seed.  Sampling is seeded per (batch, policy) in both
    runtimes and each actor runs one torch thread as the driver does, so the runs are expected to
    be bit-equal; the stated tolerance is 1e-6 (max abs) on every metric and weight.  The Ray run
    stops after 2 steps and the local runtime resumes it from the Ray actors' checkpoint."""
    extra = ("trainer.steps=3", "trainer.eval_size=0", "trainer.save_every=1")
    local, ray_run = tmp_path / "local", tmp_path / "ray"
    with build_team(quickstart("local", *extra)) as team:
        train(team, local)
    with build_team(quickstart("ray", *extra)) as team:
        where = team.runtime.describe()
        train(team, ray_run, stop_after=2)
    with build_team(quickstart("local", *extra)) as team:
        train(team, ray_run, resume=True)

    pids = {where[p]["actor"]["pid"] for p in ("planner", "workers")}
    assert len(pids) == 2 and os.getpid() not in pids  # each policy in its own actor process
    a, b = metric_rows(local), metric_rows(ray_run)
    assert [r["step"] for r in b] == [0, 1, 2] and a[0]["policies"]["planner"]["loss"] != 0.0
    assert max(max_diff(x, y) for x, y in zip(a, b)) < 1e-6
    for step in (1, 2):  # step 1 written by the Ray actors, step 2 by the local runtime after resuming
        for policy in ("planner", "workers"):
            wa, wb = weights(local, step, policy), weights(ray_run, step, policy)
            assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6, (step, policy)


def test_updates_of_two_policies_run_at_the_same_time_in_two_processes(tmp_path, ray_instance, tiny_tokenizer):
    """Two CPU-bound policies (each update: 4 epochs over 32 turns): their actors' update
    intervals, as recorded by the actors, overlap.  (Speed is measured in bench/, not here.)"""
    model = tmp_path / "model"
    tiny_causal_lm(tiny_tokenizer, hidden_size=128, num_layers=4, seed=0).save_pretrained(model)
    tiny_tokenizer.save_pretrained(model)
    cfg = dyad_config(model, {"method": "grpo"}, batch_size=4, group_size=8, ppo_epochs=4)
    cfg["runtime"] = {"kind": "ray", "num_threads": 1}
    with build_team(validate_config(cfg)) as team:
        team.engine.score = varied_reward
        spans = train_step(team, 0).spans
    think, solve = spans["think"], spans["solve"]
    assert think.pid != solve.pid and os.getpid() not in (think.pid, solve.pid)
    assert max(think.start, solve.start) < min(think.end, solve.end)  # the intervals overlap


def test_a_lora_policy_and_a_frozen_one_on_its_model_spelled_otherwise_train_in_one_actor(tiny_model_dir, tmp_path,
                                                                                           ray_instance):
    link = tmp_path / "same-model"
    link.symlink_to(tiny_model_dir, target_is_directory=True)
    cfg = team_config(tiny_model_dir, "chain")
    cfg["policies"]["main"] = {"kind": "lora", "model": str(link), "device": "cpu",
                               "lora": {"r": 4, "alpha": 8}, "optim": {"lr": 1e-2, "micro_batch_size": 4}}
    cfg["runtime"] = {"kind": "ray", "num_threads": 1}
    with build_team(validate_config(cfg)) as team:
        team.engine.score = varied_reward
        groups = team.runtime.by_policy
        assert groups["main"] is groups["judge"] and len(team.runtime.groups) == 1  # one process, one base
        spans = train_step(team, 0).spans
    assert set(spans) == {"main"} and spans["main"].pid == groups["main"].where[0]["pid"]


def tiny_run(model_dir, tmp_path, **runtime) -> tuple:
    cfg = team_config(model_dir, "chain", trainer={"steps": 3, "batch_size": 2, "group_size": 2, "eval_size": 0,
                                                   "save_every": 1, "sample_episodes": 1},
                      runtime={"kind": "ray", "num_threads": 1, **runtime})
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, tmp_path / "run"


def kill_during_step(monkeypatch, step: int) -> list[int]:
    """SIGKILL the 'main' actor's process right after its update of ``step`` was started."""
    real, killed, calls = RayLearner.start_update, [], []

    def start_update(self, samples, seed=None, abort=None):
        handle = real(self, samples, seed)
        calls.append(self.name)
        if self.name == "main" and calls.count("main") == step + 1:
            pid = self.group.where[0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return handle

    monkeypatch.setattr(RayLearner, "start_update", start_update)
    return killed


def test_a_killed_actor_stops_the_run_naming_policy_and_node_and_resume_finishes(tiny_model_dir, tmp_path, ray_instance,
                                                                                 monkeypatch, capsys):
    path, run = tiny_run(tiny_model_dir, tmp_path)
    killed = kill_during_step(monkeypatch, step=1)
    assert main(["train", str(path), "--run-dir", str(run)]) == 3
    err = capsys.readouterr().err
    assert killed and "policy 'main'" in err and f"pid {killed[0]}" in err and "node " in err and "died" in err
    assert "Ray's reason:" in err and f"mas train --resume {run}" in err
    ckpt = latest_checkpoint(run)
    assert ckpt.name == "step_000000"  # step 1 never completed; step 0's checkpoint is intact
    local = validate_config({**yaml.safe_load(path.read_text()), "runtime": {"kind": "local"}})
    with build_team(local) as team:
        assert load_checkpoint(ckpt, team)["step"] == 0  # loads (into the local runtime, even)

    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0  # new actors in the same cluster
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_restart_actors_restores_the_dead_actor_from_the_checkpoint_and_repeats_the_step(tiny_model_dir, tmp_path,
                                                                                          ray_instance, monkeypatch):
    path, run = tiny_run(tiny_model_dir, tmp_path, restart_actors=True)
    killed = kill_during_step(monkeypatch, step=1)
    assert main(["train", str(path), "--run-dir", str(run)]) == 0
    assert killed
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 1 repeated once, logged once
    warnings = [json.loads(line) for line in (run / "warnings.jsonl").read_text().splitlines()]
    assert [w["kind"] for w in warnings] == ["actor_restart"] and "policy 'main'" in warnings[0]["message"]


def test_overlapped_rollouts_sample_weights_one_update_old_and_the_quickstart_still_learns(tmp_path, ray_instance):
    """max_staleness 1 on the quickstart team: step t+1's rollout runs during step t's updates.
    Every trained turn's weights are the current ones or one update behind (after step 0
    exactly one), each policy's step metrics report the staleness seen, and training still
    improves held-out accuracy: greedy team accuracy on 100 held-out tasks goes from 0.55 to
    0.92 in 24 steps (seed 0; the run is deterministic, since the updates draw no random numbers
    and sampling is seeded per batch).  The test asks for a gain of at least 0.2; the
    orchestrator learns to route between steps 19 and 23, so fewer steps would not show it."""
    run = tmp_path / "run"
    cfg = quickstart("ray", "trainer.max_staleness=1", "trainer.steps=24", "trainer.eval_size=100",
                     "trainer.sample_episodes=4", "logging.episodes_every=1")
    with build_team(cfg) as team:
        summary = train(team, run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line and '"eval"' not in line]
    assert [r["step"] for r in rows] == list(range(24))
    for r in rows:
        for name, p in r["policies"].items():
            assert p["staleness_max"] == (0.0 if r["step"] == 0 else 1.0), (r["step"], name)
        if r["step"] < len(rows) - 1:  # every step but the last took the next step's rollout
            assert r["time"]["rollout_overlapped"] > 0
    for line in (run / "episodes.jsonl").read_text().splitlines():
        ep = json.loads(line)
        sampled = {t["weight_version"] for t in ep["turns"]}
        assert sampled <= {max(ep["step"] - 1, 0)}, (ep["step"], sampled)  # the weights before step t-1's update
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    assert after >= before + 0.2, (before, after)


def test_the_warm_up_in_ray_actors_takes_the_local_warm_ups_steps_and_a_stop_between_them(ray_instance):
    """The warm-up's steps come one call at a time (the driver's bar and stop): in actors the
    losses are those of the local runtime, and a stop asked between steps ends it there."""
    from mas.training.warmup import warm_up

    extra = ("trainer.warmup.steps=3", "trainer.warmup.episodes=4", "trainer.warmup.batch_size=2", "trainer.eval_size=0")
    records = {}
    asked = []
    with build_team(quickstart("local", *extra)) as team:
        records["local"] = warm_up(team, lambda _: None)
    with build_team(quickstart("ray", *extra)) as team:  # one team of actors for both (starting them is most of the time)
        records["ray"] = warm_up(team, lambda _: None)
        try:  # a second warm-up of the same actors, stopped between its steps
            warm_up(team, lambda _: None, abort=lambda: asked.append(1) or len(asked) > 1)
        except StepAbandoned as e:
            assert "before step 2 of 3" in str(e)
        else:
            raise AssertionError("the stop was not seen between the warm-up's steps")
    for name, got in records["local"]["policies"].items():
        assert len(got["losses"]) == 3
        assert max(abs(a - b) for a, b in zip(got["losses"], records["ray"]["policies"][name]["losses"])) < 1e-6, name
