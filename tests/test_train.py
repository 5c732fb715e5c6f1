"""End-to-end training on tiny random models: every topology, LoRA isolation, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from team_helpers import team_config, varied_reward

from mas.config.schema import validate_config
from mas.training.team import build_team
from mas.training.trainer import train, train_step


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before: dict, module: torch.nn.Module) -> list[str]:
    return [k for k, v in module.state_dict().items() if not torch.equal(before[k], v)]


def build(cfg: dict):
    team = build_team(validate_config(cfg))
    team.engine.score = varied_reward
    return team


@pytest.mark.parametrize("topology", ["orchestrator", "debate", "chain", "graph"])
def test_three_steps_change_trainable_policies_only(tiny_model_dir, tmp_path, topology):
    team = build(team_config(tiny_model_dir, topology))
    main, judge = snapshot(team.policies["main"].model), snapshot(team.policies["judge"].model)
    train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        loss = r["policies"]["main"]["loss"]
        assert math.isfinite(loss) and r["policies"]["main"]["samples"] > 0
    assert set(team.learners) == {"main"}  # frozen policies get no learner
    assert len(changed(main, team.policies["main"].model)) == len(main)  # every tensor moved
    assert changed(judge, team.policies["judge"].model) == []  # frozen: bit-identical
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_000002"
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "policies" / "main" / "config.json").exists()


class FailsAfterSpeaking:
    """The team's own topology, whose code then raises in the first episode of every group (say, on
    structured output that does not parse): the episode fails with agent_error, its turns recorded."""

    def __init__(self, topology):
        self.topology = topology

    async def run(self, ctx):
        outcome = await self.topology.run(ctx)
        if ctx.episode.sample_id == 0:
            raise ValueError("the reply is not the JSON the team expected")
        return outcome

    def __getattr__(self, name):
        return getattr(self.topology, name)


@pytest.mark.parametrize("train_failed", [(), ("agent_error",), ("model_call_limit",)])
def test_train_failed_trains_the_turns_of_failed_episodes_it_lists_at_reward_zero(tiny_model_dir, train_failed):
    """trainer.train_failed: a failed episode's turns go into the update (with the credit's advantage for
    its reward of 0) only where the list names its failure; every failed episode counts at 0 in the
    credit's statistics either way, and the step counts the ones trained."""
    from mas.training.metrics import episode_record
    from mas.training.trainer import training_batches

    cfg = team_config(tiny_model_dir, "chain")
    cfg["trainer"].update(train_failed=list(train_failed), batch_size=2, group_size=3)
    team = build(cfg)
    team.engine.score = lambda ep: 1.0  # every episode that ends answers right: the failed ones alone score 0
    team.engine.topology = FailsAfterSpeaking(team.engine.topology)
    step = train_step(team, 0)
    failed = [ep for g in step.groups for ep in g.episodes if ep.status == "error"]
    assert [ep.sample_id for ep in failed] == [0, 0] and {ep.info["failure"] for ep in failed} == {"agent_error"}
    assert all(ep.reward == 0.0 and ep.turns for ep in failed)
    trained = "agent_error" in train_failed
    main_turns = lambda eps: sum(t.policy == "main" and bool(t.completion_ids) for ep in eps for t in ep.turns)
    ok = [ep for g in step.groups for ep in g.episodes if ep.status != "error"]
    assert step.metrics["policies"]["main"]["samples"] == main_turns(ok) + (main_turns(failed) if trained else 0)
    if train_failed:
        assert step.metrics["failed_episodes_trained"] == (2 if trained else 0)
    else:
        assert "failed_episodes_trained" not in step.metrics  # off by default: nothing counted
    record = episode_record(0, failed[0], [0.0] * len(failed[0].turns))
    assert record["failure"] == "agent_error" and record["status"] == "error"  # what episodes.jsonl shows
    samples, _ = training_batches(team, step.groups, step.credit, team.learners)
    advantages = sorted({round(s.advantage, 6) for s in samples["main"]})
    # the group's mean reward is 2/3: an answering episode's turns are pushed up, a failed one's down
    assert (advantages[0] < 0) == trained and advantages[-1] > 0


