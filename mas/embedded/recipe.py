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

MIXES = ("formats", "extend", "research")  # the stages' format mixes: (format name, teacher episodes)
RESEARCH_FIELDS = ("research", "research_steps", "research_lr", "research_batch_size", "research_first_turns", "positions")
DEFAULT_MIX: tuple[tuple[str, int], ...] = tuple((f.name, f.episodes) for f in FORMATS.values() if f.episodes > 0)


@dataclass(frozen=True)
class Recipe:
    version: int = 3  # bump when the build code changes, so stale caches are not reused
    seed: int = 0
    formats: tuple[tuple[str, int], ...] = DEFAULT_MIX  # (format name, teacher episodes)
    vocab_size: int = 384
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 6000  # six formats need about 3x the quickstart-only model's 2,000 steps (docs/benchmarks/embedded_recipe.md)
    batch_size: int = 32
    lr: float = 3e-3
    # A second stage from the finished warm start (the recipe with ``extend=()``, its ``base``):
    # ``extend_steps`` more steps at ``extend_lr`` over the same pool plus these formats' turns.
    # A format added to the pool itself reshuffles every other format's start by tens of points
    # (docs/benchmarks/embedded_recipe.md); added here it moves them by a few.  Empty: one stage, and the key
    # is the one the recipe had before stages existed.
    extend: tuple[tuple[str, int], ...] = (("saboteur_solver", 400),)
    extend_steps: int = 600
    extend_lr: float = 5e-4
    # A third stage from the finished two-stage model (``base()``), for teams whose episodes are
    # long: ``research_steps`` steps at ``research_lr``, each on ``research_batch_size`` of these
    # formats' agent invocations (one sequence each, the loss on every one of its turns, at the
    # episodes' own lengths), ``research_first_turns`` of their first turns on their own (short:
    # where a name is first copied from the task), and ``batch_size`` turns of the earlier
    # stages' pool, held to what the base model says there.  The model's positions become
    # ``positions``.  Empty: no third stage, and the key is the one the recipe had before it existed.
    # Shipped: 19,200 episodes of cpu_facts's team over 40 other worlds (FACTS), the flawed
    # teacher's: it leaves every arithmetic config's gain within 3 points and gives the model the
    # 2,048 positions cpu_facts needs, but copies few names, so cpu_facts is a demonstration of the
    # research format on this model, not of learning (docs/benchmarks/research.md; the stages
    # tried after it, not shipped, are in docs/benchmarks/research_stage.md and git history).
    research: tuple[tuple[str, int], ...] = (("facts", 19200),)
    research_steps: int = 4000
    research_lr: float = 2e-3
    research_batch_size: int = 16
    research_first_turns: int = 32
    positions: int = 2048

    def __post_init__(self) -> None:
        unknown = [name for name, _ in self.mixed() if name not in FORMATS]
        if unknown:
            raise ValueError(f"unknown warm-start formats {unknown}; valid: {sorted(FORMATS)}")

    def mixed(self) -> tuple[tuple[str, int], ...]:
        """Every stage's (format name, teacher episodes), in stage order."""
        return (*self.formats, *self.extend, *self.research)

    def format_specs(self) -> dict:
        return {name: FORMATS[name].spec() for name, _ in self.mixed()}

    def base(self) -> Recipe:
        """The recipe this one's last stage starts from: without its research stage, else without
        its second stage (the one-stage warm start)."""
        return replace(self, research=()) if self.research else replace(self, extend=())

    def varied(self, changes: list[str]) -> Recipe:
        """This recipe with ``KEY=VALUE`` changes (``mas build-embedded --recipe``): a number
        (``steps=8000``, ``seed=1``, ``lr=0.002``, ``extend_steps=900``), one format's teacher
        episodes in the warm start (``formats.graph=1600``) or in its second stage
        (``extend.saboteur_solver=400``) or its research stage (``research.facts=9600``); 0 drops
        the format.  A variant has its own key, so it is
        built into its own cache folder and never taken for the project's model."""
        numbers = {f.name: f.type for f in fields(self) if f.name not in MIXES}
        mixes = {mix: dict(getattr(self, mix)) for mix in MIXES}
        values: dict = {}
        for change in changes:
            key, sep, value = change.partition("=")
            try:
                if not sep:
                    raise ValueError("expected KEY=VALUE")
                mix, dot, name = key.partition(".")
                if dot and mix in mixes:
                    if name not in FORMATS:
                        raise ValueError(f"unknown format {name!r}; valid: {sorted(FORMATS)}")
                    mixes[mix][name] = int(value)
                elif key in numbers:
                    values[key] = float(value) if numbers[key] == "float" else int(value)  # annotations are strings here (__future__)
                else:
                    raise ValueError(f"unknown key; valid: {sorted(numbers)}, formats.<name>, extend.<name> "
                                     "or research.<name>")
            except ValueError as e:
                raise ValueError(f"recipe change {change!r}: {e}") from None
        for mix, counts in mixes.items():
            values[mix] = tuple((name, n) for name, n in counts.items() if n > 0)
        return replace(self, **values)

    def key(self) -> str:
        recipe = asdict(self)
        if not self.extend:  # a one-stage recipe keeps the key it had before stages existed
            for name in ("extend", "extend_steps", "extend_lr"):
                del recipe[name]
        if not self.research:  # and a recipe without a research stage the key it had before that stage existed
            for name in RESEARCH_FIELDS:
                del recipe[name]
        blob = json.dumps({"recipe": recipe, "formats": self.format_specs()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]
