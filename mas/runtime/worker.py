"""What one process holds of a run: some policies, the rollout backend serving them and their learners.

The local runtime runs ONE ``PolicyWorker`` with every policy in the driver process; the Ray
runtime runs one per actor (a full or frozen policy, or a LoRA family that shares a base),
each in its own process.  The same class builds both, so the two runtimes load, sample, train
and checkpoint with the same code.

Serving while training (``trainer.max_staleness: 1``): the trainer asks a Ray actor to roll
out the next step while it trains.  The ``hf`` backend samples from the very modules the
learner updates, so such a worker keeps a serving copy (``serving_copy=True``): a deep copy of
each trained model that the backend samples from, overwritten in place by ``sync`` with the
trained weights.  Until ``sync``, the rollout sees the weights before the running update.
The copy costs one more model in memory (for a LoRA family the base too).  A ``vllm`` engine
already holds its own copy of the weights, so it needs none.

Update order: the learners of one worker share its model (a LoRA family), so they never run at
the same time; each update carries a ticket from the driver and runs in ticket order.  All
data-parallel workers of a policy thus run the same updates in the same order, as their
collective calls require.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

from mas.rollout.backends.base import Backend, GenRequest, GenResult
from mas.learning.learner import Learner, TrainSample, UpdateSpan, _host
from mas.process.memory import keep_large_blocks_off_the_heap, peak_rss_mb, release_freed_memory
from mas.runtime.policy_state import load_policy_state, load_sharded_state, save_policy_state, save_sharded_state
from mas.learning.sft import SupervisedRun

if TYPE_CHECKING:
    from mas.agents.policy import PolicyHandle
    from mas.config.schema import PolicyConfig


class PolicyWorker:
    """Policies ``policies`` (config by name), the backend serving them and a learner for each
    trainable one in ``train`` (policies some agent uses).  ``learner_args``: per policy, the
    trainer's loss settings (``mas.runtime.learner_args``)."""

    def __init__(
        self,
        policies: dict[str, "PolicyConfig"],
        train: list[str],
        learner_args: dict[str, dict[str, Any]],
        seed: int,
        serving_copy: bool = False,
        num_threads: int | None = None,
        deterministic: bool = False,
        rank: int = 0,
    ):
        from mas.agents.policy import build_policies
        from mas.rollout.backends import build_backend

        _process_settings(num_threads, deterministic)
        self.rank = rank
        self.handles: dict[str, PolicyHandle] = build_policies(dict(policies), seed=seed)
        self.learners: dict[str, Learner] = {
            name: Learner(h, policies[name].optim, mixed_precision=policies[name].mixed_precision, **learner_args[name])
            for name, h in self.handles.items()
            if h.trainable and name in train
        }
        self.serving = self._serving_handles() if serving_copy else self.handles
        self._batch_tokens = {name: policies[name].rollout_batch_tokens for name in self.serving}
        self.backend: Backend = build_backend(self.serving, self._batch_tokens) if rank == 0 else None  # other ranks only train
        self.sharded: set[str] = set()  # policies sharded over this worker's group (``sharding: fsdp``)
        self._turn = threading.Condition()
        self._next_ticket = 0
        self.warmups: dict[str, SupervisedRun] = {}  # the supervised warm-ups in progress, by policy

    # ---------------------------------------------------------------- facts

    def info(self) -> dict[str, Any]:
        """Where this worker runs and what it holds: tokenizers (the driver renders prompts with
        them) and, per policy, kind, device, parameter counts and weight version."""
        node_id = None
        try:
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return {
            "pid": os.getpid(),
            "host": _host(),
            "node_id": node_id,
            "rank": self.rank,
            "tokenizers": {name: h.tokenizer for name, h in self.handles.items()},
            "policies": {name: describe_policy(h) for name, h in self.handles.items()},
        }

    def versions(self) -> dict[str, int]:
        return {name: h.version for name, h in self.handles.items()}

    # ---------------------------------------------------------------- serving

    def generate(self, requests: list[GenRequest], seed: int | None) -> list[GenResult]:
        return self.backend.generate_batch(requests, seed=seed)

    def sync(self, name: str) -> int:
        """Serve the trained weights of ``name`` (copying them into the serving copy if there is one)."""
        if self.serving is not self.handles and name not in self.sharded:  # sharded: gathered by _publish
            trained, served = self.handles[name], self.serving[name]
            if trained.trainable:
                _copy_trainable(trained, served)
            served.version = trained.version
        if self.backend is not None:
            self.backend.sync_weights(name)
        return self.handles[name].version

    def close(self) -> None:
        """Free what outlives this object otherwise: the rollout backend's engines (vLLM's processes)."""
        if self.backend is not None:
            from mas.rollout.backends.base import close_backend

            close_backend(self.backend)

    def _serving_handles(self, every_backend: bool = False) -> dict[str, "PolicyHandle"]:
        """Handles on deep copies of the models that hf samples from while the learners train
        (``every_backend``: for vLLM too, whose engine is then pushed the copy's weights)."""
        from mas.agents.policy import PolicyHandle

        copies: dict[int, torch.nn.Module] = {}
        out = {}
        for name, h in self.handles.items():
            if not h.trainable or (h.backend != "hf" and not every_backend):  # frozen: never changes; vLLM: its own copy
                out[name] = h
                continue
            if id(h.model) not in copies:  # a LoRA family: one copy of the shared PeftModel
                copies[id(h.model)] = copy.deepcopy(h.model).eval()
                for p in copies[id(h.model)].parameters():
                    p.requires_grad_(False)
            served = PolicyHandle(name, h.kind, copies[id(h.model)], h.tokenizer, h.device, adapter=h.adapter, backend=h.backend)
            served.version = h.version
            out[name] = served
        return out

    # ---------------------------------------------------------------- training

    def update(self, name: str, samples: list[TrainSample], seed: int | None, ticket: int | None = None) -> tuple[dict, UpdateSpan, int]:
        """One update of ``name`` on ``samples`` (this worker's shard); returns its metrics, where
        and when it ran, and the new weight version.  Waits for its ``ticket`` (see the module
        docstring); None: run now."""
        with self._in_turn(ticket):
            start = time.time()
            metrics = self.learners[name].update(samples, seed=seed)
            self._publish(name)
            metrics["peak_rss_mb"] = peak_rss_mb()  # this actor's memory (the step's ``memory`` record)
            release_freed_memory()  # the update's activations and gradients: back to the system, not kept
            return metrics, UpdateSpan(os.getpid(), _host(), start, time.time()), self.handles[name].version

    def warm_up_begin(self, name: str, demonstrations: list, batch_size: int, lr: float, seed: int,
                      state: dict[str, Any] | None = None) -> int:
        """Start the supervised format warm-up of ``name`` (``mas.learning.sft.SupervisedRun``), scored
        as its learner scores turns; its steps come in parts (``warm_up_steps``), so the driver shows
        progress and can stop between them.  ``state``: a stopped warm-up's ``warm_up_state``, to go
        on from.  Returns the number of steps already taken."""
        learner = self.learners[name]
        run = SupervisedRun(self.handles[name], demonstrations, batch_size, lr, seed,
                            micro_batch_tokens=learner.micro_batch_tokens, logprob_chunk=learner.logprob_chunk)
        if state is not None:
            run.load_state_dict(state)
        self.warmups[name] = run
        return len(run.losses)

    def warm_up_state(self, name: str) -> dict[str, Any]:
        """Where ``name``'s warm-up stands (``SupervisedRun.state_dict``), for a checkpoint."""
        return self.warmups[name].state_dict()

    def warm_up_steps(self, name: str, steps: int) -> list[float]:
        """``steps`` more warm-up steps of ``name``; their losses."""
        return self.warmups[name].run(steps)

    def warm_up_end(self, name: str) -> dict[str, Any]:
        """End ``name``'s warm-up: its optimizer is dropped, the serving copy (if any) gets the new
        weights; the warm-up's record (``SupervisedRun.close``)."""
        got = self.warmups.pop(name).close()
        self._publish(name)
        self.sync(name)
        return got

    @contextlib.contextmanager
    def _in_turn(self, ticket: int | None) -> Iterator[None]:
        """Wait until ``ticket`` is the next one, run, then let the next ticket in (None: no waiting)."""
        if ticket is None:
            yield
            return
        with self._turn:
            self._turn.wait_for(lambda: self._next_ticket == ticket)
        try:
            yield
        finally:
            with self._turn:
                self._next_ticket = ticket + 1
                self._turn.notify_all()

    def data_parallel_address(self) -> tuple[str, int]:
        """Rank 0: this node's address and a free port for the group's rendezvous."""
        from mas.runtime.data_parallel import free_address

        return free_address()

    def init_data_parallel(self, address: str, port: int, rank: int, world_size: int, sharding: str = "none") -> None:
        """Join the torch.distributed group of this policy's workers (see ``mas.runtime.data_parallel``);
        with ``sharding: fsdp`` shard the trained model over them (``mas.runtime.sharding``), rank 0
        keeping a full copy to serve the rollout from."""
        from mas.runtime.data_parallel import join_group

        sync = join_group(address, port, rank, world_size, self._device())
        for learner in self.learners.values():
            learner.sync = sync
        if sharding == "fsdp":
            self._shard(world_size)

    def _shard(self, world_size: int) -> None:
        from mas.rollout.backends import build_backend
        from mas.runtime.sharding import shard_model

        if self.rank == 0 and self.serving is self.handles:  # the rollout samples from a full copy
            from mas.rollout.backends.base import close_backend

            close_backend(self.backend)
            self.serving = self._serving_handles(every_backend=True)
            self.backend = build_backend(self.serving, self._batch_tokens)
        sharded: set[int] = set()
        for name, learner in self.learners.items():
            model = self.handles[name].model
            if id(model) not in sharded:  # a LoRA family: its one model, once
                shard_model(model)
                sharded.add(id(model))
            learner.sharded(world_size)
        self.sharded = set(self.learners)

    def _publish(self, name: str) -> None:
        """After ``name``'s weights changed on a sharded worker: gather its trained parameters into
        rank 0's full copy (every worker takes part)."""
        if name not in self.sharded:
            return
        from mas.runtime.sharding import gather_into, parameter_names

        model = self.handles[name].model
        gather_into(model, parameter_names(model, self.learners[name].params), self.serving[name].model if self.rank == 0 else None)
        if self.rank == 0:
            self.serving[name].version = self.handles[name].version

    def _device(self) -> torch.device:
        return next(iter(self.handles.values())).device

    # ---------------------------------------------------------------- checkpoints

    def save(self, ckpt: str, names: list[str]) -> None:
        """Write ``names``' weights (rank 0), optimizer and schedule (rank 0) and this process's RNG
        state into checkpoint folder ``ckpt`` (``mas.training.checkpoint`` layout)."""
        for name in names:
            if name in self.sharded:  # rank 0's full copy holds the weights; the optimizer state is gathered
                save_sharded_state(Path(ckpt), name, self.handles[name], self.serving[name] if self.rank == 0 else None,
                                   self.learners[name], rank=self.rank)
            else:
                save_policy_state(Path(ckpt), name, self.handles[name], self.learners.get(name), rank=self.rank)

    def save_files(self, names: list[str]) -> dict[str, bytes]:
        """``save`` into a private folder and return its files (relative path -> bytes), for a driver
        that does not share this node's filesystem."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mas-ckpt-") as tmp:
            self.save(tmp, names)
            return {str(p.relative_to(tmp)): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}

    def load(self, ckpt: str, names: list[str], learner_state: bool = True) -> dict[str, int]:
        """Restore ``names`` from checkpoint folder ``ckpt`` (weights; optimizer, schedule and RNG
        with ``learner_state``) and serve them; returns the new weight versions."""
        for name in names:
            learner = self.learners.get(name) if learner_state else None
            if name in self.sharded:
                load_sharded_state(Path(ckpt), name, self.handles[name], self.serving[name] if self.rank == 0 else None,
                                   learner, rank=self.rank)
            else:
                load_policy_state(Path(ckpt), name, self.handles[name], learner, rank=self.rank)
            self.sync(name)
        return self.versions()

    def load_files(self, files: dict[str, bytes], names: list[str], learner_state: bool = True) -> dict[str, int]:
        """``load`` from checkpoint files sent by the driver (relative path -> bytes)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mas-ckpt-") as tmp:
            for rel, data in files.items():
                path = Path(tmp) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            return self.load(tmp, names, learner_state)

    def ready(self) -> bool:
        return True