def lora_config(model_dir) -> dict:
    cfg = team_config(model_dir, "chain", frozen_checker=False)
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    cfg["policies"] = {
        "alpha": {"kind": "lora", "model": str(model_dir), "device": "cpu", "lora": lora, "optim": {"lr": 1e-2}},
        "beta": {"kind": "lora", "model": str(model_dir), "device": "cpu", "lora": lora, "optim": {"lr": 1e-2}},
    }
    cfg["agents"][0]["policy"] = "alpha"
    cfg["agents"][1]["policy"] = "beta"
    cfg["agents"][2]["policy"] = "beta"
    return cfg


def test_lora_step_on_agent_a_leaves_b_and_the_base_unchanged(tiny_model_dir):
    team = build(lora_config(tiny_model_dir))
    peft_model = team.policies["alpha"].model
    assert team.policies["beta"].model is peft_model  # one base, two adapters
    before = snapshot(peft_model)
    del team.learners["beta"]  # a step that only updates agent A's adapter
    train_step(team, 0)
    moved = changed(before, peft_model)
    assert moved and all(".lora_" in k and ".alpha." in k for k in moved)
    b_lora = [k for k in before if ".beta." in k]
    assert b_lora and not set(b_lora) & set(moved)  # B's adapter untouched
    # LoRA starts with lora_B = 0, so the first step moves every lora_B of A (lora_A's gradient is 0)
    assert sorted(k for k in moved if "lora_B" in k) == sorted(k for k in before if "lora_B.alpha." in k)


def test_lora_policies_train_independently(tiny_model_dir):
    team = build(lora_config(tiny_model_dir))
    before = snapshot(team.policies["alpha"].model)
    train_step(team, 0)
    moved = changed(before, team.policies["alpha"].model)
    assert any(".alpha." in k for k in moved) and any(".beta." in k for k in moved)
    assert all(".lora_" in k for k in moved)  # the shared base never changes


def metric_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("time", None)
        r.pop("memory", None)  # the processes' resident memory differs run to run
    return rows


def assert_close(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float):
        assert abs(a - b) <= 1e-6, f"{path}: {a} != {b}"
    else:
        assert a == b, path


@pytest.mark.parametrize("topology,credit", [
    ("orchestrator", {"method": "dr_mas"}),
    ("chain", {"method": "ccpo", "version": "v1", "min_samples": 2}),  # keeps a history across steps
])
def test_resume_reproduces_a_straight_run(tiny_model_dir, tmp_path, topology, credit):
    cfg = team_config(tiny_model_dir, topology, trainer={"steps": 6, "batch_size": 2, "group_size": 4, "eval_size": 0},
                      runtime={"deterministic": True}, credit=credit)
    try:
        straight = tmp_path / "straight"
        train(build(cfg), straight)
        resumed = tmp_path / "resumed"
        train(build(cfg), resumed, stop_after=3)
        assert len(metric_rows(resumed)) == 3
        from mas.credit import get_credit

        state = get_credit(credit["method"]).state
        if state is not None:
            state.reset()  # a fresh process starts with none of the in-memory credit state
        train(build(cfg), resumed, resume=True)  # a fresh process would do exactly this
        assert torch.are_deterministic_algorithms_enabled()  # runtime.deterministic took effect
    finally:
        torch.use_deterministic_algorithms(False)
    a, b = metric_rows(straight), metric_rows(resumed)
    assert not (resumed / "config.1.yaml").exists() and not (resumed / "run_info.1.json").exists()  # resumed unchanged
    assert [r["step"] for r in b] == list(range(6))
    # the steps after the resume really train (a step whose groups all tie has loss 0: not all three)
    assert any(a[k]["policies"]["main"]["loss"] != 0.0 for k in (3, 4, 5))
    for ra, rb in zip(a, b):
        assert_close(ra, rb)


