"""Run directories: a new run never writes into an old one.

``mas train`` into a directory that already holds a run refuses (``RunExistsError``) and
offers ``--resume`` (continue it) or ``--overwrite``, which moves the old run aside to
``<name>.old-<N>`` (the first free N) with one atomic rename; nothing is deleted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

# any of these means the directory holds (part of) a run
RUN_FILES = ("config.yaml", "run_info.json", "metrics.jsonl", "episodes.jsonl", "summary.json", "checkpoints")


class RunExistsError(FileExistsError):
    """A fresh run was asked to write into a directory that holds a run."""


def holds_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in RUN_FILES)


def check_fresh(run_dir: Path, resume_hint: str = "") -> None:
    """Raise ``RunExistsError`` if ``run_dir`` holds a run; the message says what to do."""
    if holds_run(run_dir):
        raise RunExistsError(
            f"{run_dir} already holds a run; a new run would mix its logs and checkpoints with the old ones. "
            f"Continue it with --resume{resume_hint}, or start afresh with --overwrite "
            f"(the old run is moved to {aside_path(run_dir).name}, not deleted)"
        )


def _first_free(name: Callable[[int], Path]) -> Path:
    """``name(N)`` for the first N = 1, 2, ... that does not exist."""
    n = 1
    while name(n).exists():
        n += 1
    return name(n)


def write_keeping_earlier(path: Path, text: str) -> Path | None:
    """Write ``text`` to ``path``; when ``path`` holds other text (a run resumed with overrides: a
    worker count, a sharding, a dtype), the earlier text first moves to ``<stem>.<N><suffix>``, the
    first N not taken, so every segment of a run keeps the config it ran with.  Returns where the
    earlier text went, or None."""
    path = Path(path)
    kept = None
    if path.is_file() and path.read_text() != text:
        kept = _first_free(lambda n: path.with_name(f"{path.stem}.{n}{path.suffix}"))
        path.rename(kept)
    path.write_text(text)
    return kept


def aside_path(run_dir: Path) -> Path:
    """Where ``move_aside`` would put ``run_dir``: ``<name>.old-<N>``, the first N not taken."""
    run_dir = Path(run_dir)
    return _first_free(lambda n: run_dir.parent / f"{run_dir.name}.old-{n}")


def move_aside(run_dir: Path) -> Path | None:
    """Move the run in ``run_dir`` to ``aside_path(run_dir)`` (one rename); None if it holds none."""
    run_dir = Path(run_dir)
    if not holds_run(run_dir):
        return None
    target = aside_path(run_dir)
    os.rename(run_dir, target)  # atomic on one file system; never replaces: the target is free
    return target
