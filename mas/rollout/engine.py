"""The rollout engine: runs joint episodes concurrently and records every turn.

Each episode is one run of the team's compiled LangGraph graph (``mas.topologies``).  Graph
nodes call agents through ``EpisodeContext.call``; those calls become ``GenRequest``s that
the ``Batcher`` (``mas.rollout.batcher``) collects from all running episodes and hands to the
backend as one ``generate_batch`` (one ``generate`` per policy and sampling setting).

The same machinery executes the extra evaluations credit methods plan (docs/architecture.md):
    replay        re-run a recorded episode with turns 0..t-1 frozen token for token
    intervention  re-run with some agents masked (placeholder text) or removed (no message)
A ``Script`` (``mas.rollout.script``) tells ``EpisodeContext.call`` what to do at each turn index.

Tools (``mas/tools.py``): every generation is one Turn.  When an agent with tools writes
tool calls, ``EpisodeContext.call`` runs them with the env's tools, records the calls and
their observations on that Turn, and calls the agent again with the observations appended
to its messages, until it replies without a tool call or its ``max_tool_calls`` are spent;
the topology gets the final turn.  A replayed turn reuses its recorded calls and
observations (the tools are not run again), so a replay is faithful whatever the tool does.
Tool functions run in a ``mas.process.sandbox.Sandbox`` (worker processes with a time limit, a memory
limit and no network), off the event loop, so a slow tool holds up only its own episode.
A masked or removed tool-using agent occupies as many turn positions as its recorded
invocation did (all but the last are 'removed' placeholders), so the other agents' turns
keep their recorded positions and ``keep_others`` can reuse them.

Everything here is deterministic for a seed: asyncio runs tasks in a fixed order, pending
requests are sorted by (episode, turn) before each batch, and each ``generate_batch`` gets
the seed (seed, batch number), from which the backend seeds every policy's sampling on its
own (``mas.rollout.backends.base.policy_seed``), wherever that policy is served.

Faults (docs/architecture.md: a failed episode is kept, marked, scored 0 and counted; the step goes on)
are counted by kind in ``Engine.faults`` (``FAULT_KINDS``); the trainer takes the counts of
each step into its metrics (``take_faults``), with the first message of each kind.

Stopping an episode.  A framework team (an AutoGen Swarm that stops only on a text, a LangGraph
cycle) may never end by itself, and cancelling its task is not enough: AutoGen's clean-up
waits for its agents, which go on calling their models.  So an episode is stopped through its
context (``EpisodeContext.stop``): from then on every model call of the episode raises
``EpisodeStopped`` instead of answering (its requests waiting for a batch included), the
framework's loop unwinds on that error, and the episode is marked failed with the stop's fault
kind.  The engine stops an episode at ``runtime.episode_timeout_s``; a framework adapter stops
it at its cap on model calls.  After a timeout the engine waits for the episode to unwind at
most as long again (the injected ``sleep``), then leaves it behind; the run's own clean-up
gives tasks still running a short, bounded time (``LEFTOVER_GRACE_S``) and never waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import dataclasses
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Awaitable, Mapping
from typing import Any, Callable

from mas.agents.agent import Agent
from mas.agents.prompts import PromptCache, text_ids
from mas.tools import TOOL_VALID_KEY, ToolSpec, has_tool_call, parse_tool_calls, run_tool_call, skipped_call, tool_results_message
from mas.rollout.backends.base import Backend, GenRequest, GenResult
from mas.rollout.batcher import Batcher
from mas.rollout.endpoint import Door, episode_endpoint
from mas.envs.verifiers import VERIFIED, TurnVerifier, check_score
from mas.process.sandbox import Sandbox
from mas.types import (
    CritiqueRequest,
    Episode,
    FAILURE,
    EpisodeGroup,
    InterventionRequest,
    ReplayRequest,
    Request,
    Results,
    Task,
    TOOL_LABEL,
    Topology,
    Turn,
)
from mas.types import Outcome  # noqa: F401 - pickles written before it moved to mas.types name it here (mas.engine.Outcome)

from mas.rollout.faults import FAULT_KINDS, Faults
from mas.rollout.positions import fit_budget, model_positions
from mas.rollout.script import MASK_TEXT, REPLAY_HINT, SAMPLE, Directive, ReplayDivergence, Script

LEFTOVER_GRACE_S = 1.0  # wall time a run's clean-up gives tasks still running (cancelled) before it leaves them


class EpisodeStopped(RuntimeError):
    """A model call refused because its episode is over: past ``runtime.episode_timeout_s``
    (``fault`` "episode_timeout"), or past a framework team's cap on model calls
    ("model_call_limit").  A framework team's loop unwinds on it; the engine marks the episode
    failed with this message and counts the fault."""

    def __init__(self, message: str, fault: str):
        super().__init__(message)
        if fault not in FAULT_KINDS:
            raise KeyError(f"unknown fault kind {fault!r}; valid: {sorted(FAULT_KINDS)}")
        self.fault = fault


_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(Turn))


def _calls_any(text: str, names: frozenset[str]) -> bool:
    """Does ``text`` call one of the tools ``names`` (tools a framework runs, not the engine)?"""
    return bool(names) and has_tool_call(text) and any(c.name in names for c in parse_tool_calls(text))


def _copy_turn(src: Turn, **changes: Any) -> Turn:
    """``dataclasses.replace(copy.deepcopy(src), **changes)`` without copying the fields that
    ``changes`` replace (a replayed turn gets its own messages and prompt ids, the longest
    fields).  The rest are deep-copied with one memo, so the copy shares nothing with ``src``
    and keeps any sharing among its own fields, exactly as the whole deepcopy did."""
    memo: dict[int, Any] = {}
    return Turn(**{name: copy.deepcopy(getattr(src, name), memo) for name in _TURN_FIELDS if name not in changes}, **changes)


@dataclass(frozen=True)
class _Overrides:
    """A call's own settings (``EpisodeContext.call``); None / () leave the agent's."""

    tools: list[dict[str, Any]] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    fit_positions: bool = False
    prefix: str = ""  # the first generation's forced start (a tool call a request asks for, a JSON reply's "{")


_NO_OVERRIDES = _Overrides()


def _cut_at_stop(res: GenResult, stop: tuple[str, ...], tokenizer: Any) -> GenResult:
    """``res`` ended at the first of the ``stop`` texts: its ids and logprobs up to the first
    token whose decoded prefix holds one, its text up to where that stop begins."""
    if not any(s and s in res.text for s in stop):
        return res
    ids = res.completion_ids
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        hits = [text.find(s) for s in stop if s and s in text]
        if hits:
            return GenResult(completion_ids=list(ids[:k]), logprobs=list(res.logprobs[:k]), text=text[:min(hits)],
                             finish_reason="stop", weight_version=res.weight_version)
    return res  # the text holds a stop only across what decoding the ids gives: keep it whole


# ---------------------------------------------------------------------------------------------
# per-episode context handed to topology nodes
# ---------------------------------------------------------------------------------------------


class EpisodeContext:
    """What a topology node needs to call agents inside one episode: the engine's implementation of
    the protocol ``mas.types.EpisodeContext`` that topologies are written against."""

    def __init__(
        self,
        key: int,
        episode: Episode,
        agents: dict[str, Agent],
        tokenizers: dict[str, Any],
        trainable: dict[str, bool],
        batcher: Batcher,
        script: Script | None = None,
        greedy: bool = False,
        tools: Mapping[str, ToolSpec] | None = None,
        tool_runner: Callable[..., Any] | None = None,
        faults: Faults | None = None,
        prompts: PromptCache | None = None,
        positions: Mapping[str, int | None] | None = None,
    ):
        """``prompts``: renders prompt ids (the engine shares one memo among a run's episodes);
        ``positions``: each policy's model's positions, which a call with ``fit_positions`` is fitted to."""
        self.key = key
        self.positions = dict(positions or {})
        self.tools = dict(tools or {})
        self.tool_runner = tool_runner  # runs a tool by name (a Sandbox); None: in this process
        self.faults = faults if faults is not None else Faults()
        self.backend_failed = False  # set when a generation raised: the episode's error is the backend's
        self.episode = episode
        self.agents = agents
        self.tokenizers = tokenizers
        self.trainable = trainable
        self.batcher = batcher
        self.script = script
        self.greedy = greedy
        self.prompts = prompts if prompts is not None else PromptCache()
        self._next = 0
        self.stopped: EpisodeStopped | None = None  # set by ``stop``: every later model call raises it

    def stop(self, message: str, fault: str) -> None:
        """End the episode from outside its code: every model call from now on raises
        ``EpisodeStopped(message, fault)``, and so do the calls waiting for a batch.  The first
        stop is the one that counts."""
        if self.stopped is None:
            self.stopped = EpisodeStopped(message, fault)
        self.batcher.drop(self.key, self._refusal())

    def _refusal(self) -> EpisodeStopped:
        """A fresh copy of the stop's error for one refused call (each raise keeps its own traceback)."""
        assert self.stopped is not None
        return EpisodeStopped(str(self.stopped), self.stopped.fault)

    @property
    def task(self) -> Task:
        return self.episode.task

    @property
    def num_turns(self) -> int:
        return self._next

    def reserve(self, n: int) -> list[int]:
        """Turn indices for n calls made concurrently (their order is fixed here, not by timing)."""
        out = list(range(self._next, self._next + n))
        self._next += n
        return out

    def endpoint(self, max_calls: int | None = None, request_sampling: bool = False) -> contextlib.AbstractAsyncContextManager[Door]:
        """This episode behind the OpenAI-compatible endpoint (``mas.rollout.endpoint``): ``async with
        ctx.endpoint() as door`` gives the ``door.base_url`` a team's own code sends its requests
        to, each one a ``call`` of the agent it names, while the block runs.  ``max_calls``: the
        cap on its model calls (fault ``model_call_limit``); ``request_sampling``: use a request's
        temperature and top_p instead of the agent's."""
        return episode_endpoint(self, max_calls, request_sampling)

    def _directive(self, index: int, agent_name: str) -> Directive:
        return self.script.directive(index, agent_name) if self.script else SAMPLE

    async def call(
        self,
        agent_name: str,
        messages: list[dict[str, str]],
        parent: int | None = None,
        index: int | None = None,
        run_tools: bool = True,
        framework_tools: frozenset[str] = frozenset(),
        *,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        stop: tuple[str, ...] = (),
        fit_positions: bool = False,
        prefix: str = "",
    ) -> Turn:
        """One invocation of an agent: its reply, after any tool rounds (each one more Turn).

        ``run_tools=False`` is for a framework that runs the agent's tool calls itself (an
        AutoGen agent, a LangGraph ToolNode): the one generation comes back as is, with no
        tool round here; the caller records the calls and observations on the turn.
        ``framework_tools``: with ``run_tools``, the tools a framework runs for this agent
        besides its env tools; a generation that calls one of them comes back as is (the
        framework runs its calls), one that calls only env tools gets its tool rounds here.

        Per-call settings (a caller that serves a protocol, e.g. the OpenAI-compatible endpoint;
        left out, a call samples as before): ``tools``, OpenAI-style function specs rendered by
        the agent's chat template (``mas.agents.prompts.template_takes_tools``); ``temperature``
        and ``top_p`` instead of the agent's (a greedy run stays greedy); ``max_new_tokens``, at
        most the agent's own budget; ``stop``, texts that end the completion: it is cut after the
        first token whose text holds one (the ids and logprobs with it, so the turn keeps what
        was sampled up to there), and the text before the stop is its reply.  ``fit_positions``: a
        team whose prompts are code (the framework adapters) has each generation fitted to its
        model's positions (``mas.rollout.positions``; the built-in topologies' are bounded at validate).
        ``prefix``: the start of the reply, forced (``mas.tools.forced_call_start``: a call that a
        request's ``tool_choice`` asks for; the ``{`` of a JSON reply).  Its ids follow the rendered prompt in the turn's
        ``prompt_ids``, so the model continues it and only what it sampled is trained; the turn's
        text is the prefix and the continuation.  It forces the invocation's first generation only,
        not the tool rounds after it.
        """
        over = _Overrides(tools, temperature, top_p, max_new_tokens, tuple(stop), fit_positions, prefix)
        if self.stopped is not None:
            raise self._refusal()
        if agent_name not in self.agents:
            raise KeyError(f"no agent {agent_name!r} in this team; valid: {sorted(self.agents)}")
        agent = self.agents[agent_name]
        if index is None:
            index = self.reserve(1)[0]
        d = self._directive(index, agent_name)
        if d.kind in ("mask", "remove"):  # keep the recorded positions of later turns (tool rounds)
            for _ in range(self.script.invocation_length(index, agent_name) - 1):
                await self._turn(agent_name, messages, parent, index, Directive("remove"), 0, over=over)
                index = self.reserve(1)[0]
        if not run_tools:
            return await self._turn(agent_name, messages, parent, index, d, 0, run_tools=False, over=over)
        turn = await self._turn(agent_name, messages, parent, index, d, agent.max_tool_calls, framework_tools=framework_tools,
                                over=over)
        over = dataclasses.replace(over, prefix="")  # the tool rounds' replies are the agent's own
        used = 0
        # (a replayed turn whose calls the framework ran carries the label too: it ends the invocation here)
        while turn.parsed.get("label") == TOOL_LABEL and not _calls_any(turn.text, framework_tools):
            used += len(turn.tool_calls)
            left = agent.max_tool_calls - used
            messages = messages + [{"role": "assistant", "content": turn.text},
                                   {"role": "user", "content": tool_results_message(turn.observations, left)}]
            index = self.reserve(1)[0]
            turn = await self._turn(agent_name, messages, turn.index, index, self._directive(index, agent_name), left,
                                    framework_tools=framework_tools, over=over)
        return turn

    async def _turn(
        self, agent_name: str, messages: list[dict[str, str]], parent: int | None, index: int, d: Directive, tool_budget: int,
        run_tools: bool = True, framework_tools: frozenset[str] = frozenset(), over: "_Overrides | None" = None,
    ) -> Turn:
        """One generation (sampled, replayed, masked or removed), recorded on the episode."""
        if self.stopped is not None:  # stopped during this invocation (its tool rounds)
            raise self._refusal()
        over = over or _NO_OVERRIDES
        agent = self.agents[agent_name]
        tokenizer = self.tokenizers[agent.policy]
        prompt_ids = self.prompts.render(tokenizer, messages, tools=over.tools)
        if over.prefix:  # the reply's forced start: part of the prompt the model continues
            prompt_ids = prompt_ids + text_ids(tokenizer, over.prefix)
        base = dict(agent=agent_name, policy=agent.policy, index=index, parent=parent, messages=messages, prompt_ids=prompt_ids)
        if d.kind == "replay":
            src = d.source
            assert src is not None
            if d.check_prompt and src.prompt_ids != prompt_ids:
                raise ReplayDivergence(f"turn {index} (agent {agent_name!r}): the prompt differs from the recorded one; "
                                       f"{REPLAY_HINT}", agent_name, index)
            turn = _copy_turn(src, **base, replayed=True, trainable=False)
        elif d.kind in ("mask", "remove"):
            text = MASK_TEXT if d.kind == "mask" else ""
            turn = Turn(**base, completion_ids=[], logprobs=[], text=text, parsed={}, valid=False,
                        finish_reason="masked" if d.kind == "mask" else "removed", trainable=False)
        else:
            s = agent.sampling
            budget = s.max_new_tokens if over.max_new_tokens is None else min(over.max_new_tokens, s.max_new_tokens)
            limit = self.positions.get(agent.policy) if over.fit_positions else None
            budget, overflow = fit_budget(agent_name, agent.policy, len(prompt_ids), budget, limit)
            if overflow is not None:  # past the model's positions: the budget cut to fit, counted
                self.faults.add("context_overflow", overflow)
            req = GenRequest(
                policy=agent.policy,
                prompt_ids=prompt_ids,
                temperature=0.0 if self.greedy else (s.temperature if over.temperature is None else over.temperature),
                top_p=s.top_p if over.top_p is None else over.top_p,
                top_k=s.top_k,
                max_new_tokens=budget,
                agent=agent_name,
                messages=messages,
                prefix=over.prefix,
            )
            try:
                res = await self.batcher.generate((self.key, index), req)
            except EpisodeStopped:  # not the backend's failure: counted as the stop's fault
                raise
            except Exception as exc:
                self.backend_failed = True
                self.faults.add("backend_error", f"generation for agent {agent_name!r} failed: {type(exc).__name__}: {exc}")
                raise
            if over.stop:
                res = _cut_at_stop(res, over.stop, tokenizer)
            text = over.prefix + res.text
            parsed, valid = agent.parse(text)
            turn = Turn(**base, completion_ids=res.completion_ids, logprobs=res.logprobs, text=text,
                        parsed=parsed, valid=valid, finish_reason=res.finish_reason,
                        trainable=self.trainable[agent.policy], weight_version=res.weight_version,
                        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
            if run_tools and agent.tools and has_tool_call(text) and not _calls_any(text, framework_tools):
                await self._run_tools(agent.name, turn, tool_budget)
        self.episode.turns.append(turn)
        return turn

    async def _run_tools(self, agent_name: str, turn: Turn, budget: int) -> None:
        """Run the turn's tool calls (at most ``budget``) and record calls, observations, tool_valid.

        With budget left the turn becomes a tool turn (label ``tool``, valid iff every call
        was); with none (the agent's last generation) its calls are recorded as not run and
        the agent's own parse of the text stands.
        """
        agent = self.agents[agent_name]
        allowed = {name: self.tools[name] for name in agent.tools if name in self.tools}
        records, observations = [], []
        for k, call in enumerate(parse_tool_calls(turn.text)):
            if k < budget:  # in a worker thread: the loop (other episodes, the batcher) goes on meanwhile
                self.batcher.tool_started(self.key)
                try:
                    rec, obs = await asyncio.to_thread(run_tool_call, call, allowed, self.tool_runner)
                finally:
                    self.batcher.tool_finished(self.key)
                if "fault" in rec:
                    self.faults.add(rec["fault"], f"agent {agent_name!r}: {rec['error']}")
            else:
                rec, obs = skipped_call(call, f"the limit of {agent.max_tool_calls} tool calls per reply is spent")
            records.append(rec)
            observations.append(obs)
        turn.tool_calls, turn.observations = records, observations
        turn.extra_rewards[TOOL_VALID_KEY] = sum(r["valid"] for r in records) / len(records)
        if budget > 0:
            turn.parsed = {"label": TOOL_LABEL, "tool_calls": len(records)}
            turn.valid = all(r["valid"] for r in records)


# ---------------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------------


class Engine:
    def __init__(
        self,
        topology: Topology,
        agents: dict[str, Agent],
        tokenizers: dict[str, Any],
        trainable: dict[str, bool],
        backend: Backend,
        score: Callable[[Episode], float],
        episode_timeout: float | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
        tool_timeout_s: float = 30.0,
        tool_memory_mb: int | None = 1024,
        tool_workers: int = 2,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        verify: TurnVerifier | None = None,
        verify_timeout_s: float = 2.0,
        positions: Mapping[str, int | None] | None = None,
    ):
        """``tool_*``: limits of the sandbox the env's tools run in (see ``mas.process.sandbox``);
        ``sleep``: what an episode's and a verifier call's time limits wait with (a test injects a
        manual clock); ``verify``: the turn verifier (``mas.envs.verifiers``), called on every turn
        of a scored episode, each call within ``verify_timeout_s``; ``positions``: each policy's
        model's positions (default: read beside its tokenizer, ``mas.rollout.positions``)."""
        self.positions = dict(positions) if positions is not None else {p: model_positions(t) for p, t in tokenizers.items()}
        self.tools = dict(tools or {})  # the env's tools by name; each agent may call those in its Agent.tools
        for agent in agents.values():
            missing = [t for t in agent.tools if t not in self.tools]
            if missing:
                raise ValueError(f"agent {agent.name!r} names tool(s) {missing} that the env does not offer; valid: {sorted(self.tools)}")
        self.episode_timeout = episode_timeout  # seconds of wall time per episode; None: no limit
        self.topology = topology
        self.agents = agents
        self.tokenizers = tokenizers
        self.trainable = trainable
        self.backend = backend
        self.score = score
        self.sleep = sleep
        self.verify = verify
        self.verify_timeout_s = verify_timeout_s
        # generated_tokens: completion tokens of every generation served (rollouts, replays,
        # interventions, critic replies); a remote endpoint that returns no token ids is counted
        # by tokenising its text with the policy's tokenizer
        self.stats = {"batches": 0, "requests": 0, "replay_episodes": 0, "critiques": 0, "generated_tokens": 0}
        self.faults = Faults()
        self.tool_limits = {"timeout_s": tool_timeout_s, "memory_mb": tool_memory_mb, "workers": tool_workers}
        self._sandbox: Sandbox | None = None  # started at the first tool call

    @property
    def sandbox(self) -> Sandbox | None:
        """The worker processes that run the env's tools (None when the env has none).  Workers
        hold the functions they were forked with: if ``tools`` was changed since, new ones start."""
        functions = {name: spec.fn for name, spec in self.tools.items()}
        if self._sandbox is not None and self._sandbox.functions != functions:
            self._sandbox.close()
            self._sandbox = None
        if self._sandbox is None and functions:
            self._sandbox = Sandbox(functions, name="tools", **self.tool_limits)
        return self._sandbox

    def take_faults(self) -> tuple[dict[str, int], dict[str, str]]:
        """Faults counted since the last call, by kind (``FAULT_KINDS``), and the first message of each."""
        return self.faults.take()

    def close(self) -> None:
        """Stop the tool workers (they also stop when the engine is garbage-collected or the process ends)."""
        if self._sandbox is not None:
            self._sandbox.close()

    # -- public API ------------------------------------------------------------------------

    def rollout(self, tasks: list[Task], group_size: int, seed: int, greedy: bool = False,
                abort: Callable[[], bool] | None = None, done: Callable[[], None] | None = None) -> list[EpisodeGroup]:
        """G joint episodes for each of B tasks, run concurrently.  ``abort`` is asked before
        every generation batch: True stops the rollout with ``StepAbandoned``; ``done`` is called
        as each episode ends (a progress bar)."""
        groups = [
            EpisodeGroup(task, [Episode(task=task, group_id=b, sample_id=g, seed=seed) for g in range(group_size)])
            for b, task in enumerate(tasks)
        ]
        jobs = [(ep, None) for grp in groups for ep in grp.episodes]
        self._run(jobs, seed, greedy, abort=abort, done=done)
        return groups

    def execute(self, requests: list[Request], seed: int, abort: Callable[[], bool] | None = None) -> Results:
        """Run replay, intervention and critique requests in one concurrent pass.

        A request key names one evaluation: requests with a key already seen are not run again
        (credit methods use canonical keys, e.g. one per coalition, so nothing is evaluated twice).
        """
        unique: dict[str, Request] = {}
        for req in requests:
            unique.setdefault(req.key, req)
        jobs: list[tuple[Episode, Script | None]] = []
        owners: list[str] = []
        critiques: list[CritiqueRequest] = []
        for req in unique.values():
            if isinstance(req, CritiqueRequest):
                _check_critique(req, self.tokenizers)
                critiques.append(req)
                continue
            src = req.source
            _check_request(req, self.agents)
            if isinstance(req, ReplayRequest):
                script = Script(src, freeze_upto=req.freeze_upto)
                n = req.num_samples
            elif isinstance(req, InterventionRequest):
                script = Script(src, masked=tuple(req.agents), mode=req.mode, keep_others=req.keep_others,
                                resample=tuple(req.resample))
                n = 1
            else:
                raise TypeError(f"unknown request type {type(req).__name__}")
            for i in range(n):
                jobs.append((Episode(task=src.task, group_id=src.group_id, sample_id=i, seed=seed, info={"request": req.key}), script))
                owners.append(req.key)
        texts = self._run(jobs, seed, greedy=False, critiques=critiques, abort=abort)
        out: Results = {}
        for key, (ep, _) in zip(owners, jobs):
            out.setdefault(key, []).append(ep)
        for req, text in zip(critiques, texts):
            out[req.key] = [text]
        self.stats["replay_episodes"] += len(jobs)
        self.stats["critiques"] += len(critiques)
        return out

    def evaluate(self, tasks: list[Task], seed: int, abort: Callable[[], bool] | None = None,
                 sample: bool = False, done: Callable[[], None] | None = None) -> list[Episode]:
        """One episode per task: greedy, or sampled at each agent's own settings with ``sample``."""
        return [g.episodes[0] for g in self.rollout(tasks, 1, seed, greedy=not sample, abort=abort, done=done)]

    # -- internals -------------------------------------------------------------------------

    def _run(
        self, jobs: list[tuple[Episode, Script | None]], seed: int, greedy: bool, critiques: list[CritiqueRequest] = (),
        abort: Callable[[], bool] | None = None, done: Callable[[], None] | None = None,
    ) -> list[str]:
        # Sync framework code (a LangGraph node written with `def`) runs in the loop's default
        # executor and blocks its thread while it waits for a model call; the batch it waits
        # for is served only when every episode waits, so every episode must get a thread.
        # Threads are started only when needed.
        executor = ThreadPoolExecutor(max_workers=max(32, 4 * len(jobs)), thread_name_prefix="mas-episode")
        return _run_loop(self._run_async(jobs, seed, greedy, list(critiques), abort, done), executor)

    async def _run_async(
        self, jobs: list[tuple[Episode, Script | None]], seed: int, greedy: bool, critiques: list[CritiqueRequest],
        abort: Callable[[], bool] | None = None, done: Callable[[], None] | None = None,
    ) -> list[str]:
        batcher = Batcher(self.backend, seed, faults=self.faults, count_tokens=self._generated_tokens, abort=abort)
        prompts = PromptCache()  # one memo per run: a run's episodes share many prompts (see PromptCache)
        batcher.active = set(range(len(jobs) + len(critiques)))
        server = asyncio.create_task(batcher.serve())
        server.add_done_callback(batcher.fail_pending)  # a server that dies must not leave episodes waiting
        try:
            episodes = [_then(self._episode(k, ep, script, batcher, greedy, prompts), done) for k, (ep, script) in enumerate(jobs)]
            asks = [self._critique(len(jobs) + i, req, batcher, prompts) for i, req in enumerate(critiques)]
            texts = (await asyncio.gather(*episodes, *asks))[len(jobs):]
        finally:
            server.cancel()
            try:
                await server
            except asyncio.CancelledError:
                pass
        self.stats["batches"] += batcher.batches
        self.stats["requests"] += batcher.requests
        self.stats["generated_tokens"] += batcher.tokens
        if batcher.fatal is not None:
            raise batcher.fatal
        return list(texts)

    def _generated_tokens(self, req: GenRequest, res: GenResult) -> int:
        """Completion tokens of one generation: its ids; for a remote endpoint (no ids) the count
        it reported, else its text tokenised with the policy's tokenizer."""
        if res.completion_ids or not res.text:
            return len(res.completion_ids)
        if res.usage_tokens is not None:
            return res.usage_tokens
        tok = self.tokenizers.get(req.policy)
        return len(tok(res.text, add_special_tokens=False)["input_ids"]) if tok is not None else 0

    async def _critique(self, key: int, req: CritiqueRequest, batcher: Batcher, prompts: PromptCache) -> str:
        """One critic call; a failure gives an empty reply (the method's fallback handles it)."""
        messages = [{"role": r, "content": c} for r, c in req.messages]
        gen = GenRequest(policy=req.policy, prompt_ids=prompts.render(self.tokenizers[req.policy], messages),
                         temperature=req.temperature, top_p=1.0, top_k=0, max_new_tokens=req.max_new_tokens,
                         agent=f"critic:{req.policy}", messages=messages)
        try:
            return (await batcher.generate((key, 0), gen)).text
        except Exception as exc:  # noqa: BLE001 - counted here and by the method as a parse failure
            self.faults.add("critic_error", f"critique {req.key!r} by policy {req.policy!r} failed: {type(exc).__name__}: {exc}")
            return ""
        finally:
            batcher.finished(key)

    async def _episode(self, key: int, ep: Episode, script: Script | None, batcher: Batcher, greedy: bool,
                       prompts: PromptCache) -> None:
        runner = self.sandbox if self.tools else None
        ctx = EpisodeContext(key, ep, self.agents, self.tokenizers, self.trainable, batcher, script, greedy, self.tools,
                             tool_runner=runner, faults=self.faults, prompts=prompts, positions=self.positions)
        limit = self.episode_timeout

        def timed_out() -> None:  # from now on the episode's model calls raise: a team that never stops unwinds
            ctx.stop(f"timeout: episode exceeded {limit}s (runtime.episode_timeout_s)", "episode_timeout")

        try:
            # after the limit, the episode gets as long again to unwind (<= 2x the limit in all), then is left behind
            outcome = await _within(self.topology.run(ctx), limit, self.sleep, on_timeout=timed_out, grace=limit)
            if ctx.stopped is not None:  # the team caught a refused call and ended anyway: still a stopped episode
                raise ctx.stopped
            ep.answer = outcome.answer
            ep.status = "truncated" if outcome.truncated else "ok"
        except Exception as exc:  # noqa: BLE001 - a failed episode is kept, marked and scored 0
            ep.status = "error"
            if ctx.stopped is not None:  # whatever the team raised on the way out, the stop is the cause
                ep.error = str(ctx.stopped)
                ep.info[FAILURE] = ctx.stopped.fault
                self.faults.add(ctx.stopped.fault, f"task {ep.task.task_id!r}: {ep.error}")
            else:
                ep.error = f"{type(exc).__name__}: {exc}"
                ep.info["traceback"] = traceback.format_exc(limit=5)
                # a backend failure was counted where it happened; a replay that diverged is counted by the
                # credit method (credit_cost.replay_divergences) and warned about once per step
                if ctx.backend_failed:
                    ep.info[FAILURE] = "backend_error"
                elif isinstance(exc, ReplayDivergence):
                    ep.info[FAILURE] = "replay_divergence"
                else:
                    ep.info[FAILURE] = "agent_error"
                    self.faults.add("agent_error", f"task {ep.task.task_id!r}: {ep.error}")
        finally:
            batcher.finished(key)
        ep.turns.sort(key=lambda t: t.index)
        if ep.status == "error":
            ep.reward = 0.0
        else:
            try:
                ep.reward = float(self.score(ep))
                if not math.isfinite(ep.reward):
                    raise FloatingPointError(f"the env scored this episode {ep.reward}")
            except Exception as exc:  # noqa: BLE001 - a scorer crash marks the episode, never the step
                ep.status, ep.error, ep.reward = "error", f"score: {type(exc).__name__}: {exc}", 0.0
                ep.info[FAILURE] = "score_error"
                self.faults.add("score_error", f"task {ep.task.task_id!r}: {ep.error}")
        if self.verify is not None and ep.status != "error":
            for turn in ep.turns:
                score = await self._verify_turn(ep, turn)
                if score is None:
                    turn.extra_rewards.pop(VERIFIED, None)  # a reused turn may carry its source's score
                else:
                    turn.extra_rewards[VERIFIED] = score

    async def _verify_turn(self, ep: Episode, turn: Turn) -> float | None:
        """The verifier's score of one turn, or None: where it gives none, and where it raised,
        ran past ``verify_timeout_s`` or returned something else (each counted as a fault)."""
        where = f"task {ep.task.task_id!r}, turn {turn.index} ({turn.agent})"
        try:
            value = await _within(_in_thread(self.verify, ep, turn), self.verify_timeout_s, self.sleep)
            return check_score(value)
        except TimeoutError:
            self.faults.add("verifier_timeout", f"{where}: the verifier ran past {self.verify_timeout_s}s")
        except Exception as exc:  # noqa: BLE001 - a verifier failure costs its turn's score, never the episode
            self.faults.add("verifier_error", f"{where}: {type(exc).__name__}: {exc}")
        return None


def _in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """``fn(*args)`` on a daemon thread of its own, as a future of the running loop.  A call that
    never returns keeps only its thread (it cannot be stopped), never the loop or the process."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            result, ok = fn(*args), True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop closed while the call ran past its time
            pass

    threading.Thread(target=work, name="mas-verifier", daemon=True).start()
    return future


async def _within(coro: Awaitable[Any], timeout: float | None, sleep: Callable[[float], Awaitable[Any]],
                  on_timeout: Callable[[], None] | None = None, grace: float | None = None) -> Any:
    """``await coro``; or, once ``sleep(timeout)`` returns first: ``on_timeout()``, cancel it, wait
    for it to finish (at most ``sleep(grace)`` when ``grace`` is given, else until it does) and
    raise TimeoutError.  A coroutine still running after its grace is left behind."""
    if timeout is None:
        return await coro
    work = asyncio.ensure_future(coro)
    timer = asyncio.ensure_future(sleep(timeout))
    try:
        await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        timer.cancel()
        raise
    if work.done():
        timer.cancel()
        return work.result()
    if on_timeout is not None:
        on_timeout()
    work.cancel()
    waits = {work}
    if grace is not None:
        waits.add(asyncio.ensure_future(sleep(grace)))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits - {work}:
            w.cancel()
    work.add_done_callback(_drop_outcome)  # it failed or was cancelled while being stopped: the timeout is what counts
    raise TimeoutError


def _drop_outcome(task: asyncio.Future) -> None:
    """Mark a stopped task's error as seen (asyncio would log it as never retrieved)."""
    if not task.cancelled():
        task.exception()


async def _then(work: Awaitable[Any], done: Callable[[], None] | None) -> Any:
    """``work``'s result, with ``done()`` called once it has ended (None: nothing)."""
    result = await work
    if done is not None:
        done()
    return result


def _run_loop(main: Awaitable[Any], executor: ThreadPoolExecutor) -> Any:
    """``asyncio.run(main)`` with ``executor`` as the loop's default executor, and a clean-up that
    cannot hang.  asyncio.run cancels the tasks still running at the end and waits for them, and
    for the executor's threads, without a bound; an episode left behind after its timeout (one
    that ignored its cancellation) would hang the run there.  Here they get ``LEFTOVER_GRACE_S``
    seconds once cancelled, then stay with the closed loop; the threads are not waited for."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.set_default_executor(executor)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in left:
                task.cancel()
                task.add_done_callback(_drop_outcome)
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=LEFTOVER_GRACE_S))
            loop.run_until_complete(asyncio.wait([loop.create_task(loop.shutdown_asyncgens())], timeout=LEFTOVER_GRACE_S))
        finally:
            asyncio.set_event_loop(None)
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()


def _check_critique(req: CritiqueRequest, tokenizers: dict[str, Any]) -> None:
    if req.policy not in tokenizers:
        raise ValueError(f"critique {req.key!r}: unknown policy {req.policy!r}; valid: {sorted(tokenizers)}")


def _check_request(req: Request, agents: dict[str, Agent]) -> None:
    """Reject requests that could only run as silent no-ops."""
    if isinstance(req, ReplayRequest):
        if not 0 <= req.freeze_upto <= len(req.source.turns):
            raise ValueError(f"request {req.key!r}: freeze_upto={req.freeze_upto} outside 0..{len(req.source.turns)}")
        if req.num_samples < 1:
            raise ValueError(f"request {req.key!r}: num_samples must be >= 1")
    elif isinstance(req, InterventionRequest):
        unknown = sorted((set(req.agents) | set(req.resample)) - set(agents))
        if unknown or not req.agents:
            raise ValueError(f"request {req.key!r}: unknown agents {unknown or '(none given)'}; valid: {sorted(agents)}")
