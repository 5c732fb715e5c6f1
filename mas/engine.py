"""The rollout engine: runs joint episodes concurrently and records every turn.

Each episode is one run of the team's compiled LangGraph graph (``mas.topologies``).  Graph
nodes call agents through ``EpisodeContext.call``; those calls become ``GenRequest``s that
the ``Batcher`` collects from all running episodes and hands to the backend as one
``generate_batch`` (one ``generate`` per policy and sampling setting).

The same machinery executes the extra evaluations credit methods plan (DESIGN.md):
    replay        re-run a recorded episode with turns 0..t-1 frozen token for token
    intervention  re-run with some agents masked (placeholder text) or removed (no message)
A ``Script`` tells ``EpisodeContext.call`` what to do at each turn index.

Tools (``agents/tools.py``): every generation is one Turn.  When an agent with tools writes
tool calls, ``EpisodeContext.call`` runs them with the env's tools, records the calls and
their observations on that Turn, and calls the agent again with the observations appended
to its messages, until it replies without a tool call or its ``max_tool_calls`` are spent;
the topology gets the final turn.  A replayed turn reuses its recorded calls and
observations (the tools are not run again), so a replay is faithful whatever the tool does.
A masked or removed tool-using agent occupies as many turn positions as its recorded
invocation did (all but the last are 'removed' placeholders), so the other agents' turns
keep their recorded positions and ``keep_others`` can reuse them.

Everything here is deterministic for a seed: asyncio runs tasks in a fixed order, pending
requests are sorted by (episode, turn) before each batch, and each ``generate_batch`` gets
the seed (seed, batch number), from which the backend seeds every policy's sampling on its
own (``mas.backends.base.policy_seed``), wherever that policy is served.
"""

from __future__ import annotations

import asyncio
import copy
import math
import dataclasses
import traceback
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Callable, Literal, Protocol


from mas.agents.agent import Agent
from mas.agents.prompts import render_prompt
from mas.agents.tools import TOOL_VALID_KEY, ToolSpec, has_tool_call, parse_tool_calls, run_tool_call, skipped_call, tool_results_message
from mas.backends.base import Backend, BackendUnavailable, GenRequest, GenResult
from mas.types import (
    CritiqueRequest,
    Episode,
    EpisodeGroup,
    InterventionRequest,
    ReplayRequest,
    Request,
    Results,
    Task,
    Turn,
)

MASK_TEXT = "[masked]"
TOOL_LABEL = "tool"  # parsed label of a turn whose tool calls ran (the agent is called again)


class ReplayDivergence(RuntimeError):
    """A frozen turn's prompt differs from the recorded one: the replay is not faithful."""


# ---------------------------------------------------------------------------------------------
# scripts: what to do at each turn of a replayed or intervened episode
# ---------------------------------------------------------------------------------------------


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
                found = None if src is None else src.agent
                raise ReplayDivergence(f"turn {index}: topology asked for {agent!r}, recorded turn is {found!r}")
            return Directive("replay", src, check_prompt=True)
        resampled = agent in self.resample and index > self._first_masked()  # before it nothing has changed
        if (self.keep_others and not resampled and src is not None and src.agent == agent
                and src.finish_reason not in ("masked", "removed")):
            return Directive("replay", src)
        return SAMPLE


# ---------------------------------------------------------------------------------------------
# batching of concurrent generation requests
# ---------------------------------------------------------------------------------------------


