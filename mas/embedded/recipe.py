"""The embedded model's recipe: what is built, and the key it is cached and shipped under.

The key hashes the recipe's numbers and every format's spec (agents, role prompts, topology,
env, the teacher's knobs; ``formats.py``), so a change to any of them is a new model: the
cache entry and the shipped artifact (``artifact.py``) of the old key are not used for it.
Bump ``version`` when the build code changes in a way the spec does not show.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

from .formats import FORMATS

DEFAULT_MIX: tuple[tuple[str, int], ...] = tuple((f.name, f.episodes) for f in FORMATS.values())


@dataclass(frozen=True)
class Recipe:
    version: int = 3  # bump when the build code changes, so stale caches are not reused
    seed: int = 0
    formats: tuple[tuple[str, int], ...] = DEFAULT_MIX  # (format name, teacher episodes)
    vocab_size: int = 384
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 6000  # six formats need about 3x the quickstart-only model's 2,000 steps (docs/benchmarks.md)
    batch_size: int = 32
    lr: float = 3e-3

    def __post_init__(self) -> None:
        unknown = [name for name, _ in self.formats if name not in FORMATS]
        if unknown:
            raise ValueError(f"unknown warm-start formats {unknown}; valid: {sorted(FORMATS)}")

    def format_specs(self) -> dict:
        return {name: FORMATS[name].spec() for name, _ in self.formats}

    def varied(self, changes: list[str]) -> Recipe:
        """This recipe with ``KEY=VALUE`` changes (``mas build-embedded --recipe``): a number
        (``steps=8000``, ``seed=1``, ``lr=0.002``) or one format's teacher episodes
        (``formats.graph=1600``; 0 drops the format).  A variant has its own key, so it is
        built into its own cache folder and never taken for the project's model."""
        numbers = {f.name: f.type for f in fields(self) if f.name != "formats"}
        formats, values = dict(self.formats), {}
        for change in changes:
            key, sep, value = change.partition("=")
            try:
                if not sep:
                    raise ValueError("expected KEY=VALUE")
                if key.startswith("formats."):
                    name = key.removeprefix("formats.")
                    if name not in FORMATS:
                        raise ValueError(f"unknown format {name!r}; valid: {sorted(FORMATS)}")
                    formats[name] = int(value)
                elif key in numbers:
                    values[key] = float(value) if numbers[key] == "float" else int(value)  # annotations are strings here (__future__)
                else:
                    raise ValueError(f"unknown key; valid: {sorted(numbers)} or formats.<name>")
            except ValueError as e:
                raise ValueError(f"recipe change {change!r}: {e}") from None
        values["formats"] = tuple((name, n) for name, n in formats.items() if n > 0)
        return replace(self, **values)

    def key(self) -> str:
        blob = json.dumps({"recipe": asdict(self), "formats": self.format_specs()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]