def test_a_resume_that_changes_the_config_keeps_the_earlier_segments_config(tiny_model_dir, tmp_path):
    """A run resumed with overrides (more steps here; a worker count or a sharding in practice)
    writes the new config.yaml and keeps the one the earlier steps ran with as config.1.yaml."""
    import yaml

    cfg = team_config(tiny_model_dir, "chain", trainer={"steps": 1, "batch_size": 2, "group_size": 2, "eval_size": 0})
    train(build(cfg), tmp_path)
    cfg["trainer"]["steps"] = 2
    train(build(cfg), tmp_path, resume=True)
    assert yaml.safe_load((tmp_path / "config.1.yaml").read_text())["trainer"]["steps"] == 1
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["steps"] == 2
    assert [r["step"] for r in metric_rows(tmp_path)] == [0, 1]
    cfg["trainer"]["steps"] = 3
    train(build(cfg), tmp_path, resume=True)
    assert yaml.safe_load((tmp_path / "config.2.yaml").read_text())["trainer"]["steps"] == 2


def test_checkpoint_restores_rng_state_and_data_cursor(tiny_model_dir, tmp_path):
    from mas.training.checkpoint import load_checkpoint, save_checkpoint

    team = build(team_config(tiny_model_dir, "chain"))
    team.env.sample_tasks(3)
    torch.manual_seed(123)
    save_checkpoint(tmp_path, 0, team, {})
    expected_draw, expected_tasks = torch.rand(3), team.env.sample_tasks(2)
    torch.manual_seed(999)
    team.env.sample_tasks(5)
    load_checkpoint(tmp_path / "checkpoints" / "step_000000", team)
    assert torch.equal(torch.rand(3), expected_draw)
    assert [t.task_id for t in team.env.sample_tasks(2)] == [t.task_id for t in expected_tasks]


def test_turns_a_method_masks_out_are_not_trained(tiny_model_dir, monkeypatch):
    import mas.training.trainer
    from mas.types import Credit

    team = build(team_config(tiny_model_dir, "chain"))
    real = mas.training.trainer.run_credit

    def masked(batch, cfg, results):
        credit = real(batch, cfg, results)
        keep = torch.tensor([batch.agent_names[a] == "lead" for a in batch.agent_ids.tolist()])  # only the lead's turns
        return Credit(credit.advantages, credit.breakdown, train_mask=keep)

    monkeypatch.setattr(mas.training.trainer, "run_credit", masked)
    metrics = train_step(team, 0).metrics
    lead_turns = metrics["agents"]["lead"]["turns"]
    assert metrics["policies"]["main"]["samples"] == lead_turns  # helper's turns (same policy) were left out


def test_constant_groups_are_dropped_from_the_update_and_counted(tiny_model_dir):
    """trainer.drop_constant_groups: groups whose episodes all scored the same train nothing, and the
    step counts them; groups with varied rewards still train."""
    cfg = team_config(tiny_model_dir, "chain")
    cfg["trainer"].update(drop_constant_groups=True, batch_size=2, group_size=4)
    team = build(cfg)
    team.engine.score = lambda ep: 0.0  # every group constant
    step = train_step(team, 0)
    assert step.metrics["constant_groups_dropped"] == 2 and not bool(step.credit.train_mask.any())
    assert step.metrics["policies"]["main"]["samples"] == 0
    team.engine.score = varied_reward
    step = train_step(team, 1)
    constant = sum(len({ep.reward for ep in g.episodes}) == 1 for g in step.groups)
    assert step.metrics["constant_groups_dropped"] == constant < 2
    assert step.metrics["policies"]["main"]["samples"] > 0
    off = build(team_config(tiny_model_dir, "chain"))
    assert "constant_groups_dropped" not in train_step(off, 0).metrics  # off by default: nothing counted
