"""A parts team with a decision at every agent: answer at once, or work the part out.

A task strings together ``size`` arithmetic chains, one per specialist, exactly as
``team_relay`` does (``1: 3+4-2 2: 8-5+1 ...``; specialist k sees only ``Task: <part k>``).
What differs is what the team is for:

* **A fork at every agent** (a *controlled bifurcation point*): a specialist may answer at
  once (``ANSWER: 5``: short, and for a small model mostly wrong) or work the part out
  (``3+4=7 7-2=5 ANSWER: 5``: longer, mostly right).  The team's warm start
  (``trainer.warmup`` with the parts teacher at ``p_direct: 0.7``, ``configs/team_fork_n*.yaml``)
  takes the short branch more often than not, so its *greedy* policy answers at once on most
  parts: the decision that RL must change is the one a deployed, greedy team makes.  The
  right decision (work it out) does not depend on the chain, so it carries over to held-out
  tasks, whose chains no training task holds.
* **Credit by parts.** The reward is the fraction of parts right (``all_parts``, the AND the
  relay uses, is recorded beside it).  Every specialist's own part moves the outcome, so an
  episode-level baseline (GRPO) has a signal at any N, but it shares it with the N - 1 others'
  luck: the correlation of a specialist's advantage with its own part falls as 1/sqrt(N).  An
  outcome that adds parts is a game whose Shapley value is each player's own part (SHARP
  recovers it from masked coalitions), and a context-frozen replay of one specialist changes
  the outcome by its own part alone (C3): outcome-only methods can recover what the turn
  verifier (``verified``) is handed.  In the relay's AND they cannot (``relay.py``).

Recorded on every episode: ``info["designed"]`` (each specialist: its own part right, the
relay's ground truth), ``info["decisions"]`` (each specialist: ``at_once`` or ``worked``,
``decision_of``), and in ``info["scores"]`` (averaged by every evaluation) ``part_1`` ..
``part_N``, ``all_parts`` and ``at_once``, the share of specialists that answered at once.

Splits and sizes are the relay's: held-out tasks string held-out chains only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mas.types import Episode, Task, Turn

from ..base import designed_outcomes
from ..math.synthetic import Op
from ..registry import register_env
from ..verifiers import register_verifier
from .parts import decision_of, part_judgements, part_words, right, verify_part_turn
from .relay import TeamRelayConfig, TeamRelayEnv

__all__ = ["TeamForkConfig", "TeamForkEnv"]


class TeamForkConfig(BaseModel):
    """N arithmetic chains per task, one per specialist, each answered at once or worked out; the reward is
    the fraction of parts right (env section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["team_fork"] = Field(description="Selects this env.")
    size: int = Field(default=2, ge=1, le=16, description="Parts per task, N: one per specialist (a parts chain of exactly N agents).")
    num_ops: int = Field(default=2, ge=1, description="Binary operations in each part (how much an at-once answer has to skip).")
    max_operand: int = Field(default=9, ge=1, description="Operands are drawn uniformly from 0..max_operand.")
    ops: tuple[Op, ...] = Field(default=("+", "-"), description="Operators to draw from; a non-empty subset of '+', '-', '*'.")
    heldout_fraction: float = Field(
        default=0.25, gt=0.0, lt=1.0,
        description="Share of all chains (by stable hash) reserved for held-out parts; a held-out task strings N of them.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the training task stream.")

    @property
    def num_parts(self) -> int:
        """Parts of every task: what a ``parts`` chain must have agents for."""
        return self.size


class TeamForkEnv:
    """Env over :class:`TeamForkConfig`; see the module docstring.  Tasks, splits and the task
    stream are the relay's (the same settings give the same tasks); the score is this env's."""

    def __init__(self, cfg: TeamForkConfig) -> None:
        self.cfg = cfg
        self.relay = TeamRelayEnv(TeamRelayConfig(name="team_relay", **cfg.model_dump(exclude={"name"})))

    def sample_tasks(self, n: int) -> list[Task]:
        return self.relay.sample_tasks(n)

    def eval_tasks(self, n: int) -> list[Task]:
        return self.relay.eval_tasks(n)

    def score(self, episode: Episode) -> float:
        gold = episode.task.meta["answers"]
        words = part_words(episode.answer)
        complete = len(words) == len(gold)  # a word too many or too few: no part is in place
        parts = [complete and right(words[k], g) for k, g in enumerate(gold)]
        judged = part_judgements(episode)
        decisions = {t.agent: decision_of(t) for t, _ in judged}
        episode.info["designed"] = designed_outcomes(judged)
        episode.info["decisions"] = decisions
        episode.info["scores"] = {
            **{f"part_{k + 1}": float(ok) for k, ok in enumerate(parts)},
            "all_parts": float(all(parts)),
            "at_once": sum(d == "at_once" for d in decisions.values()) / len(gold),
        }
        return sum(parts) / len(gold)

    def verify_turn(self, episode: Episode, turn: Turn) -> float | None:
        return verify_part_turn(episode, turn)

    def describe(self) -> dict[str, Any]:
        """Data source and size, for the reporting checklist."""
        c = self.cfg
        return {
            "name": "team_fork",
            "source": f"{c.size} generated arithmetic chains per task ({c.num_ops} ops over 0..{c.max_operand}, "
                      f"ops {''.join(c.ops)}), one per specialist, each answered at once or worked out; "
                      "reward: the fraction of parts right",
            "train_size": f"strings of {c.size} training chains",
            "eval_size": f"strings of {c.size} held-out chains (disjoint from training part by part)",
        }

    def state_dict(self) -> dict[str, Any]:
        return {**self.relay.state_dict(), "env": "team_fork"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("env") != "team_fork":
            raise ValueError(f"the saved task stream is env {state.get('env')!r}'s; this env is 'team_fork'")
        self.relay.load_state_dict({**state, "env": "team_relay"})


register_env("team_fork", TeamForkConfig, TeamForkEnv)
register_verifier("team_fork", verify_part_turn)
