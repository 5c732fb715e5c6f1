"""A saboteur team task: the first answer stands unless a later turn overrules it, and the
overruling turn is sometimes harmful.

Tasks are arithmetic chains (the ``synthetic_math`` streams, same splits), scored on the
team's final answer: the most recent answer in the episode.  The team it is designed for
(``configs/team_saboteur.yaml``) is a solver followed by a reviewer who may ACCEPT the
solver's answer (its turn is then irrelevant to the outcome) or REJECT it and write its own
answer, which replaces the solver's.  The reviewer the embedded model was warm-started on
overrules often, and about half of its replacements are wrong: a saboteur.

Why credit matters here.  An episode in which the solver was right and the reviewer
overruled it wrongly scores 0, exactly like one in which the solver was wrong: an
episode-level baseline (GRPO) blames the solver for the reviewer's mistake, so the solver
learns only from the episodes the reviewer left alone.  Counterfactual methods separate the
two: masking the reviewer (SHARP's coalitions) gives the solver's answer its own value, and
re-sampling the reviewer with the solver's turn fixed (C3) scores the reviewer against its
own alternatives.

Scores recorded on each episode (``info["scores"]``, averaged by evaluation):
``first_answer``, whether the episode's first answer was right, and ``overruled``, whether a
right first answer was replaced by a wrong final one (the harm a later turn did).

Ground truth (``info["designed"]``, ``envs/base.py``), turn by turn: the agent of the first
turn (the solver) did its job iff its own answer is right; a later turn (the reviewer) is
judged by its verdict on the answer standing before it: it did wrong iff it overruled a right
answer with a wrong one, or let a wrong answer stand (wrote no answer of its own after it).
Overruling a wrong answer counts as right even when the replacement is wrong too: the
verdict was right, and this design's saboteur is the one that overrules right answers.  A
masked or removed turn did not do its job.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mas.types import Episode, Turn

from ..base import designed_outcomes, spoke
from ..math.synthetic import Op
from ..math.verify import numbers_match, score_answer
from ..registry import register_env
from ..verifiers import register_verifier
from .chains import ChainTeamEnv

__all__ = ["TeamSaboteurConfig", "TeamSaboteurEnv", "designed", "first_answer", "judgements", "verify_saboteur_turn"]


def first_answer(episode: Episode) -> str | None:
    """The first parsed answer of the episode (turns removed by an intervention left no answer)."""
    for t in sorted(episode.turns, key=lambda t: t.index):
        if t.finish_reason != "removed" and t.parsed.get("answer"):
            return t.parsed["answer"]
    return None


def judgements(episode: Episode) -> list[tuple[Turn, bool]]:
    """Each turn with whether it did its job (module docstring): the first turn by its answer,
    each later turn by its verdict on the answer standing before it."""
    gold = episode.task.answer
    judged = []
    standing_right = False  # is the answer standing before this turn right?
    for k, t in enumerate(sorted(episode.turns, key=lambda t: t.index)):
        own = t.parsed.get("answer") if spoke(t) else None
        own_right = own is not None and numbers_match(own, gold)
        if k == 0:
            judged.append((t, own_right))
        elif own is None:  # accepted (or said nothing): the standing answer stays
            judged.append((t, standing_right))
        else:  # overruled: harmful only if a right answer gave way to a wrong one
            judged.append((t, own_right or not standing_right))
        if own is not None or k == 0:
            standing_right = own_right
    return judged


def designed(episode: Episode) -> dict[str, float]:
    """Who did their job (module docstring), per agent."""
    return designed_outcomes(judgements(episode))


def verify_saboteur_turn(episode: Episode, turn: Turn) -> float | None:
    """The turn verifier (``envs/verifiers.py``): the judgement of ``judgements`` for this turn;
    None for a turn that said nothing."""
    for t, ok in judgements(episode):
        if t.index == turn.index:
            return float(ok) if spoke(t) else None
    return None


class TeamSaboteurConfig(BaseModel):
    """Arithmetic chains for a team whose later turns may overrule the first answer (env section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["team_saboteur"] = Field(description="Selects this env.")
    num_ops: int = Field(default=2, ge=1, description="Binary operations per expression: the difficulty knob.")
    max_operand: int = Field(default=9, ge=1, description="Operands are drawn uniformly from 0..max_operand.")
    ops: tuple[Op, ...] = Field(default=("+", "-"), description="Operators to draw from; a non-empty subset of '+', '-', '*'.")
    heldout_fraction: float = Field(default=0.1, gt=0.0, lt=1.0, description="Share of all expressions (by stable hash) reserved for evaluation.")
    seed: int = Field(default=0, ge=0, description="Seed of the training task stream.")


class TeamSaboteurEnv(ChainTeamEnv):
    """Env over :class:`TeamSaboteurConfig`; see the module docstring.  A task is one chain."""

    name = "team_saboteur"
    description = {
        "source": "generated arithmetic chains ({chains}); the final answer is the most recent one",
        "train_size": "synthetic_math's training chains",
        "eval_size": "held-out chains (disjoint from training by hash)",
    }

    def score(self, episode: Episode) -> float:
        reward = score_answer(episode)
        first = first_answer(episode)
        first_right = first is not None and numbers_match(first, episode.task.answer)
        episode.info["scores"] = {"first_answer": float(first_right), "overruled": float(first_right and reward == 0.0)}
        episode.info["designed"] = designed(episode)
        return reward

    verify_turn = staticmethod(verify_saboteur_turn)  # the solver's answer, each reviewer's verdict


register_env("team_saboteur", TeamSaboteurConfig, TeamSaboteurEnv)
register_verifier("team_saboteur", verify_saboteur_turn)