class Batcher:
    """Collects requests from concurrently running episodes and serves them in batches.

    A batch is flushed once every running episode is waiting on at least one request; a few
    more loop iterations then let sibling requests of the same episode (concurrent calls in
    one node) arrive.  The rule depends only on which episodes are waiting, never on timing,
    so batches, and with them the sampled tokens, are the same in every run.  (Topology code
    must therefore stay on the event loop: LangGraph runs sync node and routing functions in a
    thread pool, so every topology function is async.)
    """

    def __init__(self, backend: Backend, seed: int, settle_yields: int = 4):
        self.backend = backend
        self.seed = seed
        self.settle_yields = settle_yields
        self.active: set[int] = set()  # episode keys still running
        self._pending: list[tuple[tuple[int, int], GenRequest, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self.batches = 0
        self.requests = 0
        self.fatal: BackendUnavailable | None = None  # the backend is gone; the rollout raises it

    async def generate(self, key: tuple[int, int], request: GenRequest) -> GenResult:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((key, request, fut))
        self._wake.set()
        return await fut

    def finished(self, key: int) -> None:
        self.active.discard(key)
        self._wake.set()

    def _all_waiting(self) -> bool:
        return bool(self._pending) and {k[0] for k, _, _ in self._pending} >= self.active

    async def serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._all_waiting():
                continue
            for _ in range(self.settle_yields):
                await asyncio.sleep(0)
            batch = sorted((p for p in self._pending if not p[2].done()), key=lambda item: item[0])
            self._pending = []  # (a future is done already only if its episode was cancelled by a timeout)
            if not batch:
                continue
            seed = self.seed * 1_000_003 + self.batches
            self.batches += 1
            self.requests += len(batch)
            try:
                results = self.backend.generate_batch([req for _, req, _ in batch], seed=seed)
            except BackendUnavailable as exc:  # nothing can be served: fail every waiting episode, then the rollout
                self.fatal = self.fatal or exc
                for _, _, fut in batch:
                    _settle(fut, error=exc)
            except Exception:  # noqa: BLE001 - isolate the bad request(s): one at a time
                for _, req, fut in batch:
                    try:
                        _settle(fut, result=self.backend.generate_batch([req], seed=seed)[0])
                    except Exception as exc:  # noqa: BLE001 - that episode fails and is marked
                        _settle(fut, error=exc)
            else:
                if len(results) != len(batch):
                    err = RuntimeError(f"backend returned {len(results)} results for {len(batch)} requests")
                    for _, _, fut in batch:
                        _settle(fut, error=err)
                    continue
                for (_, _, fut), res in zip(batch, results):
                    _settle(fut, result=res)


def _settle(fut: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():  # its episode timed out meanwhile
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


# ---------------------------------------------------------------------------------------------
# per-episode context handed to topology nodes
# ---------------------------------------------------------------------------------------------


class EpisodeContext:
    """What a topology node needs to call agents inside one episode."""

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
    ):
        self.key = key
        self.tools = dict(tools or {})
        self.episode = episode
        self.agents = agents
        self.tokenizers = tokenizers
        self.trainable = trainable
        self.batcher = batcher
        self.script = script
        self.greedy = greedy
        self._next = 0

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

    def _directive(self, index: int, agent_name: str) -> Directive:
        return self.script.directive(index, agent_name) if self.script else SAMPLE

    async def call(
        self, agent_name: str, messages: list[dict[str, str]], parent: int | None = None, index: int | None = None
    ) -> Turn:
        """One invocation of an agent: its reply, after any tool rounds (each one more Turn)."""
        agent = self.agents[agent_name]
        if index is None:
            index = self.reserve(1)[0]
        d = self._directive(index, agent_name)
        if d.kind in ("mask", "remove") and agent.tools:  # keep the recorded positions of later turns
            for _ in range(self.script.invocation_length(index, agent_name) - 1):
                await self._turn(agent_name, messages, parent, index, Directive("remove"), 0)
                index = self.reserve(1)[0]
        turn = await self._turn(agent_name, messages, parent, index, d, agent.max_tool_calls)
        used = 0
        while turn.parsed.get("label") == TOOL_LABEL:
            used += len(turn.tool_calls)
            left = agent.max_tool_calls - used
            messages = messages + [{"role": "assistant", "content": turn.text},
                                   {"role": "user", "content": tool_results_message(turn.observations, left)}]
            index = self.reserve(1)[0]
            turn = await self._turn(agent_name, messages, turn.index, index, self._directive(index, agent_name), left)
        return turn

    async def _turn(
        self, agent_name: str, messages: list[dict[str, str]], parent: int | None, index: int, d: Directive, tool_budget: int
    ) -> Turn:
        """One generation (sampled, replayed, masked or removed), recorded on the episode."""
        agent = self.agents[agent_name]
        prompt_ids = render_prompt(self.tokenizers[agent.policy], messages)
        base = dict(agent=agent_name, policy=agent.policy, index=index, parent=parent, messages=messages, prompt_ids=prompt_ids)
        if d.kind == "replay":
            src = d.source
            assert src is not None
            if d.check_prompt and src.prompt_ids != prompt_ids:
                raise ReplayDivergence(f"turn {index} ({agent_name}): prompt differs from the recorded one")
            turn = dataclasses.replace(copy.deepcopy(src), **base, replayed=True, trainable=False)
        elif d.kind in ("mask", "remove"):
            text = MASK_TEXT if d.kind == "mask" else ""
            turn = Turn(**base, completion_ids=[], logprobs=[], text=text, parsed={}, valid=False,
                        finish_reason="masked" if d.kind == "mask" else "removed", trainable=False)
        else:
            s = agent.sampling
            req = GenRequest(
                policy=agent.policy,
                prompt_ids=prompt_ids,
                temperature=0.0 if self.greedy else s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                max_new_tokens=s.max_new_tokens,
                agent=agent_name,
                messages=messages,
            )
            res = await self.batcher.generate((self.key, index), req)
            parsed, valid = agent.parse(res.text)
            turn = Turn(**base, completion_ids=res.completion_ids, logprobs=res.logprobs, text=res.text,
                        parsed=parsed, valid=valid, finish_reason=res.finish_reason,
                        trainable=self.trainable[agent.policy], weight_version=res.weight_version)
            if agent.tools and has_tool_call(res.text):
                self._run_tools(agent.name, turn, tool_budget)
        self.episode.turns.append(turn)
        return turn

    def _run_tools(self, agent_name: str, turn: Turn, budget: int) -> None:
        """Run the turn's tool calls (at most ``budget``) and record calls, observations, tool_valid.

        With budget left the turn becomes a tool turn (label ``tool``, valid iff every call
        was); with none (the agent's last generation) its calls are recorded as not run and
        the agent's own parse of the text stands.
        """
        agent = self.agents[agent_name]
        allowed = {name: self.tools[name] for name in agent.tools if name in self.tools}
        records, observations = [], []
        for k, call in enumerate(parse_tool_calls(turn.text)):
            if k < budget:
                rec, obs = run_tool_call(call, allowed)
            else:
                rec, obs = skipped_call(call, f"the limit of {agent.max_tool_calls} tool calls per reply is spent")
            records.append(rec)
            observations.append(obs)
        turn.tool_calls, turn.observations = records, observations
        turn.extra_rewards[TOOL_VALID_KEY] = sum(r["valid"] for r in records) / len(records)
        if budget > 0:
            turn.parsed = {"label": TOOL_LABEL, "tool_calls": len(records)}
            turn.valid = all(r["valid"] for r in records)


@dataclass
class Outcome:
    answer: str | None
    truncated: bool = False


class Topology(Protocol):
    async def run(self, ctx: EpisodeContext) -> Outcome: ...


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
    ):
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
        self.stats = {"batches": 0, "requests": 0, "replay_episodes": 0, "critiques": 0}

    # -- public API ------------------------------------------------------------------------

    def rollout(self, tasks: list[Task], group_size: int, seed: int, greedy: bool = False) -> list[EpisodeGroup]:
        """G joint episodes for each of B tasks, run concurrently."""
        groups = [
            EpisodeGroup(task, [Episode(task=task, group_id=b, sample_id=g, seed=seed) for g in range(group_size)])
            for b, task in enumerate(tasks)
        ]
        jobs = [(ep, None) for grp in groups for ep in grp.episodes]
        self._run(jobs, seed, greedy)
        return groups

    def execute(self, requests: list[Request], seed: int) -> Results:
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
        texts = self._run(jobs, seed, greedy=False, critiques=critiques)
        out: Results = {}
        for key, (ep, _) in zip(owners, jobs):
            out.setdefault(key, []).append(ep)
        for req, text in zip(critiques, texts):
            out[req.key] = [text]
        self.stats["replay_episodes"] += len(jobs)
        self.stats["critiques"] += len(critiques)
        return out

    def evaluate(self, tasks: list[Task], seed: int) -> list[Episode]:
        """One greedy episode per task."""
        return [g.episodes[0] for g in self.rollout(tasks, 1, seed, greedy=True)]

    # -- internals -------------------------------------------------------------------------

    def _run(
        self, jobs: list[tuple[Episode, Script | None]], seed: int, greedy: bool, critiques: list[CritiqueRequest] = ()
    ) -> list[str]:
        return asyncio.run(self._run_async(jobs, seed, greedy, list(critiques)))

    async def _run_async(
        self, jobs: list[tuple[Episode, Script | None]], seed: int, greedy: bool, critiques: list[CritiqueRequest]
    ) -> list[str]:
        batcher = Batcher(self.backend, seed)
        batcher.active = set(range(len(jobs) + len(critiques)))
        server = asyncio.create_task(batcher.serve())
        try:
            episodes = [self._episode(k, ep, script, batcher, greedy) for k, (ep, script) in enumerate(jobs)]
            asks = [self._critique(len(jobs) + i, req, batcher) for i, req in enumerate(critiques)]
            texts = (await asyncio.gather(*episodes, *asks))[len(jobs):]
        finally:
            server.cancel()
            try:
                await server
            except asyncio.CancelledError:
                pass
        self.stats["batches"] += batcher.batches
        self.stats["requests"] += batcher.requests
        if batcher.fatal is not None:
            raise batcher.fatal
        return list(texts)

    async def _critique(self, key: int, req: CritiqueRequest, batcher: Batcher) -> str:
        """One critic call; a failure gives an empty reply (the method's fallback handles it)."""
        messages = [{"role": r, "content": c} for r, c in req.messages]
        gen = GenRequest(policy=req.policy, prompt_ids=render_prompt(self.tokenizers[req.policy], messages),
                         temperature=req.temperature, top_p=1.0, top_k=0, max_new_tokens=req.max_new_tokens,
                         agent=f"critic:{req.policy}", messages=messages)
        try:
            return (await batcher.generate((key, 0), gen)).text
        except Exception:  # noqa: BLE001 - counted by the method as a parse/call failure
            return ""
        finally:
            batcher.finished(key)

    async def _episode(self, key: int, ep: Episode, script: Script | None, batcher: Batcher, greedy: bool) -> None:
        ctx = EpisodeContext(key, ep, self.agents, self.tokenizers, self.trainable, batcher, script, greedy, self.tools)
        try:
            outcome = await asyncio.wait_for(self.topology.run(ctx), self.episode_timeout)
            ep.answer = outcome.answer
            ep.status = "truncated" if outcome.truncated else "ok"
        except TimeoutError:
            ep.status, ep.error = "error", f"timeout: episode exceeded {self.episode_timeout}s"
        except Exception as exc:  # noqa: BLE001 - a failed episode is kept, marked and scored 0
            ep.status = "error"
            ep.error = f"{type(exc).__name__}: {exc}"
            ep.info["traceback"] = traceback.format_exc(limit=5)
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
