"""The parsers read what a real model writes: labelled turns of SmolLM2-135M-Instruct in the smol teams.

``tests/data/real_outputs.jsonl`` holds one turn per line, ``{config, phase, agent, parser, text,
expected, valid}``: ``text`` is what the model wrote (never edited, never invented), ``expected`` and
``valid`` are what the parser should return, labelled by hand by reading what the model meant.

How it was collected (bench/collect_real_outputs.py, 1 torch thread, the wheel's SmolLM2-135M-Instruct
at each agent's own sampling temperature)::

    OMP_NUM_THREADS=1 python bench/collect_real_outputs.py --out t.jsonl --tasks 2 --group 2 \\
        --config configs/smol_orchestrator.yaml                              # seed 0
    OMP_NUM_THREADS=1 python bench/collect_real_outputs.py --out t.jsonl --tasks 4 --group 2 --seed 1
    OMP_NUM_THREADS=1 python bench/collect_real_outputs.py --out t.jsonl --tasks 4 --group 2 --seed 1 \\
        --warmup-steps 10
    OMP_NUM_THREADS=1 python bench/collect_real_outputs.py --out t.jsonl --tasks 8 --group 2 --seed 2 \\
        --config configs/smol_langgraph.yaml [--warmup-steps 10]              # more verdicts

The second and third cover every ``configs/smol_*.yaml``; phase ``raw`` is the model as it ships,
``warm`` after 10 supervised steps of the team's format warm-up.  Of the 481 turns, exact duplicates
(same parser, same text) were dropped.  The researcher's turns (parser ``raw``) held no tool call.

Labelling rules (one reading for all entries):
    answer marker   ``ANSWER:`` (any case, Markdown around it, "An answer: 10") or a sentence that says
                    the answer is a value ("The answer is 9.", "so answer is 9", "The answer to this
                    puzzle is 9.", "The final answer is 140.") makes a valid turn; the answer is the
                    value as stated on that line: without a trailing full stop, without a new clause
                    or computation after it ("18, and 2 large pizzas ..." -> 18; "18 18-9 = 17 ..." ->
                    18), but a hedge or a mixed statement stays whole for the verifier to reject ("2
                    and the result is 9").  Of several "the answer is" sentences the last is the
                    conclusion; of several ``ANSWER:`` markers the first.
    not a marker    "answer is" describing an answer rather than giving one ("Your answer is correct",
                    "This answer is the same as ...", "the offered answer is", "An alternative to
                    the answer is", "The answer is an answer"); a marker with nothing after it (cut
                    off: "The answer is ", "The answer is indeed ("); a marker copied from the prompt
                    ("end with ANSWER: and the result.");  a debate transcript line quoted from
                    another debater ("- beta: ... ANSWER: 9").
    no marker       the turn is invalid.  Its answer is read only where the text's final statement is
                    one number: a bare number ("8"), an equation's result ("8 + 4 = 12.", "2-6 = 7-2
                    = 1."), "the sum of 2 and 3 is 5.", a value named the answer ("1 is the answer",
                    "540, which is also the answer"), a number with a remark after it ("10
                    (doubling)").  Prose merely mentioning a number is no answer ("... ended with the
                    answer of 11"), nor is a text that goes on past its last result into other prose,
                    a copied prompt or a cut-off sentence ("= 9 So there is only 1 end of the
                    answer.", "8 + 4 = 12\\n\\nThe answer"), nor two numbers ("10 and 20."), nor a
                    quoted debater ("- Beta: 19"), nor words (HotpotQA text without a marker).
    orchestrator    ``CALL <agent>: <subtask>`` is a call whatever the subtask says (the specialist
                    copes with it); the subtask is the rest of its line up to a following ", then"
                    plan ("CALL adder: 8+4, then after ..." -> "8+4"); a misspelt marker ("CCALL")
                    is none.  Without a CALL or answer marker nothing is read: a bare number or "45
                    (the final result)" is no answer from the orchestrator.
    verdict         ACCEPT / REJECT (also Accept, Accepted) as a verdict word: in capitals anywhere
                    ("ALLOCATE ACCEPT", "Refocus: ACCEPT"), in lower case unless prose makes it
                    hypothetical or negated ("advocacy to be accepted").  A one-word judgement that
                    answers the prompt's question ("Right.": the prompt says ACCEPT if it is right) is a verdict;
                    a bare "no", a number or an arithmetic line is none.  An answer the checker
                    states is read as for the answer parser, and without a verdict the turn is invalid.
    raw             the whole text, stripped.

Judgement calls (labelled by the rules above): "The answer is 2 and the result is 9." (kept whole);
"The answer is. 9" (9, but invalid: the sentence ends before the value); "CALL adder: a+b (the adder
adds)" (the prompt's template, but a well-formed call); "She will receive 1" at a cut-off end (read
as 1); "no" and 'No, the offered answer is "no"' from a checker (no verdict).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mas.agents.parsers import PARSERS

FIXTURE = Path(__file__).parents[1] / "data" / "real_outputs.jsonl"
ENTRIES = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


def _id(i: int, e: dict) -> str:
    return f"{i}-{e['config'].removesuffix('.yaml')}-{e['phase']}-{e['agent']}"


@pytest.mark.parametrize("entry", ENTRIES, ids=[_id(i, e) for i, e in enumerate(ENTRIES)])
def test_parser_reads_what_the_model_meant(entry):
    assert PARSERS[entry["parser"]](entry["text"]) == (entry["expected"], entry["valid"])


def test_fixture_is_large_real_and_covers_every_parser():
    assert len(ENTRIES) >= 200
    assert all(set(e) == {"config", "phase", "agent", "parser", "text", "expected", "valid"} for e in ENTRIES)
    assert len({(e["parser"], e["text"]) for e in ENTRIES}) == len(ENTRIES)  # no exact duplicates
    per_parser = Counter(e["parser"] for e in ENTRIES)
    assert set(per_parser) == {"answer", "orchestrator", "verdict", "raw"}
    assert min(per_parser[p] for p in ("answer", "orchestrator", "verdict")) >= 40
    assert {e["phase"] for e in ENTRIES} == {"raw", "warm"}
    configs = {e["config"] for e in ENTRIES}
    assert len(configs) >= 7 and all((Path(__file__).parents[2] / "configs" / c).is_file() for c in configs)
    # both outcomes of every parser that can fail
    for parser in ("answer", "orchestrator", "verdict"):
        assert {e["valid"] for e in ENTRIES if e["parser"] == parser} == {True, False}, parser
