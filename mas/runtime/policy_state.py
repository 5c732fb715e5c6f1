"""One policy's checkpoint files, written and read by the process that holds the policy.

The run-level checkpoint (``mas.training.checkpoint``: layout, atomic rename, ``latest``, trainer state)
knows the team; these functions know only one policy's handle and learner, so the runtime's
workers (``mas.runtime.worker``: the driver's, or a Ray actor's) call them without reaching
up to the run.  Within a checkpoint folder they write::

    policies/<name>/              Hugging Face format (rank 0)
    learners/<name>/              accelerate's checkpointing: optimizer.bin, scheduler.bin (rank 0),
                                  random_states_<rank>.pkl (every rank), weights.json (rank 0);
                                  a policy sharded over its workers writes optimizer_full.pt (rank 0:
                                  the whole state keyed by parameter name) instead of optimizer.bin
    random_states_<rank>.pkl      a process's RNG state (``save_rng_state``: the driver's)
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mas.runtime.sharding import (FULL_OPTIMIZER, full_optimizer_state, load_full_optimizer_state, load_full_weights,
                                  named_optimizer_state, parameter_names)

if TYPE_CHECKING:
    from mas.agents.policy import PolicyHandle
    from mas.learning.learner import Learner


def save_policy_state(ckpt: Path, name: str, handle: "PolicyHandle", learner: "Learner | None", rank: int = 0) -> None:
    """``policies/<name>/`` (rank 0) and, for a trainable policy, ``learners/<name>/``: optimizer and
    schedule (rank 0) and this process's RNG state (every rank)."""
    save_accelerator_state = _accelerate("save_accelerator_state")
    if rank == 0:
        handle.save_pretrained(ckpt / "policies" / name)
    if learner is not None:
        out = ckpt / "learners" / name
        out.mkdir(parents=True, exist_ok=True)
        first = rank == 0  # data-parallel workers hold the same optimizer state: rank 0 writes it
        save_accelerator_state(
            str(out), [], [learner.optimizer] if first else [], [learner.scheduler] if first else [], [],
            process_index=rank, step=0,
        )
        if first:  # the weights' version (updates so far), so a resumed run records the same versions
            (out / "weights.json").write_text(json.dumps({"version": handle.version}))


def load_policy_state(ckpt: Path, name: str, handle: "PolicyHandle", learner: "Learner | None", rank: int = 0) -> None:
    """Restore what ``save_policy_state`` wrote: weights, then (with a learner) optimizer, schedule
    and this rank's RNG state (rank 0's when this rank has none, e.g. more workers than before)."""
    handle.load_weights(ckpt / "policies" / name)
    if learner is None:
        return
    folder = ckpt / "learners" / name
    legacy = ckpt / "learners" / f"{name}.pt"
    if folder.is_dir():
        load_accelerator_state = _accelerate("load_accelerator_state")
        own = (folder / f"random_states_{rank}.pkl").is_file()
        whole = folder / FULL_OPTIMIZER  # written by a sharded run: loads into an unsharded one too
        optimizers = [] if whole.is_file() else [learner.optimizer]
        load_accelerator_state(str(folder), [], optimizers, [learner.scheduler], [], process_index=rank if own else 0)
        if whole.is_file():
            load_full_optimizer_state(handle.model, learner.optimizer, torch.load(whole, weights_only=False))
        if (folder / "weights.json").is_file():
            handle.version = int(json.loads((folder / "weights.json").read_text())["version"])
    elif legacy.is_file():
        learner.load_state_dict(torch.load(legacy, weights_only=False))
    else:
        raise FileNotFoundError(f"policy {name!r}: no learner state in {ckpt} (expected learners/{name}/)")


def save_sharded_state(ckpt: Path, name: str, handle: "PolicyHandle", full: "PolicyHandle | None", learner: "Learner",
                       rank: int = 0) -> None:
    """A policy sharded over its workers (``mas.runtime.sharding``), by every worker: the weights from
    rank 0's full copy ``full`` (Hugging Face format, as ``save_policy_state``), the whole optimizer
    state keyed by parameter name (gathered by every worker, written by rank 0), the schedule and
    each worker's RNG state."""
    save_accelerator_state = _accelerate("save_accelerator_state")
    state = full_optimizer_state(handle.model, learner.optimizer)  # a collective
    out = ckpt / "learners" / name
    out.mkdir(parents=True, exist_ok=True)
    first = rank == 0
    if first:
        full.save_pretrained(ckpt / "policies" / name)
        torch.save(state, out / FULL_OPTIMIZER)
        (out / "weights.json").write_text(json.dumps({"version": handle.version}))
    save_accelerator_state(str(out), [], [], [learner.scheduler] if first else [], [], process_index=rank, step=0)


def load_sharded_state(ckpt: Path, name: str, handle: "PolicyHandle", full: "PolicyHandle | None",
                       learner: "Learner | None", rank: int = 0) -> None:
    """Restore a sharded policy from any checkpoint of it, sharded or not, by every worker: rank 0
    loads the weights into its full copy and every worker takes its shard from it; the optimizer
    state is the whole one (``optimizer_full.pt``), or an unsharded run's renamed by parameter."""
    if full is not None:
        full.load_weights(ckpt / "policies" / name)
    load_full_weights(handle.model, full.model if full is not None else None,
                      parameter_names(handle.model, list(handle.trainable_parameters())))
    if learner is None:
        return
    folder = ckpt / "learners" / name
    if not folder.is_dir():
        raise FileNotFoundError(f"policy {name!r}: no learner state in {ckpt} (expected learners/{name}/)")
    own = (folder / f"random_states_{rank}.pkl").is_file()
    _accelerate("load_accelerator_state")(str(folder), [], [], [learner.scheduler], [], process_index=rank if own else 0)
    if (folder / FULL_OPTIMIZER).is_file():
        state = torch.load(folder / FULL_OPTIMIZER, weights_only=False)
    else:  # an unsharded run's AdamW, numbered in the order of its parameters
        plain = torch.load(folder / "optimizer.bin", weights_only=False)
        state = named_optimizer_state(parameter_names(handle.model, learner.params), plain)
    load_full_optimizer_state(handle.model, learner.optimizer, state)
    if (folder / "weights.json").is_file():
        handle.version = int(json.loads((folder / "weights.json").read_text())["version"])


def save_rng_state(folder: Path, rank: int = 0) -> None:
    """This process's python, numpy, torch and CUDA RNG states, as ``random_states_<rank>.pkl``."""
    _accelerate("save_accelerator_state")(str(folder), [], [], [], [], process_index=rank, step=0)


def load_rng_state(folder: Path, rank: int = 0) -> None:
    folder = Path(folder)
    if (folder / f"random_states_{rank}.pkl").is_file():
        _accelerate("load_accelerator_state")(str(folder), [], [], [], [], process_index=rank)
    elif (folder / "rng.pt").is_file():  # written by earlier versions
        rng = torch.load(folder / "rng.pt", weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])


def _accelerate(name: str):
    """accelerate's checkpointing function ``name``; its process state must exist first (its log
    calls require it), which in a process without an Accelerator means a plain ``PartialState``."""
    from accelerate import PartialState
    from accelerate import checkpointing

    PartialState()
    return getattr(checkpointing, name)
