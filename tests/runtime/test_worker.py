"""PolicyWorker in this process (no Ray): the serving copy and the update order."""

from __future__ import annotations

import threading
import time

import torch
from team_helpers import team_config

from mas.rollout.backends.base import GenRequest
from mas.config.schema import validate_config
from mas.learning.learner import TrainSample
from mas.runtime import learner_args
from mas.runtime.worker import PolicyWorker


def worker(model_dir, serving_copy: bool) -> PolicyWorker:
    cfg = validate_config(team_config(model_dir, "chain"))
    return PolicyWorker(dict(cfg.policies), ["main"], learner_args(cfg), seed=0, serving_copy=serving_copy)


def batch(n: int = 6) -> list[TrainSample]:
    g = torch.Generator().manual_seed(0)
    return [TrainSample(torch.randint(5, 200, (6,), generator=g).tolist(), torch.randint(5, 200, (4,), generator=g).tolist(),
                        [-2.0] * 4, float(k % 3 - 1), 1.0) for k in range(n)]


def greedy(w: PolicyWorker) -> list[list[int]]:
    reqs = [GenRequest("main", [5 + k, 17, 40], 0.0, 1.0, 0, 6) for k in range(4)]
    return [r.completion_ids for r in w.generate(reqs, seed=0)]


def test_serving_copy_serves_the_old_weights_until_sync(tiny_model_dir):
    w = worker(tiny_model_dir, serving_copy=True)
    trained, served = w.handles["main"].model, w.serving["main"].model
    assert served is not trained and w.serving["judge"] is w.handles["judge"]  # frozen weights need no copy
    before = greedy(w)
    w.update("main", batch(), seed=1)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), served.parameters()))
    assert greedy(w) == before  # still the old weights: a rollout during an update sees version 0
    assert w.generate([GenRequest("main", [5, 17], 1.0, 1.0, 0, 3)], seed=0)[0].weight_version == 0
    assert w.sync("main") == 1
    assert all(torch.equal(a, b) for a, b in zip(trained.parameters(), served.parameters()))
    assert w.generate([GenRequest("main", [5, 17], 1.0, 1.0, 0, 3)], seed=0)[0].weight_version == 1


def test_without_a_serving_copy_the_backend_samples_the_trained_modules(tiny_model_dir):
    w = worker(tiny_model_dir, serving_copy=False)
    assert w.serving is w.handles and w.backend.policies["main"].model is w.handles["main"].model


def test_updates_run_in_ticket_order_whatever_order_they_arrive_in(tiny_model_dir):
    w = worker(tiny_model_dir, serving_copy=False)
    order: list[int] = []
    real = w.learners["main"].update

    def recording(samples, seed=None):
        order.append(seed)
        return real(samples, seed=seed)

    w.learners["main"].update = recording
    threads = [threading.Thread(target=w.update, args=("main", batch(2), ticket, ticket)) for ticket in (2, 1, 0)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # ticket 2 arrives first, then 1, then 0
    for t in threads:
        t.join(timeout=60)
    assert order == [0, 1, 2]
    assert w.handles["main"].version == 3


def test_an_update_hands_its_freed_memory_back_after_it_has_read_the_peak(tiny_model_dir, monkeypatch):
    import mas.runtime.worker as worker_module

    events: list[str] = []
    monkeypatch.setattr(worker_module, "peak_rss_mb", lambda: events.append("peak") or 1.0)
    monkeypatch.setattr(worker_module, "release_freed_memory", lambda: events.append("release") or True)
    w = worker(tiny_model_dir, serving_copy=False)
    metrics, _, _ = w.update("main", batch(), seed=1)
    assert events == ["peak", "release"] and metrics["peak_rss_mb"] == 1.0  # the record holds the update's own peak