def describe_policy(h: "PolicyHandle") -> dict[str, Any]:
    """Kind, device and parameter counts of one policy (``run_info.json``, the report's checklist)."""
    named = list(h.model.named_parameters()) if h.model is not None else []  # None: a remote endpoint
    return {
        "kind": h.kind,
        "device": str(h.device),
        "parameters": sum(t.numel() for n, t in named if "lora_" not in n),  # a LoRA policy: the shared base only
        "trainable_parameters": sum(t.numel() for t in h.trainable_parameters()),
        "version": h.version,
    }


def _copy_trainable(src: "PolicyHandle", dst: "PolicyHandle") -> None:
    """Copy ``src``'s trainable tensors (all weights, or its adapter) into the same-named ones of ``dst``."""
    names = {id(p) for p in src.trainable_parameters()}
    dst_params = dict(dst.model.named_parameters())
    with torch.no_grad():
        for n, p in src.model.named_parameters():
            if id(p) in names:
                dst_params[n].copy_(p)


def _process_settings(num_threads: int | None, deterministic: bool) -> None:
    """Settings a worker process needs before it builds models (the driver's ``apply_runtime``)."""
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # alignment-independent MKL results, as the CLI sets
    from transformers.utils import logging as hf_logging

    keep_large_blocks_off_the_heap()  # as the driver's apply_runtime: a learner's passes fragment the heap

    hf_logging.disable_progress_bar()
    if num_threads:
        torch.set_num_threads(num_threads)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
