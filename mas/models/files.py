"""Whether a saved model folder's files can be read, checked without loading the weights.

A checkpoint or an export whose ``model.safetensors`` was cut short (a disk that filled, a copy
that stopped) or whose ``config.json`` is not JSON otherwise fails deep inside safetensors or
transformers with their own traceback, which names neither the policy nor the file.  These
checks read only the safetensors header (8 bytes of length, then a JSON table of each tensor's
byte range) and compare the ranges with the file's size, so they cost a few kilobytes of reading
whatever the model's size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

JSON_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json", "generation_config.json")
_MAX_HEADER = 100_000_000  # safetensors' own limit on the header's length


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be read (None: its header and size agree)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path}: {size} bytes, too short for a safetensors file (cut short?)"
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                return f"{path}: its header claims {n} bytes, the file holds {size}: not a safetensors file, or cut short"
            header = json.loads(f.read(n))
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror or e})"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"{path}: its header is not valid JSON: not a safetensors file, or damaged"
    if not isinstance(header, dict):
        return f"{path}: its header is not a table of tensors: damaged"
    ends = [t.get("data_offsets", (0, 0))[1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"{path}: {size} bytes, but its tensors need {need}: the file was cut short"
    return None


def weight_file_problems(folder: Path) -> list[str]:
    """Why the model (or adapter) folder ``folder`` cannot be loaded, one line per damaged file:
    safetensors files whose header and size disagree, JSON files that do not parse, no weights."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder}: missing"]
    problems = []
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    if not weights:
        problems.append(f"{folder}: no weights (*.safetensors) there")
    for path in weights:
        if path.suffix == ".safetensors":
            problem = safetensors_problem(path)
            if problem:
                problems.append(problem)
    for name in JSON_FILES:
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                problems.append(f"{path}: not valid JSON ({e})")
    return problems
