"""Reading a data set's JSONL file: one checked row per line, errors that name file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def read_jsonl(path: str | Path, check: Callable[[Any, str], dict[str, Any]], dataset: str, noun: str) -> list[dict[str, Any]]:
    """``check(row, "file:line")`` of every non-blank line of ``path``.

    A missing file is FileNotFoundError ("<dataset> data file not found"); a line that is not
    JSON, or that ``check`` rejects, is ValueError naming ``file:line``; a file without rows is
    ValueError ("no <noun> found").
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{dataset} data file not found: {path}")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            rows.append(check(row, f"{path}:{lineno}"))
    if not rows:
        raise ValueError(f"{path}: no {noun} found (the file is empty)")
    return rows
