"""The Env protocol: where tasks come from and how an episode's outcome is scored.

An env is composed into the training step (``Env.sample_tasks`` -> rollout -> ``Env.score``),
never subclassed: any object with these methods is an env.

An env that offers tools to its agents (HotpotQA's ``search`` and ``read``) also has a
``tools`` attribute: a mapping of tool name to ``mas.tools.ToolSpec``; the names are
listed in ``mas.envs.ENV_TOOLS`` so that configs are checked before anything is built.
``score`` may record named scores on ``episode.info["scores"]`` (HotpotQA: em and f1), which
evaluation reports average.

A designed team task (``envs/team``) also records its ground truth of who did their job:
``episode.info["designed"]`` maps agent name -> 1.0 or 0.0, whether that agent did its own
designed part right in this episode (known by construction, not inferred from the outcome).
Step metrics correlate each agent's advantages with it (``designed_signal``, mas/training/metrics.py).
``designed_outcomes`` builds it, so every task means the same by it.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

from mas.types import Episode, Task, Turn

DESIGNED = "designed"  # the info key of a designed task's per-agent ground truth


@runtime_checkable
class Env(Protocol):
    """A source of training and held-out tasks plus the outcome verifier for them."""

    def sample_tasks(self, n: int) -> list[Task]:
        """The next ``n`` training tasks and advance the cursor by ``n``.

        The stream is fixed by the env's seed: the k-th task drawn is the same in every run,
        and after ``load_state_dict(state_dict())`` the continuation is identical (resume).
        """
        ...

    def eval_tasks(self, n: int) -> list[Task]:
        """The first ``n`` tasks of the held-out split; disjoint from training, no cursor.

        ``eval_tasks(k)`` is a prefix of ``eval_tasks(n)`` for ``k <= n``. Asking for more
        tasks than the split holds raises ValueError.
        """
        ...

    def score(self, episode: Episode) -> float:
        """Outcome reward of ``episode.answer`` against ``episode.task.answer`` (None -> 0.0)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The data cursor, JSON-serialisable, for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a cursor saved by ``state_dict``; a state from another env or seed raises."""
        ...


def check_env_state(state: dict[str, Any], expected: dict[str, Any]) -> int:
    """Validate a saved cursor state and return its cursor.

    ``state`` must hold exactly the keys of ``expected`` plus ``"cursor"``, with the same
    values as ``expected`` (env name, seed, data size...): a state saved by another env or
    stream raises ValueError, because resuming from it would silently change the data order.
    """
    keys = set(expected) | {"cursor"}
    if not isinstance(state, dict) or set(state) != keys:
        raise ValueError(f"env state must be a dict with keys {sorted(keys)}, got {state!r}")
    for key, value in expected.items():
        if state[key] != value:
            raise ValueError(
                f"env state has {key}={state[key]!r} but this env has {key}={value!r}; "
                "resuming from it would change the data order"
            )
    cursor = state["cursor"]
    if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
        raise ValueError(f"env state cursor must be an int >= 0, got {cursor!r}")
    return cursor


def spoke(turn: Turn) -> bool:
    """Whether a turn said anything of its own: turns masked or removed by an intervention did not."""
    return turn.finish_reason not in ("masked", "removed")


def designed_outcomes(judged: Iterable[tuple[Turn, bool]]) -> dict[str, float]:
    """``info["designed"]`` from (turn, did its job) pairs: agent -> 1.0 if every one of its
    judged turns did its job, else 0.0.  A masked or removed turn never did (it said nothing),
    whatever the judgement; agents without a judged turn are absent (they have no designed job)."""
    out: dict[str, float] = {}
    for turn, right in judged:
        ok = bool(right) and spoke(turn)
        out[turn.agent] = float(ok and out.get(turn.agent, 1.0) == 1.0)
    return out
