"""Core trajectory and credit types shared by every part of mas.

Vocabulary (used in shapes everywhere):
    B  tasks per step            G  episodes per task (group size)
    E  episodes in a batch (B*G) N  flattened turns in a batch (all turns of all episodes)
    L  tokens of one completion

A batch of turns is always flattened in the same order: for each group, for each
episode in the group, for each turn in the episode (turn order).  ``Credit.advantages``
is aligned with that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict

class StepAbandoned(Exception):
    """A stop request (SIGTERM, the first Ctrl-C) cut the training step short at a safe point:
    between generation batches, or between micro-batches of an update before any optimizer
    stepped.  Nothing of the step reached the weights; the trainer checkpoints the state the
    step started from (``mas.training.trainer``)."""


TurnStatus = Literal["stop", "length", "replayed", "masked", "removed", "error"]
EpisodeStatus = Literal["ok", "truncated", "error"]
# Episode.info[FAILURE]: what ended a failed episode (status "error"), as the engine saw it
FAILURE = "failure"
# ... the failures of the team's own making: its code raised (agent_error: e.g. on unparsable structured
# output), it ran past its cap on model calls or past the episode timeout; trainer.train_failed may train these
TEAM_FAILURES = ("agent_error", "model_call_limit", "episode_timeout")
# (the engine's other labels, which no policy's output decides: backend_error, score_error, replay_divergence)


@dataclass
class Task:
    """One problem instance handed to a team."""

    task_id: str
    prompt: str  # the question as shown to the first agent
    answer: str  # ground-truth answer, used only by the verifier
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """One agent message inside an episode."""

    agent: str
    policy: str
    index: int  # position in the episode's call order (0-based)
    parent: int | None  # index of the turn whose output caused this call (None: root)
    messages: list[dict[str, str]]  # chat messages that formed the prompt
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # sampling-time logprob of each completion token
    text: str
    parsed: dict[str, Any] = field(default_factory=dict)  # parser output (answer, call, verdict...)
    valid: bool = True  # did the output parse into the agent's expected format
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    finish_reason: TurnStatus = "stop"
    trainable: bool = True  # False for frozen policies and for masked/removed turns
    replayed: bool = False  # reused token for token from a source episode by a replay/intervention
    extra_rewards: dict[str, float] = field(default_factory=dict)
    # version of the policy's weights that sampled it (updates + loads; None: not sampled, or a
    # backend without versions).  The learner's version minus this is the turn's staleness.
    weight_version: int | None = None
    # the sampling it was drawn with (temperature 0: greedy); None: not sampled here (masked,
    # removed, or recorded before turns kept it).  Replays copy their source's.  The learner
    # scores a turn at its own temperature, so this, not the config, is what TIS and the update read.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Turn":
        return cls(**d)


@dataclass
class Episode:
    """One joint rollout of one task by the whole team."""

    task: Task
    group_id: int  # index of the task in the batch
    sample_id: int  # index of the episode inside its group (0..G-1)
    seed: int  # seed of the rollout that produced it (sampling is seeded per backend batch)
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    reward: float = 0.0
    status: EpisodeStatus = "ok"
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # a failed episode's FAILURE and traceback, a topology's notes

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.__dict__,
            "group_id": self.group_id,
            "sample_id": self.sample_id,
            "seed": self.seed,
            "turns": [t.to_dict() for t in self.turns],
            "answer": self.answer,
            "reward": self.reward,
            "status": self.status,
            "error": self.error,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Episode":
        d = dict(d)
        d["task"] = Task(**d["task"])
        d["turns"] = [Turn.from_dict(t) for t in d["turns"]]
        return cls(**d)


@dataclass
class EpisodeGroup:
    """The G episodes of one task."""

    task: Task
    episodes: list[Episode]


@dataclass
class CreditBatch:
    """Flattened turns of a batch as tensors: the only input credit methods see.

    All per-turn tensors have shape [N]; per-episode tensors have shape [E].
    """

    episode_rewards: torch.Tensor  # [E] float  outcome reward of each episode
    episode_group_ids: torch.Tensor  # [E] long   task index of each episode (0..B-1)
    episode_ids: torch.Tensor  # [N] long   episode index of each turn (0..E-1)
    group_ids: torch.Tensor  # [N] long   task index of each turn (0..B-1)
    agent_ids: torch.Tensor  # [N] long   index into agent_names
    turn_ids: torch.Tensor  # [N] long   position of the turn in its episode
    invalid: torch.Tensor  # [N] bool   the turn's output failed to parse
    trainable: torch.Tensor  # [N] bool   the turn is optimised (frozen/masked turns are not)
    agent_names: list[str]
    turn_rewards: dict[str, torch.Tensor] = field(default_factory=dict)  # named [N] float per-turn signals, 0.0 where a turn lacks one
    # named [N] bool, same keys as turn_rewards: True where the turn carries the signal (its 0.0 is
    # then a real value, not a filler).  A key missing here counts as present on every turn.
    turn_reward_present: dict[str, torch.Tensor] = field(default_factory=dict)
    completion_lengths: torch.Tensor | None = None  # [N] long  completion tokens of each turn
    parent_ids: torch.Tensor | None = None  # [N] long  position of the calling turn in its episode, -1 for none

    @property
    def num_turns(self) -> int:
        return int(self.episode_ids.numel())

    @property
    def num_episodes(self) -> int:
        return int(self.episode_rewards.numel())

    def has_turn_reward(self, key: str) -> torch.Tensor:
        """[N] bool: which turns carry the signal ``key`` (none if no turn does; every turn if
        ``turn_rewards`` has the key but ``turn_reward_present`` does not)."""
        if key not in self.turn_rewards:
            return torch.zeros(self.num_turns, dtype=torch.bool)
        present = self.turn_reward_present.get(key)
        return torch.ones(self.num_turns, dtype=torch.bool) if present is None else present


@dataclass
class Credit:
    """Output of a credit method: one advantage per flattened turn plus a breakdown for reports."""

    advantages: torch.Tensor  # [N] float
    breakdown: dict[str, torch.Tensor] = field(default_factory=dict)  # named [N] or [E] tensors
    train_mask: torch.Tensor | None = None  # [N] bool; False: the method leaves this turn out of the update
    notes: dict[str, list[str]] = field(default_factory=dict)  # named [N] or [E] texts for reports, e.g. critic rationales


def flatten_turns(groups: list[EpisodeGroup]) -> list[tuple[Episode, Turn]]:
    """The canonical flattening order used by CreditBatch and Credit."""
    return [(ep, t) for g in groups for ep in g.episodes for t in ep.turns]


# --- extra evaluations a credit method may plan (docs/architecture.md: plan -> execute -> assign) ---------


@dataclass(frozen=True)
class ReplayRequest:
    """Re-run ``source`` with turns ``0..freeze_upto-1`` frozen (reused token for token).

    Turn ``freeze_upto`` and everything after it are sampled afresh, ``num_samples`` times.
    """

    key: str
    source: Episode
    freeze_upto: int
    num_samples: int = 1


@dataclass(frozen=True)
class InterventionRequest:
    """Re-run ``source`` with ``agents`` masked (placeholder text) or removed (no message).

    With ``keep_others`` the other agents' recorded outputs are reused at the same turn
    positions ("keep the realised outputs of the players in S fixed"); where the topology
    asks for a turn that the source does not have, it is sampled.  Such a reused turn keeps
    its recorded completion and logprobs under a prompt that may now differ: it is marked
    ``replayed`` and never trained on.

    Sampling in ``Engine.execute`` is seeded by its ``seed`` argument for the whole batch of
    requests (requests share backend batches, so they cannot each own an RNG stream).
    """

    key: str
    source: Episode
    agents: tuple[str, ...]
    mode: Literal["mask", "remove"] = "mask"
    keep_others: bool = True
    resample: tuple[str, ...] = ()  # agents always sampled afresh, e.g. the synthesiser that re-reads the masked team


@dataclass(frozen=True)
class CritiqueRequest:
    """Ask ``policy`` (any policy of the team, e.g. a frozen critic) one chat prompt; the result is its text.

    Greedy by default (temperature 0), as LLM critics are run in MAPPA and LLM-MCA.
    """

    key: str
    policy: str
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs; a tuple so the request is hashable
    max_new_tokens: int = 256
    temperature: float = 0.0


Request = ReplayRequest | InterventionRequest | CritiqueRequest
# request key -> the episodes a replay/intervention produced, or [text] for a critique
Results = dict[str, list[Any]]


# ---------------------------------------------------------------------------------------------
# config sections and the episode-context protocol the topologies run against
# ---------------------------------------------------------------------------------------------


class Section(BaseModel):
    """Base of every YAML section: unknown keys are rejected and a loaded config is frozen.  The
    kinds' own configs (a topology's, an env's, a credit method's) derive from it, so they sit
    below the schema that assembles them."""

    model_config = ConfigDict(extra="forbid", frozen=True)


TOOL_LABEL = "tool"  # parsed label of a turn whose tool calls ran (the agent is called again)


@dataclass
class Outcome:
    """What a topology's run of one episode ends with: the team's answer (None: none) and
    whether a turn bound cut it short."""

    answer: str | None
    truncated: bool = False


class EpisodeContext(Protocol):
    """What a topology sees of one episode while it runs it (the engine's ``EpisodeContext``
    implements it): the task, the team's agents, and ``call``, the one way to make an agent
    speak; every turn it makes is recorded on ``episode``."""

    key: int  # the episode's key in the engine's batcher
    episode: Episode
    agents: dict[str, Any]  # name -> Agent (agents/agent.py)
    tokenizers: dict[str, Any]  # policy -> tokenizer
    tools: dict[str, Any]  # env tool name -> ToolSpec
    tool_runner: Any  # runs a tool by name (a sandbox), or None: in this process
    faults: Any  # the engine's fault counter (``add(kind, message)``)
    batcher: Any  # the engine's request batcher (framework adapters tell it when they run tools)
    prompts: Any  # renders prompt ids (shared among a run's episodes)
    greedy: bool

    @property
    def task(self) -> Task: ...

    @property
    def num_turns(self) -> int: ...

    def reserve(self, n: int) -> list[int]: ...

    def stop(self, message: str, fault: str) -> None: ...

    async def call(self, agent_name: str, messages: list[dict[str, str]], parent: int | None = None,
                   index: int | None = None, run_tools: bool = True,
                   framework_tools: frozenset[str] = frozenset(), *, tools: list[dict[str, Any]] | None = None,
                   temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
                   stop: tuple[str, ...] = (), fit_positions: bool = False, prefix: str = "") -> Turn: ...

    def endpoint(self, max_calls: int | None = None, request_sampling: bool = False) -> Any:
        """An async context manager: the episode behind an OpenAI-compatible endpoint while it is
        open (it yields an object with ``base_url``, ``api_key`` and ``rethrow()``)."""
        ...


class Topology(Protocol):
    """A compiled team: runs one episode against its context."""

    async def run(self, ctx: EpisodeContext) -> Outcome: ...
