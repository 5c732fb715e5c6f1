"""Scripts: what ``EpisodeContext.call`` does at each turn of a replayed or intervened episode.

Credit methods plan extra evaluations (docs/architecture.md):
    replay        re-run a recorded episode with turns 0..t-1 frozen token for token
    intervention  re-run with some agents masked (placeholder text) or removed (no message)
A ``Script`` holds the recorded episode and says, per turn index and agent, whether to sample,
replay the recorded turn, or mask or remove the agent (a ``Directive``).  A frozen turn asked
for by another agent than the record holds is a ``ReplayDivergence``: the replay would not be
faithful, so it fails instead of crediting a different run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mas.types import TOOL_LABEL, Episode, Turn

MASK_TEXT = "[masked]"  # what a masked agent says in an intervention


class ReplayDivergence(RuntimeError):
    """A replay asked for something the recorded episode does not hold at a frozen turn: another
    agent, or the same agent with another prompt.  The replay is not faithful, so the episode
    fails with this error (named agent and turn) instead of silently crediting a different run.

    A team is replayable when its control flow (who speaks next, what each agent is shown)
    depends only on the messages so far; see docs/bring_your_own_team.md.
    """

    def __init__(self, message: str, agent: str, turn: int):
        super().__init__(message)
        self.agent = agent
        self.turn = turn


REPLAY_HINT = "a replay needs routing that depends only on the messages so far (docs/bring_your_own_team.md)"


@dataclass(frozen=True)
class Directive:
    kind: Literal["sample", "replay", "mask", "remove"]
    source: Turn | None = None
    check_prompt: bool = False


SAMPLE = Directive("sample")


@dataclass(frozen=True)
class Script:
    source: Episode
    freeze_upto: int = 0  # turns with index < freeze_upto are reused exactly
    masked: tuple[str, ...] = ()
    mode: Literal["mask", "remove"] = "mask"
    keep_others: bool = False  # reuse other agents' recorded outputs at the same positions
    resample: tuple[str, ...] = ()  # ... except these agents, which are always sampled afresh

    def invocation_length(self, index: int, agent: str) -> int:
        """Recorded turns of ``agent``'s invocation starting at ``index``: 1 plus its tool rounds."""
        turns = self.source.turns
        if index >= len(turns) or turns[index].agent != agent:
            return 1
        end = index
        while (end + 1 < len(turns) and turns[end].parsed.get("label") == TOOL_LABEL
               and turns[end + 1].agent == agent and turns[end + 1].parent == turns[end].index):
            end += 1
        return end - index + 1

    def _first_masked(self) -> int:
        """Position of the first recorded turn of a masked agent (turns before it are unaffected)."""
        return next((t.index for t in self.source.turns if t.agent in self.masked), len(self.source.turns))

    def directive(self, index: int, agent: str) -> Directive:
        src = self.source.turns[index] if index < len(self.source.turns) else None
        if agent in self.masked:
            return Directive(self.mode)
        if index < self.freeze_upto:
            if src is None or src.agent != agent:
                found = "no turn" if src is None else repr(src.agent)
                raise ReplayDivergence(f"turn {index}: the team asked for agent {agent!r} where the recorded episode has "
                                       f"{found}; {REPLAY_HINT}", agent, index)
            return Directive("replay", src, check_prompt=True)
        resampled = agent in self.resample and index > self._first_masked()  # before it nothing has changed
        if (self.keep_others and not resampled and src is not None and src.agent == agent
                and src.finish_reason not in ("masked", "removed")):
            return Directive("replay", src)
        return SAMPLE
