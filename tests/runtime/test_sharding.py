"""Policies over two workers (Ray actors, gloo) take the one-worker update of the same batch.

``workers: 2`` (mas/runtime/data_parallel.py): two data-parallel replicas take the same step as
one worker.  ``sharding: fsdp`` (mas/runtime/sharding.py): a policy sharded over two workers
takes the one-worker update too, serves the rollout from rank 0's full copy, and its checkpoints
resume with any number of workers, sharded or not.  One module (one Ray instance, one
one-worker reference update) for both: every team here is compared with the same update.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from team_helpers import team_config

from mas.config.schema import validate_config
from mas.learning.learner import TrainSample
from mas.training.team import build_team


def samples() -> list[TrainSample]:
    """11 turns of different lengths (an odd count: the two shards differ in size)."""
    g = torch.Generator().manual_seed(0)
    return [TrainSample(torch.randint(5, 200, (7,), generator=g).tolist(), torch.randint(5, 200, (k,), generator=g).tolist(),
                        (-3 * torch.rand(k, generator=g)).tolist(), float(torch.randn(1, generator=g)), 1.0)
            for k in range(1, 12)]


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


def optimizer_of(ckpt):
    folder = ckpt / "learners" / "main"
    whole = folder / "optimizer_full.pt"
    return torch.load(whole if whole.exists() else folder / "optimizer.bin", weights_only=False)


def update_and_save(cfg: dict, out) -> tuple[dict, dict[str, torch.Tensor], list]:
    """One update of 'main' on ``samples()``; its metrics, the checkpointed weights, and a greedy rollout after it."""
    with build_team(validate_config(cfg)) as t:
        metrics = t.learners["main"].start_update(samples(), seed=3).result()
        t.backend.sync_weights("main")
        (out / "learners").mkdir(parents=True)
        t.runtime.save_policies(out, ["main"])
        greedy = [ep.answer for ep in t.engine.evaluate(t.env.eval_tasks(3), seed=0)]
    return metrics, weights_of(out / "policies" / "main"), greedy


@pytest.fixture(scope="module")
def one_worker(tiny_model_dir, tmp_path_factory):
    """The reference: the update of a full policy by one worker (local), checkpointed."""
    out = tmp_path_factory.mktemp("one-worker") / "run"
    return (out, *update_and_save(team(tiny_model_dir, 1, kind="local"), out))


@pytest.fixture(scope="module")
def full_runs(one_worker, tiny_model_dir, tmp_path_factory, ray_instance):
    """The same update of a full policy by one worker (local) and by two sharded workers, checkpointed."""
    root = tmp_path_factory.mktemp("sharding")
    return {"one": one_worker, "two": (root / "two", *update_and_save(team(tiny_model_dir, 2, "fsdp"), root / "two"))}


def rng_files(ckpt) -> list[str]:
    return sorted(p.name for p in (ckpt / "learners" / "main").glob("random_states_*.pkl"))


def test_two_workers_take_the_one_worker_step(one_worker, tiny_model_dir, tmp_path, ray_instance):
    """``workers: 2``, unsharded: each replica takes half the batch, the gradients are summed."""
    one, m1, w1, _ = one_worker
    m2, w2, _ = update_and_save(team(tiny_model_dir, 2), tmp_path / "two")
    assert rng_files(one) == ["random_states_0.pkl"]
    assert rng_files(tmp_path / "two") == ["random_states_0.pkl", "random_states_1.pkl"]  # RNG per worker
    assert m2["samples"] == m1["samples"] == 11 and m2["tokens"] == m1["tokens"]
    # the shards' gradients are summed in another order than one batch's: equal up to float
    # rounding (1e-6 on the loss and the gradient norm)
    for key in ("loss", "pg_loss", "grad_norm", "clip_frac", "entropy"):
        assert m2[key] == pytest.approx(m1[key], abs=1e-6), key
    # one AdamW step at lr 1e-2 moves a weight by up to ~1e-2 (about lr * sign(g) on a first step), so a
    # gradient entry near 0 turns rounding into up to ~1e-5 of weight; 1e-4 is 1% of the step
    w0 = load_file(tiny_model_dir / "model.safetensors")
    assert max((w1[k] - w0[k]).abs().max().item() for k in w1) > 5e-3  # the step really moved the weights
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4


def assert_same_update(one, two):
    _, m1, w1, g1 = one
    _, m2, w2, g2 = two
    assert m2["samples"] == m1["samples"] == 11 and m2["tokens"] == m1["tokens"]
    for key in ("loss", "pg_loss", "grad_norm", "clip_frac", "entropy", "mismatch_abs_mean"):
        assert m2[key] == pytest.approx(m1[key], abs=1e-6), key
    assert set(w1) == set(w2)
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4  # as data parallel: 1% of an AdamW step at lr 1e-2
    assert g2 == g1  # rank 0 serves the gathered weights: the same greedy rollout


def test_a_sharded_update_of_a_full_policy_equals_the_one_worker_update(full_runs):
    assert_same_update(full_runs["one"], full_runs["two"])


def test_a_sharded_update_of_a_lora_policy_equals_the_one_worker_update(tiny_model_dir, tmp_path, ray_instance):
    one = (None, *update_and_save(team(tiny_model_dir, 1, kind="local", lora=True), tmp_path / "one"))
    two = (None, *update_and_save(team(tiny_model_dir, 2, "fsdp", lora=True), tmp_path / "two"))
    assert_same_update(one, two)


def test_checkpoints_move_between_worker_counts(full_runs, tiny_model_dir, tmp_path):
    """Saved by 2 sharded workers: resumed by 1 (local) and by 2 again, the same weights and AdamW
    moments; and an unsharded run's checkpoint resumes sharded."""
    sharded, plain = full_runs["two"][0], full_runs["one"][0]
    assert (sharded / "learners" / "main" / "optimizer_full.pt").is_file()
    assert rng_files(sharded) == ["random_states_0.pkl", "random_states_1.pkl"]
    full = optimizer_of(sharded)
    names = list(full["state"])

    def load_save(t, ckpt, out):
        t.runtime.load_policies(ckpt, ["main"])
        (out / "learners").mkdir(parents=True)
        t.runtime.save_policies(out, ["main"])
        return weights_of(out / "policies" / "main"), optimizer_of(out)["state"]

    with build_team(validate_config(team(tiny_model_dir, 1, kind="local"))) as t:
        w_one, s_one = load_save(t, sharded, tmp_path / "as-one")
    with build_team(validate_config(team(tiny_model_dir, 2, "fsdp"))) as t:
        w_two, s_two = load_save(t, sharded, tmp_path / "as-two")
        w_back, s_back = load_save(t, plain, tmp_path / "plain-as-two")
    w_saved = weights_of(sharded / "policies" / "main")
    for w in (w_one, w_two):
        assert all(torch.equal(w[k], w_saved[k]) for k in w_saved)
    assert len(s_one) == len(names) and int(s_one[0]["step"]) == 1  # numbered by parameter, in the model's order
    for i, name in enumerate(names):
        assert torch.allclose(s_one[i]["exp_avg"], full["state"][name]["exp_avg"])
        assert torch.allclose(s_two[name]["exp_avg_sq"], full["state"][name]["exp_avg_sq"])
    w_plain, saved = weights_of(plain / "policies" / "main"), optimizer_of(plain)["state"]
    assert all(torch.equal(w_back[k], w_plain[k]) for k in w_plain)
    assert all(torch.allclose(s_back[name]["exp_avg"], saved[i]["exp_avg"]) for i, name in enumerate(names))
