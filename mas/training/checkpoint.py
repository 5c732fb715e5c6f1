"""Atomic checkpoints and resume; the same files under the local and the Ray runtime.

    checkpoints/step_000005/
        policies/<name>/              Hugging Face format (full models via save_pretrained, adapters
                                      via peft save_pretrained) for every trainable policy
        learners/<name>/              written by the process that holds the learner, with accelerate's
                                      checkpointing (``save_accelerator_state``):
            optimizer.bin               AdamW state
            scheduler.bin               learning-rate schedule
            weights.json                the weights' version (updates so far; turns record it)
            random_states_<rank>.pkl    python, numpy, torch (and CUDA) RNG of that process; one per
                                        data-parallel worker
        trainer_state.json            step, data cursor, credit-method state (e.g. CCPO v1's history), summary
        random_states_0.pkl           the driver's RNG (accelerate's format)
    checkpoints/step_-00002/          a warm-up stopped part-way (Ctrl-C): the same files, with
        warmup_state.pt               the stopped policy's warm-up optimizer and draw (``WARMUP_STATE``)
    checkpoints/latest                name of the newest complete checkpoint
    checkpoints/best/                 with trainer.keep_best: the checkpoint of the best greedy held-out
                                      accuracy so far (the start's weights if nothing beat them); the
                                      same files, never pruned, what mas export takes by default

A checkpoint is written to ``step_N.tmp`` and renamed into place only when complete, and
``latest`` is replaced atomically, so a crash never leaves a half checkpoint behind.

Who writes what: the runtime (``mas.runtime``) saves and loads the policies and learners,
each in the process that holds them (the driver, or each Ray actor), with the functions of
``mas.runtime.policy_state`` (which know one policy, not the team); the trainer state and
the driver's RNG are written here.  A Ray actor on another node writes into the checkpoint
directly when ``runtime.shared_run_dir`` says every node sees the run directory, else its
files are sent back to the driver.  Since the files are the same, a run may be resumed
under the other runtime.  Checkpoints of earlier versions (``learners/<name>.pt``,
``rng.pt``) still load.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mas.credit import get_credit
from mas.errors import CheckpointError
from mas.models.files import weight_file_problems
from mas.process.fault_points import pause_point
from mas.runtime.policy_state import load_rng_state, save_rng_state

if TYPE_CHECKING:
    from mas.training.team import Team


BEST = "best"  # the checkpoint trainer.keep_best keeps: the best greedy held-out accuracy so far
WARMUP_STEP = -2  # the step of a checkpoint taken in the warm-up (-1: the warm-up done, before step 0)
WARMUP_STATE = "warmup_state.pt"  # in that checkpoint: where the stopped policy's warm-up stood


def load_extra(path: Path, file: str) -> Any:
    """A file ``save_checkpoint(extra=...)`` wrote into checkpoint ``path``; None if absent."""
    return torch.load(Path(path) / file, weights_only=True) if (Path(path) / file).is_file() else None


def _ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: Path, step: int, team: "Team", summary: dict[str, Any], env_state: dict[str, Any] | None = None,
    name: str | None = None, extra: dict[str, Any] | None = None,
) -> Path:
    """Checkpoint the run after ``step``.  ``env_state``: the task stream's position to record
    when the env has already moved on (a rollout of the next step taken early, max_staleness 1).
    ``name``: a named checkpoint (``best``) instead of ``step_N``: written the same way, but
    ``latest`` is left alone and pruning never removes it.  ``extra``: more state, by file name,
    written with ``torch.save`` inside the checkpoint (a stopped warm-up's optimizer, ``WARMUP_STATE``)."""
    root = _ckpt_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    label = name or f"step_{step:06d}"
    final = root / label
    tmp = root / f"{label}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "learners").mkdir()
    team.runtime.save_policies(tmp, list(team.learners))
    record_base_models(tmp, team.cfg.policies, list(team.learners), run_dir)  # LoRA: hub id or a path relative to the run
    method = get_credit(team.cfg.credit.method)
    credit_state = method.state.state_dict() if method.state is not None else None
    env = env_state if env_state is not None else team.env.state_dict()
    state = {"step": step, "env": env, "summary": summary, "credit": credit_state}
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    save_rng_state(tmp, rank=0)
    for file, value in (extra or {}).items():
        torch.save(value, tmp / file)
    pause_point("checkpoint_written", step)
    old = root / f"{label}.old"
    if final.exists():  # re-saving a step: move the old copy aside, never leave `latest` dangling
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    pause_point("checkpoint_renamed", step)
    if name is None:
        latest_tmp = root / "latest.tmp"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, root / "latest")
    shutil.rmtree(old, ignore_errors=True)
    return final


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``trainer.keep_best`` kept (``checkpoints/best``), if complete."""
    path = _ckpt_dir(run_dir) / BEST
    return path if (path / "trainer_state.json").is_file() else None


def record_base_models(ckpt: Path, policies: dict[str, Any], names: list[str], run_dir: Path) -> None:
    """Name each LoRA adapter's base model in ``adapter_config.json`` as the config does, portably:
    a hub id or ``embedded`` as it is, a local directory as a path relative to ``run_dir``
    (peft writes the loaded model's own path, an absolute path of this machine or a cache)."""
    from mas.agents.policy import portable_model_ref

    for name in names:
        config_file = Path(ckpt) / "policies" / name / "adapter_config.json"
        if policies[name].kind != "lora" or not config_file.is_file():
            continue
        config = json.loads(config_file.read_text())
        config["base_model_name_or_path"] = portable_model_ref(policies[name].model, run_dir)
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True))


