"""workers: 2 (two actors, gloo) takes the same update as one worker on the same batch."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from team_helpers import team_config

from mas.config.schema import validate_config
from mas.training.learner import TrainSample
from mas.training.team import build_team


def samples() -> list[TrainSample]:
    """11 turns of different lengths (an odd count: the two shards differ in size)."""
    g = torch.Generator().manual_seed(0)
    return [TrainSample(torch.randint(5, 200, (7,), generator=g).tolist(), torch.randint(5, 200, (k,), generator=g).tolist(),
                        (-3 * torch.rand(k, generator=g)).tolist(), float(torch.randn(1, generator=g)), 1.0)
            for k in range(1, 12)]


def one_update(model_dir, kind: str, workers: int, tmp_path) -> tuple[dict, dict[str, torch.Tensor], list[str]]:
    """Metrics and new weights of one update of 'main' on ``samples()``, and the RNG files it checkpoints."""
    cfg = team_config(model_dir, "chain", runtime={"kind": kind, "num_threads": 1})
    cfg["policies"]["main"]["workers"] = workers
    with build_team(validate_config(cfg)) as team:
        metrics = team.learners["main"].start_update(samples(), seed=3).result()
        out = tmp_path / f"{kind}-{workers}"
        (out / "learners").mkdir(parents=True)
        team.runtime.save_policies(out, ["main"])
        weights = load_file(out / "policies" / "main" / "model.safetensors")
        rng_files = sorted(p.name for p in (out / "learners" / "main").glob("random_states_*.pkl"))
    return metrics, weights, rng_files


def test_two_workers_take_the_one_worker_step(tiny_model_dir, tmp_path, ray_instance):
    m1, w1, rng1 = one_update(tiny_model_dir, "local", 1, tmp_path)
    m2, w2, rng2 = one_update(tiny_model_dir, "ray", 2, tmp_path)
    assert rng1 == ["random_states_0.pkl"] and rng2 == ["random_states_0.pkl", "random_states_1.pkl"]  # RNG per worker
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
