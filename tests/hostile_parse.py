"""Feed every parser of model output every hostile input of tests/data/hostile_outputs.jsonl.

Run as a script (``python tests/hostile_parse.py``) by tests/test_hostile_outputs.py, in a
subprocess with a hard timeout, so that a parser that hangs fails the test instead of
hanging CI.  Prints one JSON line per (parser, input) as it finishes: its wall time and the
size of the input.  ``--only NAME`` runs one parser.

Each catalogue row builds its input as ``prefix + unit * repeat + suffix``; ``repeat:
"fill"`` repeats the unit up to 1 MB.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

CATALOGUE = Path(__file__).parent / "data" / "hostile_outputs.jsonl"
SIZE = 1_000_000


def build(row: dict) -> str:
    unit, prefix, suffix = row["unit"], row["prefix"], row["suffix"]
    repeat = row["repeat"]
    if repeat == "fill":
        repeat = max(1, (SIZE - len(prefix) - len(suffix)) // len(unit))
    return prefix + unit * repeat + suffix


def parsers() -> dict:
    """Every function that reads model output (text in, something small out)."""
    from mas.agents.parsers import parse_answer, parse_orchestrator, parse_raw, parse_verdict
    from mas.tools import parse_tool_calls
    from mas.credit.critic import parse_credit_json, parse_process_score
    from mas.envs.math.verify import answer_key, numbers_match, read_answer, unmarked_answer
    from mas.envs.research.metrics import f1_score

    return {
        "tool_calls": parse_tool_calls,
        "answer": parse_answer,
        "orchestrator": parse_orchestrator,
        "verdict": parse_verdict,
        "raw": parse_raw,
        "math_answer": read_answer,
        "math_match": lambda text: numbers_match(text, "18"),
        "math_unmarked": unmarked_answer,
        "debate_vote_key": answer_key,
        "critic_score": parse_process_score,
        "critic_json": lambda text: parse_credit_json(text, {"lead": 2, "helper": 1}),
        "qa_f1": lambda text: f1_score(text, "the Seine river"),  # exact match reads the same normalisation
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run one parser")
    args = ap.parse_args()
    rows = [json.loads(line) for line in CATALOGUE.read_text(encoding="utf-8").splitlines()]
    inputs = [(row["name"], build(row)) for row in rows]
    for name, fn in parsers().items():
        if args.only and name != args.only:
            continue
        for input_name, text in inputs:
            print(json.dumps({"parser": name, "input": input_name, "start": True}), flush=True)
            t0 = time.perf_counter()
            fn(text)
            seconds = time.perf_counter() - t0
            print(json.dumps({"parser": name, "input": input_name, "chars": len(text), "seconds": round(seconds, 4)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
