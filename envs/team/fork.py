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

from pydantic import Field

from mas.types import Episode

from ..base import designed_outcomes
from ..registry import register_env
from ..verifiers import register_verifier
from .parts import verify_part_turn
from .relay import TeamRelayConfig, TeamRelayEnv

__all__ = ["TeamForkConfig", "TeamForkEnv"]


class TeamForkConfig(TeamRelayConfig):
    """N arithmetic chains per task, one per specialist, each answered at once or worked out; the reward is
    the fraction of parts right (env section).  The relay's settings, which give the relay's tasks; here
    ``num_ops`` is also how much an at-once answer has to skip."""

    name: Literal["team_fork"] = Field(description="Selects this env.")  # type: ignore[assignment]


class TeamForkEnv(TeamRelayEnv):
    """Env over :class:`TeamForkConfig`; see the module docstring.  Tasks, splits and the task
    stream are the relay's (the same settings give the same tasks); the score is this env's."""

    name = "team_fork"
    description = {
        **TeamRelayEnv.description,
        "source": "{size} generated arithmetic chains per task ({chains}), one per specialist, each answered at once "
                  "or worked out; reward: the fraction of parts right",
    }

    def score(self, episode: Episode) -> float:
        parts, judged, decisions = self._judge(episode)
        episode.info["designed"] = designed_outcomes(judged)
        episode.info["decisions"] = decisions
        episode.info["scores"] = {
            **{f"part_{k + 1}": float(ok) for k, ok in enumerate(parts)},
            "all_parts": float(all(parts)),
            "at_once": sum(d == "at_once" for d in decisions.values()) / len(parts),
        }
        return sum(parts) / len(parts)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("env") != self.name:
            raise ValueError(f"the saved task stream is env {state.get('env')!r}'s; this env is 'team_fork'")
        super().load_state_dict(state)


register_env("team_fork", TeamForkConfig, TeamForkEnv)
register_verifier("team_fork", verify_part_turn)