def prune_checkpoints(run_dir: Path, keep_last: int | None) -> list[str]:
    """Delete all but the newest ``keep_last`` complete checkpoints (None: keep all); returns
    the names deleted.

    The one ``latest`` names is never deleted, so ``latest`` never dangles and the final
    checkpoint of a run is always kept.  Each old checkpoint is first renamed to
    ``step_N.pruned`` (atomic), then removed: a crash in between leaves a ``.pruned`` folder
    that no reader takes for a checkpoint, and that the next prune removes.  Leftover
    ``.tmp`` / ``.old`` folders of other steps go too.
    """
    root = _ckpt_dir(run_dir)
    if keep_last is None or not root.is_dir():
        return []
    latest = latest_checkpoint(run_dir)
    complete = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and "." not in p.name)
    keep = set(complete[-keep_last:]) | ({latest} if latest is not None else set())
    doomed = [p for p in complete if p not in keep]
    for path in doomed:
        gone = path.with_name(path.name + ".pruned")
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(path, gone)
    for path in root.iterdir():  # leftovers: pruned folders and temp copies of earlier saves
        if path.is_dir() and path.suffix in (".pruned", ".tmp", ".old") and (latest is None or path.name != latest.name):
            shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in doomed]


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = _ckpt_dir(run_dir) / "latest"
    if not pointer.exists():
        return None
    path = _ckpt_dir(run_dir) / pointer.read_text().strip()
    return path if path.is_dir() else None


def check_policy_files(ckpt: Path, names: list[str]) -> None:
    """A ``CheckpointError`` naming the policy and the file when a policy's saved weights in
    ``ckpt`` cannot be loaded (cut short, not JSON: ``mas.models.files``), before anything loads."""
    for name in names:
        problems = weight_file_problems(Path(ckpt) / "policies" / name)
        if problems:
            raise CheckpointError(f"policy {name!r}: the checkpoint {ckpt} is damaged: " + "; ".join(problems))


def load_checkpoint(path: Path, team: "Team") -> dict[str, Any]:
    """Restore weights, optimizer/schedule, data cursor and RNG state in place; return the trainer state."""
    path = Path(path)
    check_policy_files(path, list(team.learners))
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path / 'trainer_state.json'}: cannot be read ({e}); the checkpoint is damaged: "
                              f"to resume from an earlier one, write its name (e.g. step_000009) into {path.parent / 'latest'}") from None
    team.runtime.load_policies(path, list(team.learners))
    team.env.load_state_dict(state["env"])
    method = get_credit(team.cfg.credit.method)
    if method.state is not None:
        method.state.load_state_dict(state["credit"] or {})
    load_rng_state(path, rank=0)
    return state
