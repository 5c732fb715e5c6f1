"""A conjunctive team task: two sub-problems, and the answer is right only if both parts are.

A task pairs two arithmetic chains, e.g. ``A: 3+4-2 B: 8-5+1``, and asks for both results in
order (``5 4``).  The reward is 1 only when the answer holds exactly two results and both
are right: an AND of the two parts.  The team it is designed for (``configs/team_conjunctive.yaml``)
is a chain of two specialists with ``topology.parts: true``: the left one sees only part A
(``Task: 3+4-2``), the right one only part B, and the team's answer is their two answers in
order; each specialist can only be right about its own part, and neither can make the team
right alone.  (It is the two-part case of ``team_relay`` with its own role prompts.  An
earlier layout showed both specialists the whole task line and had a frozen reporter copy
their results; the warm-started tiny model could not find its part in that line, so the
team was right in about 2% of sampled episodes and nothing learned.)

Why credit matters here.  With one outcome per episode, an episode-level baseline (GRPO)
gives both specialists the same advantage, so a specialist who solved its part is blamed
whenever the other one failed: its learning signal is scaled by the other's success rate and
carries the other's noise.  A method that re-samples one agent's turn with the rest of the
transcript fixed (C3's context-matched replays) compares a specialist only with its own
alternatives, given what the other one actually said.  Shapley or leave-one-out masking
cannot separate them: in an AND game both players always get the same value.

Splits.  The parts come from the ``synthetic_math`` streams with the same settings: a
training task pairs training chains, a held-out task pairs held-out chains, so no part of a
held-out task was ever seen in training (nor by the embedded model's warm start).  Held-out
task ``i`` pairs held-out chains ``2i`` and ``2i+1``; ``heldout_fraction`` defaults to 0.2 so
that 400 held-out pairs exist for the default settings.

Scores recorded on each episode (``info["scores"]``, averaged by evaluation): ``part_a`` and
``part_b``, whether each part of the final answer is right.  Ground truth
(``info["designed"]``, ``envs/base.py``): the agent of the first turn did its job iff its own
answer is part A's result, the agent of the second turn iff its own is part B's (a masked or
removed turn did not; a later turn, such as a reporter's, has no designed job).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mas.types import Episode, Task

from ..base import designed_outcomes
from ..math.synthetic import Op
from ..registry import register_env
from ..verifiers import register_verifier
from .chains import ChainTeamEnv
from .parts import part_judgements, right, verify_part_turn

__all__ = ["TeamConjunctiveConfig", "TeamConjunctiveEnv", "answer_integers"]

_INTEGER = re.compile(r"-?\d+")


def answer_integers(text: str | None) -> list[int]:
    """Every integer in ``text`` in order ("5 -4" -> [5, -4]); [] for None."""
    return [int(m) for m in _INTEGER.findall(text or "")][:16]


class TeamConjunctiveConfig(BaseModel):
    """Two arithmetic chains per task; both results are needed (env section of the run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["team_conjunctive"] = Field(description="Selects this env.")
    num_ops: int = Field(default=2, ge=1, description="Binary operations in each part (the difficulty of each part).")
    max_operand: int = Field(default=9, ge=1, description="Operands are drawn uniformly from 0..max_operand.")
    ops: tuple[Op, ...] = Field(default=("+", "-"), description="Operators to draw from; a non-empty subset of '+', '-', '*'.")
    heldout_fraction: float = Field(
        default=0.2, gt=0.0, lt=1.0,
        description="Share of all chains (by stable hash) reserved for held-out parts; a held-out task pairs two of them.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the training task stream.")

    @property
    def num_parts(self) -> int:
        """Parts of every task (``task.meta["parts"]``): what a ``parts`` chain must have agents for."""
        return 2


_RESULT = re.compile(r"-?\d+|\?")


def _results(text: str | None) -> list[str]:
    """The results an answer gives, in order.  Two words are two results, each its word's
    integer or '?' ("5 4", "2, 4", "? 4" from a parts chain whose left specialist gave no
    answer; "five 4" keeps "five" in part A's place); otherwise every integer in the text."""
    words = (text or "").split()
    if len(words) == 2:
        return [next(iter(_RESULT.findall(w)), w) for w in words]
    return _RESULT.findall(text or "")[:16]


class TeamConjunctiveEnv(ChainTeamEnv):
    """Env over :class:`TeamConjunctiveConfig`; see the module docstring."""

    name = "team_conjunctive"
    description = {
        "source": "pairs of generated arithmetic chains ({chains}); reward 1 only if both parts are right",
        "train_size": "pairs of training chains",
        "eval_size": "pairs of held-out chains (disjoint from training part by part)",
    }
    eval_shortage = "held-out pairs"

    @staticmethod
    def _join(chains: list[Task]) -> Task:
        a, b = chains
        return Task(
            task_id=f"conj-{a.prompt}|{b.prompt}",
            prompt=f"A: {a.prompt} B: {b.prompt}",
            answer=f"{a.answer} {b.answer}",
            meta={"parts": [a.prompt, b.prompt], "answers": [a.answer, b.answer],
                  "steps": [a.meta["steps"], b.meta["steps"]]},
        )

    def score(self, episode: Episode) -> float:
        got = _results(episode.answer)
        gold = episode.task.answer.split()
        both = len(got) == 2
        part_a, part_b = both and right(got[0], gold[0]), both and right(got[1], gold[1])
        episode.info["scores"] = {"part_a": float(part_a), "part_b": float(part_b)}
        episode.info["designed"] = designed_outcomes(part_judgements(episode, gold))  # the first two turns: parts A and B
        return float(part_a and part_b)

    verify_turn = staticmethod(verify_part_turn)  # each specialist's own part


register_env("team_conjunctive", TeamConjunctiveConfig, TeamConjunctiveEnv)
register_verifier("team_conjunctive", verify_part_turn)
