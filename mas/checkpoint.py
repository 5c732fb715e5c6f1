"""Atomic checkpoints and resume.

    checkpoints/step_000005/
        policies/<name>/      Hugging Face format (full models via save_pretrained, adapters via
                              peft save_pretrained) for every trainable policy
        learners/<name>.pt    optimizer and LR-schedule state
        trainer_state.json    step, data cursor, credit-method state (e.g. CCPO v1's history), summary
        rng.pt                python, numpy and torch RNG states
    checkpoints/latest        name of the newest complete checkpoint

A checkpoint is written to ``step_N.tmp`` and renamed into place only when complete, and
``latest`` is replaced atomically, so a crash never leaves a half checkpoint behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mas.credit import get_credit
from mas.fault_points import pause_point

if TYPE_CHECKING:
    from mas.team import Team


def _ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, team: "Team", summary: dict[str, Any]) -> Path:
    root = _ckpt_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in team.learners:
        team.policies[name].save_pretrained(tmp / "policies" / name, relative_to=run_dir)  # LoRA: base path relative to the run
    (tmp / "learners").mkdir()
    for name, learner in team.learners.items():
        torch.save(learner.state_dict(), tmp / "learners" / f"{name}.pt")
    method = get_credit(team.cfg.credit.method)
    credit_state = method.state.state_dict() if method.state is not None else None
    state = {"step": step, "env": team.env.state_dict(), "summary": summary, "credit": credit_state}
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}, tmp / "rng.pt")
    pause_point("checkpoint_written", step)
    old = root / f"step_{step:06d}.old"
    if final.exists():  # re-saving a step: move the old copy aside, never leave `latest` dangling
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    pause_point("checkpoint_renamed", step)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    shutil.rmtree(old, ignore_errors=True)
    return final


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


def load_checkpoint(path: Path, team: "Team") -> dict[str, Any]:
    """Restore weights, optimizer/schedule, data cursor and RNG state in place; return the trainer state."""
    path = Path(path)
    for name in team.learners:
        team.policies[name].load_weights(path / "policies" / name)
        team.learners[name].load_state_dict(torch.load(path / "learners" / f"{name}.pt", weights_only=False))
        team.backend.sync_weights(name)
    state = json.loads((path / "trainer_state.json").read_text())
    team.env.load_state_dict(state["env"])
    method = get_credit(team.cfg.credit.method)
    if method.state is not None:
        method.state.load_state_dict(state["credit"] or {})
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return state
