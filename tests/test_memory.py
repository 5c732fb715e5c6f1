"""Handing the allocator's freed memory back to the system between steps and after the phases
before RL, and what those phases leave alive (mas.process.memory)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import mas.training.evaluation
import mas.training.warmup
from mas.config.schema import apply_overrides, validate_config
from mas.training.evaluation import evaluate
from mas.process.memory import live_tensors
from mas.training.team import build_team
from mas.training.warmup import warm_up


FRAGMENT_AND_RELEASE = """
from mas.process.memory import release_freed_memory, rss_mb
# 64 KB blocks sit below glibc's mmap threshold, so freeing them leaves a fragmented heap
# that glibc keeps: every 50th block stays alive, pinning the heap's top.
blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 250 MiB
kept = blocks[::50]
del blocks
before = rss_mb()
assert release_freed_memory()
after = rss_mb()
assert before - after > 150, (before, after)  # most of the freed 245 MiB is returned
assert len(kept) == 80 and all(len(b) == 64 * 1024 for b in kept)  # what is in use stays
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_freed_heap_goes_back_to_the_system():
    # In a child process with glibc's defaults: a MALLOC_MMAP_THRESHOLD_ (or GLIBC_TUNABLES) below
    # 64 KB in the environment would put each block in its own mapping, freed at once, and the
    # fragmented heap this test needs would never form.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", FRAGMENT_AND_RELEASE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


