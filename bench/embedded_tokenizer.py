"""The embedded tokenizer as its tokenizer.json defines it against the one AutoTokenizer loads.

``mas.embedded.artifact.load_tokenizer`` loads the embedded model's tokenizer as the generic
``PreTrainedTokenizerFast`` its files name; ``AutoTokenizer`` picks ``Qwen2Tokenizer`` from
``config.json``'s model type instead, which adds ``<|endoftext|>`` as an id (384) beyond the
model's 384 embeddings and swaps in Qwen's normaliser and pre-tokenizer.  The shipped figures
were measured with the second.  This compares the two on what they produce for the model:

1. the ids of every teacher turn of the recipe's pool (prompts and completions), the text the
   model was built from;
2. the greedy held-out episodes (every turn's completion ids) of every config on the embedded
   model, each as it ships (its own eval_size and seed).

    python bench/embedded_tokenizer.py [--configs quickstart cpu_debate ...]

Nothing here is asserted: the counts go to docs/benchmarks/embedded.md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ["quickstart", "cpu_orchestrator", "cpu_debate", "cpu_chain", "cpu_graph", "team_conjunctive", "team_saboteur",
           "team_relay_n2", "team_relay_n4", "team_relay_n8", "autogen_selector", "langgraph_custom"]


def loaders():
    from transformers import AutoTokenizer

    from mas.embedded.artifact import load_tokenizer

    return {"AutoTokenizer": lambda path: AutoTokenizer.from_pretrained(path), "load_tokenizer": load_tokenizer}


def teacher_turns() -> None:
    from mas.agents.prompts import render_prompt
    from mas.embedded import ARTIFACT_DIR, Recipe
    from mas.embedded.build import _provisional_turns

    recipe = Recipe()
    turns, _ = _provisional_turns(replace(recipe, formats=(*recipe.formats, *recipe.extend), extend=()), log=lambda *_: None)
    a, b = (load(ARTIFACT_DIR) for load in loaders().values())
    differ = sum(render_prompt(a, m) != render_prompt(b, m)
                 or a.encode(c, add_special_tokens=False) != b.encode(c, add_special_tokens=False) for m, c in turns)
    print(f"teacher turns: {differ} of {len(turns)} differ in their ids")


def greedy_episodes(configs: list[str]) -> None:
    import mas.embedded.artifact as artifact
    from mas.api import load_team

    shipped = artifact.load_tokenizer
    got: dict[str, dict[str, list]] = {}
    for label, load in loaders().items():
        artifact.load_tokenizer = load  # what load_embedded (hence every policy on the embedded model) uses
        got[label] = {}
        for name in configs:
            t0 = time.perf_counter()
            with load_team(REPO / "configs" / f"{name}.yaml", ["logging.progress=false"]) as team:
                tasks = team.env.eval_tasks(team.cfg.trainer.eval_size or 100)
                episodes = team.engine.evaluate(tasks, seed=team.cfg.trainer.seed)
            got[label][name] = [[t.completion_ids for t in ep.turns] for ep in episodes]
            accuracy = sum(ep.reward for ep in episodes) / len(episodes)
            print(f"{label:>14} {name:<18} {len(episodes):>4} episodes, accuracy {accuracy:.3f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
    artifact.load_tokenizer = shipped
    (a, b) = got.values()
    for name in configs:
        differ = sum(x != y for x, y in zip(a[name], b[name]))
        print(f"{name}: {differ} of {len(a[name])} greedy episodes differ")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=CONFIGS, help="config names under configs/ (default: every embedded one)")
    args = p.parse_args()
    teacher_turns()
    greedy_episodes(args.configs)


if __name__ == "__main__":
    main()
