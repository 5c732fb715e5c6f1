"""A relay team task whose size is a parameter: N specialists, N sub-problems, and the team is
right only if every part is.

A task strings together ``size`` arithmetic chains (N parts), e.g. for N = 3
``1: 3+4-2 2: 8-5+1 3: 6-1-1`` with the answer ``5 4 4``.  The team it is designed for
(``configs/team_relay_n*.yaml``) is a chain of N specialists with ``topology.parts: true``:
specialist k sees only part k (``Task: 8-5+1``, from ``task.meta["parts"]``), answers it, and
sees no other agent's message; the team's answer is every specialist's answer in order,
space-separated, ``?`` for one that gave none.  The reward is 1 only when the answer has N
words and every word is right: an AND of N parts.  Each specialist can only be right about
its own part, and none can make the team right alone.

Why credit matters here, and more so as N grows.  With one outcome per episode, an
episode-level baseline (GRPO) gives every specialist the same advantage: specialist k's
learning signal is its own correctness times the other N-1 specialists' joint success, and
the other N-1 specialists' luck is noise in its gradient.  With each specialist right with
probability p, the team succeeds with probability p^N, so the share of episodes that tell a
specialist anything shrinks geometrically with N.  A method that compares a specialist
with its own alternatives in the same context (C3's context-matched replays) removes the
others' luck; Shapley or leave-one-out masking cannot: in an AND game every player gets the
same value (R/N), whoever was right.

Ground truth (``info["designed"]``, ``envs/base.py``): specialist k did its job iff its own
answer to part k is right, the k-th turn of the episode being specialist k's (a masked or
removed turn did not).  Scores recorded on each episode (``info["scores"]``, averaged by
evaluation): ``part_1`` .. ``part_N``, whether each word of the team's answer is right, and
``at_once``, the share of specialists that answered without a worked step
(``info["decisions"]``: each specialist's branch, ``decision_of``).

Splits.  The parts come from the ``synthetic_math`` streams with the same settings: a
training task strings training chains, a held-out task held-out chains only, so no part of a
held-out task was seen in training (nor by this format's warm start).  Held-out task ``i``
uses held-out chains ``N·i`` .. ``N·i + N - 1``, so ``eval_size`` tasks need ``N·eval_size``
held-out chains: ``heldout_fraction`` defaults to 0.25, which holds out 1,000 of the 4,000
two-step chains, enough for 100 held-out tasks at N = 8 (a larger eval needs a larger
fraction, as ``mas validate`` says).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mas.types import Episode, Task, Turn

from ..base import designed_outcomes
from ..math.synthetic import Op, stream_id
from ..registry import register_env
from ..verifiers import register_verifier
from .chains import ChainTeamEnv
from .parts import MISSING, decision_of, first_word, part_judgements, part_words, right, verify_part_turn

# the parts' helpers (parts.py) stay importable from here, where they were first written
__all__ = ["MISSING", "TeamRelayConfig", "TeamRelayEnv", "decision_of", "first_word", "part_judgements", "part_words",
           "verify_part_turn"]


class TeamRelayConfig(BaseModel):
    """N arithmetic chains per task, one per specialist; all N results are needed (env section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["team_relay"] = Field(description="Selects this env.")
    size: int = Field(
        default=2, ge=1, le=16,
        description="Parts per task, N: one per specialist, so the team's size (a parts chain of exactly N agents).",
    )
    num_ops: int = Field(default=2, ge=1, description="Binary operations in each part (the difficulty of each part).")
    max_operand: int = Field(default=9, ge=1, description="Operands are drawn uniformly from 0..max_operand.")
    ops: tuple[Op, ...] = Field(default=("+", "-"), description="Operators to draw from; a non-empty subset of '+', '-', '*'.")
    heldout_fraction: float = Field(
        default=0.25, gt=0.0, lt=1.0,
        description="Share of all chains (by stable hash) reserved for held-out parts; a held-out task strings N of them.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the training task stream.")

    @property
    def num_parts(self) -> int:
        """Parts of every task (``task.meta["parts"]``): what a ``parts`` chain must have agents for."""
        return self.size


class TeamRelayEnv(ChainTeamEnv):
    """Env over :class:`TeamRelayConfig`; see the module docstring."""

    name = "team_relay"
    description = {
        "source": "{size} generated arithmetic chains per task ({chains}), one per specialist; reward 1 only if every "
                  "part is right",
        "train_size": "strings of {size} training chains",
        "eval_size": "strings of {size} held-out chains (disjoint from training part by part)",
    }
    eval_shortage = "held-out tasks of {size} parts"

    @staticmethod
    def _join(parts: list[Task]) -> Task:
        return Task(
            task_id="relay-" + "|".join(p.prompt for p in parts),
            prompt=" ".join(f"{k + 1}: {p.prompt}" for k, p in enumerate(parts)),
            answer=" ".join(p.answer for p in parts),
            meta={"parts": [p.prompt for p in parts], "answers": [p.answer for p in parts],
                  "steps": [p.meta["steps"] for p in parts]},
        )

    def _stream_id(self) -> dict[str, Any]:
        return stream_id(self.name, self.cfg, size=self.cfg.size)

    @staticmethod
    def _judge(episode: Episode) -> tuple[list[bool], list[tuple[Turn, bool]], dict[str, str]]:
        """Whether each word of the team's answer is right (none is in place when the answer has a
        word too many or too few), each specialist turn's own part, and each one's branch."""
        gold = episode.task.meta["answers"]
        words = part_words(episode.answer)
        complete = len(words) == len(gold)
        parts = [complete and right(words[k], g) for k, g in enumerate(gold)]
        judged = part_judgements(episode)
        return parts, judged, {t.agent: decision_of(t) for t, _ in judged}

    def score(self, episode: Episode) -> float:
        parts, judged, decisions = self._judge(episode)
        episode.info["scores"] = {**{f"part_{k + 1}": float(ok) for k, ok in enumerate(parts)},
                                  "at_once": sum(d == "at_once" for d in decisions.values()) / len(parts)}
        episode.info["designed"] = designed_outcomes(judged)
        episode.info["decisions"] = decisions
        return float(all(parts))

    verify_turn = staticmethod(verify_part_turn)  # each specialist's own part


register_env("team_relay", TeamRelayConfig, TeamRelayEnv)
register_verifier("team_relay", verify_part_turn)