LARGE_BLOCKS = """
import sys
from mas.process.memory import keep_large_blocks_off_the_heap, rss_mb
if sys.argv[1] == "fixed":
    assert keep_large_blocks_off_the_heap()
first = bytearray(8 * 2**20)  # glibc maps it apart; freeing it raises glibc's own threshold to 8 MiB
del first
blocks, pins = [], []
for _ in range(40):  # 320 MiB of 8 MiB blocks, each followed by a small block that stays alive
    blocks.append(bytearray(8 * 2**20))
    pins.append(bytearray(1024))
before = rss_mb()
del blocks
print(before - rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_blocks_are_handed_back_when_freed_once_the_threshold_is_fixed():
    """With glibc's moving threshold, 8 MiB blocks come from the heap once one was freed, and the small
    blocks between them keep that memory resident after they are freed; with the threshold fixed at
    4 MiB each is its own mapping and goes back to the system at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}

    def freed(mode: str) -> float:
        done = subprocess.run([sys.executable, "-c", LARGE_BLOCKS, mode], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return float(done.stdout.strip())

    assert freed("fixed") > 250  # MiB of the 320 returned as they are freed
    assert freed("glibc") < 100  # kept, fragmented, until a malloc_trim
    user = subprocess.run([sys.executable, "-c", "from mas.process.memory import keep_large_blocks_off_the_heap as k; "
                           "print(k())"], env={**env, "MALLOC_MMAP_THRESHOLD_": "65536"}, capture_output=True, text=True)
    assert user.stdout.strip() == "False"  # the user's own threshold is left alone


HUGE_PAGES = """
from mas.process.memory import huge_pages_for_large_tensors
first = huge_pages_for_large_tensors()
import torch
blocks = [torch.empty(3 * 2**18) for _ in range(8)]  # 3 MiB each
print(first, sum(b.data_ptr() % 4096 == 0 for b in blocks), huge_pages_for_large_tensors())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torch's THP_MEM_ALLOC_ENABLE is Linux only")
def test_tensors_of_2_mib_or_more_are_page_aligned_when_the_setting_comes_before_torch():
    """Set before torch loads, torch's allocator page-aligns every 3 MiB tensor; glibc alone gives them
    64-byte alignment inside their mappings.  Once torch is loaded the call changes nothing, and a
    user's own value (0 here) is kept."""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}

    def run(extra: dict[str, str]) -> str:
        done = subprocess.run([sys.executable, "-c", HUGE_PAGES], env={**env, **extra}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run({}) == "True 8 False"
    assert run({"THP_MEM_ALLOC_ENABLE": "0"}) == "False 0 False"
    late = ("import os, torch; from mas.process.memory import huge_pages_for_large_tensors as h; "
            "print(h(), os.environ.get('THP_MEM_ALLOC_ENABLE'))")
    done = subprocess.run([sys.executable, "-c", late], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False None"  # torch loaded first: too late to take effect, so not set


def test_the_mas_command_and_the_python_api_set_it_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    # a 3 MiB tensor page-aligned afterwards: torch loaded after the setting, so it took effect
    aligned = "import torch; print(torch.empty(3 * 2**18).data_ptr() % 4096 == 0)"
    code = "import mas.cli, os, sys; print(os.environ.get('THP_MEM_ALLOC_ENABLE'), 'torch' in sys.modules); " + aligned
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "1 True"  # set, and torch loaded after it
    assert done.stdout.split("\n")[1] == "True"
    code = "import mas, os, sys; mas.load_team; print(os.environ.get('THP_MEM_ALLOC_ENABLE'), 'torch' in sys.modules); " + aligned
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "1 True"  # the Python API's first use, too
    assert done.stdout.split("\n")[1] == "True"


def test_every_training_step_starts_by_releasing_freed_memory(tiny_model_dir, tmp_path, monkeypatch):
    import mas
    import mas.training.trainer
    from team_helpers import team_config

    calls = []
    steps = []
    monkeypatch.setattr(mas.training.trainer, "release_freed_memory", lambda: calls.append(len(steps)) or True)

    class Steps:
        def on_step_end(self, step, metrics, groups, credit):
            steps.append(step)

    team = mas.load_team(team_config(tiny_model_dir, "chain"))
    mas.train(team, tmp_path / "run", callbacks=[Steps()])
    assert steps == [0, 1, 2] and calls == [0, 1, 2]  # once before each step, after the one before it


ROOT = Path(__file__).parents[1]


def smol_orchestrator(model_dir, *extra: str):
    """configs/smol_orchestrator.yaml (three LoRA adapters on one base) on the tiny test model."""
    data = yaml.safe_load((ROOT / "configs/smol_orchestrator.yaml").read_text())
    overrides = [f"policies.{name}.{key}={value}" for name in data["policies"]
                 for key, value in (("model", model_dir), ("device", "cpu"), ("dtype", "float32"))]
    return build_team(validate_config(apply_overrides(data, overrides + list(extra)), "smol_orchestrator.yaml"))


WARMUP = ("trainer.warmup.steps=2", "trainer.warmup.episodes=16", "trainer.warmup.batch_size=2")


def test_the_warm_up_leaves_no_optimizer_state_gradients_or_tensors_behind(tiny_model_dir):
    with smol_orchestrator(tiny_model_dir, *WARMUP) as team:
        params = {name: list(h.trainable_parameters()) for name, h in team.runtime.policies.items() if name in team.learners}
        before = {name: [p.detach().clone() for p in ps] for name, ps in params.items()}
        count, nbytes = live_tensors()  # the copies above included
        record = warm_up(team, lambda _: None)
        assert live_tensors() == (count, nbytes)  # its AdamW moments, gradients and batches are all gone
        assert set(record["policies"]) == set(params) == {"planner", "adder", "subtractor"}
        for name, ps in params.items():
            assert any(not torch.equal(p, q) for p, q in zip(ps, before[name])), name  # it trained every adapter
            assert all(p.grad is None for p in ps), name
            assert not team.learners[name].optimizer.state, name  # RL starts with fresh optimizer state
        held = [o for o in gc.get_objects() if issubclass(type(o), torch.optim.Optimizer)]
        assert all(any(o is lrn.optimizer for lrn in team.learners.values()) for o in held)  # no optimizer but the learners'


def test_the_warm_up_and_each_evaluation_end_by_releasing_freed_memory(tiny_model_dir, monkeypatch):
    log = []
    monkeypatch.setattr(mas.training.warmup, "release_freed_memory", lambda: log.append("release") or True)
    monkeypatch.setattr(mas.training.evaluation, "release_freed_memory", lambda: log.append("release") or True)
    with smol_orchestrator(tiny_model_dir, *WARMUP, "trainer.eval_sampled_k=2") as team:
        train, generate = team.runtime.warm_up_end, team.backend.generate_batch
        monkeypatch.setattr(team.runtime, "warm_up_end", lambda *a, **k: log.append("warm-up") or train(*a, **k))
        monkeypatch.setattr(team.backend, "generate_batch", lambda *a, **k: log.append("generate") or generate(*a, **k))
        warm_up(team, lambda _: None)
        assert log == ["warm-up", "release"] * 3  # after each policy's supervised steps, before the next phase
        log.clear()
        evaluate(team, 2, seed=0)
        assert "generate" in log and log.count("release") == 1 and log[-1] == "release"  # once, after its last generation


def test_each_policys_passes_hand_their_freed_memory_back_before_the_next_policys(tiny_model_dir, tmp_path, monkeypatch):
    """A step starts every policy's update (its passes) before any optimizer steps: each learner hands
    its passes' freed heap back as its gradients are done, so the next policy's passes do not grow on it."""
    import mas
    import mas.learning.learner as learner_module

    log = []
    monkeypatch.setattr(learner_module, "release_freed_memory", lambda: log.append("release") or True)
    accumulate = learner_module.Learner._accumulate

    def logged(self, batch, abort=None):
        log.append(f"passes {self.policy.name}")
        return accumulate(self, batch, abort)

    monkeypatch.setattr(learner_module.Learner, "_accumulate", logged)
    team = smol_orchestrator(tiny_model_dir, "trainer.steps=1", "trainer.warmup.steps=0", "trainer.eval_size=0")
    mas.train(team, tmp_path / "run")
    passes = [i for i, e in enumerate(log) if e.startswith("passes")]
    assert passes  # the policies whose agents spoke (on the tiny model, the planner)
    assert all(log[i + 1] == "release" for i in passes), log
