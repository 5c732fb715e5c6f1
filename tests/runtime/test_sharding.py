"""sharding: fsdp (mas/runtime/sharding.py): a policy sharded over two workers (Ray actors, gloo)
takes the one-worker update of the same batch, serves the rollout from rank 0's full copy, and its
checkpoints resume with any number of workers, sharded or not."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from team_helpers import team_config
from test_data_parallel import samples

from mas.config.schema import validate_config
from mas.training.team import build_team


def team(model_dir, workers: int, sharding: str = "none", kind: str = "ray", lora: bool = False) -> dict:
    cfg = team_config(model_dir, "chain", runtime={"kind": kind, "num_threads": 1})
    main = cfg["policies"]["main"]
    main.update(workers=workers, sharding=sharding)
    if lora:
        main.update(kind="lora", lora={"r": 4, "target_modules": ["q_proj", "v_proj"]})
    return cfg


def weights_of(folder) -> dict[str, torch.Tensor]:
    name = "adapter_model.safetensors" if (folder / "adapter_model.safetensors").exists() else "model.safetensors"
    return load_file(folder / name)


def update_and_save(cfg: dict, out) -> tuple[dict, dict[str, torch.Tensor], list]:
    """One update of 'main' on ``samples()``; its metrics, the checkpointed weights, and a rollout after it."""
    with build_team(validate_config(cfg)) as t:
        metrics = t.learners["main"].start_update(samples(), seed=3).result()
        t.backend.sync_weights("main")
        (out / "learners").mkdir(parents=True)
        t.runtime.save_policies(out, ["main"])
        greedy = [ep.answer for ep in t.engine.evaluate(t.env.eval_tasks(3), seed=0)]
    return metrics, weights_of(out / "policies" / "main"), greedy


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_sharded_update_equals_the_one_worker_update(tiny_model_dir, tmp_path, ray_instance, lora):
    m1, w1, g1 = update_and_save(team(tiny_model_dir, 1, kind="local", lora=lora), tmp_path / "one")
    m2, w2, g2 = update_and_save(team(tiny_model_dir, 2, "fsdp", lora=lora), tmp_path / "sharded")
    assert m2["samples"] == m1["samples"] == 11 and m2["tokens"] == m1["tokens"]
    for key in ("loss", "pg_loss", "grad_norm", "clip_frac", "entropy", "mismatch_abs_mean"):
        assert m2[key] == pytest.approx(m1[key], abs=1e-6), key
    assert set(w1) == set(w2)
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4  # as data parallel: 1% of an AdamW step at lr 1e-2
    assert g2 == g1  # rank 0 serves the gathered weights: the same greedy rollout


def test_a_sharded_checkpoint_resumes_with_one_worker_and_back(tiny_model_dir, tmp_path, ray_instance):
    """Saved by 2 sharded workers, resumed by 1 (local) and by 2 again: the same weights and AdamW
    moments; and an unsharded run's checkpoint resumes sharded."""
    sharded = tmp_path / "sharded"
    update_and_save(team(tiny_model_dir, 2, "fsdp"), sharded)
    assert (sharded / "learners" / "main" / "optimizer_full.pt").is_file()
    assert sorted(p.name for p in (sharded / "learners" / "main").glob("random_states_*.pkl")) == [
        "random_states_0.pkl", "random_states_1.pkl"]

    def moments_after_load(cfg, ckpt, out) -> tuple[dict, dict]:
        with build_team(validate_config(cfg)) as t:
            t.runtime.load_policies(ckpt, ["main"])
            (out / "learners").mkdir(parents=True)
            t.runtime.save_policies(out, ["main"])
        opt = out / "learners" / "main"
        state = torch.load(opt / ("optimizer_full.pt" if (opt / "optimizer_full.pt").exists() else "optimizer.bin"),
                           weights_only=False)
        return weights_of(out / "policies" / "main"), state

    w_one, s_one = moments_after_load(team(tiny_model_dir, 1, kind="local"), sharded, tmp_path / "as-one")
    w_two, s_two = moments_after_load(team(tiny_model_dir, 2, "fsdp"), sharded, tmp_path / "as-two")
    w_saved = weights_of(sharded / "policies" / "main")
    for w in (w_one, w_two):
        assert all(torch.equal(w[k], w_saved[k]) for k in w_saved)
    full = torch.load(sharded / "learners" / "main" / "optimizer_full.pt", weights_only=False)
    names = list(full["state"])
    one = s_one["state"]  # numbered by parameter, in the model's order
    assert len(one) == len(names) and int(one[0]["step"]) == 1
    for i, name in enumerate(names):
        assert torch.allclose(one[i]["exp_avg"], full["state"][name]["exp_avg"])
        assert torch.allclose(s_two["state"][name]["exp_avg_sq"], full["state"][name]["exp_avg_sq"])
    # and the other way: an unsharded checkpoint into two sharded workers
    plain = tmp_path / "plain"
    update_and_save(team(tiny_model_dir, 1, kind="local"), plain)
    w_back, s_back = moments_after_load(team(tiny_model_dir, 2, "fsdp"), plain, tmp_path / "plain-as-two")
    w_plain = weights_of(plain / "policies" / "main")
    assert all(torch.equal(w_back[k], w_plain[k]) for k in w_plain)
    saved = torch.load(plain / "learners" / "main" / "optimizer.bin", weights_only=False)["state"]
    assert all(torch.allclose(s_back["state"][name]["exp_avg"], saved[i]["exp_avg"]) for i, name in enumerate(names))
