"""A DSPy program of two modules, a solver and a checker, each on its own LM, written as DSPy's docs
write a program: signatures, ``dspy.ChainOfThought`` modules composed in a ``dspy.Module``, and
``set_lm`` to give each module its own language model.

The solver reasons and proposes an answer; the checker reads the question and the proposed answer,
reasons again and gives the final one.  DSPy's ``ChatAdapter`` writes each call's prompt with its
``[[ ## field ## ]]`` markers and parses the reply's fields; where a reply does not parse, DSPy
retries the call with its ``JSONAdapter``, which asks the endpoint for ``response_format``.

What differs from the docs (examples/README.md): each module's ``dspy.LM`` is ``"openai/<agent>"``
(a YAML agent's name) with ``api_base`` and ``api_key`` from mas (the docs configure one LM for
every module with ``dspy.configure``); ``cache=False``, since a cached reply would be a turn nobody
sampled, and ``num_retries=0``, since a retried request would be a second turn; litellm (DSPy's
client) reads its model cost map from its own copy instead of fetching it
(``LITELLM_LOCAL_MODEL_COST_MAP``), as there is no network; DSPy's console log is off
(``dspy.disable_logging()``), or each reply it cannot parse would print between mas's progress lines.

Trained with mas: ``configs/openai_dspy_program.yaml`` (``kind: openai``).
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402 - after litellm is told not to fetch

dspy.disable_logging()


class SolveAndCheck(dspy.Module):
    def __init__(self, solver_lm: dspy.LM, checker_lm: dspy.LM):
        super().__init__()
        self.solve = dspy.ChainOfThought("question -> answer: int")
        self.check = dspy.ChainOfThought("question, proposed_answer: int -> answer: int")
        self.solve.set_lm(solver_lm)
        self.check.set_lm(checker_lm)

    def forward(self, question: str) -> dspy.Prediction:
        proposed = self.solve(question=question).answer
        return self.check(question=question, proposed_answer=proposed)


def run_team(task: str, base_url: str, api_key: str) -> str:
    solver = dspy.LM("openai/solver", api_base=base_url, api_key=api_key, cache=False, num_retries=0)
    checker = dspy.LM("openai/checker", api_base=base_url, api_key=api_key, cache=False, num_retries=0)
    program = SolveAndCheck(solver, checker)
    return str(program(question=task).answer)
