"""Endpoint overhead: the same solver -> checker team run in-process (``kind: chain``) and as a
team's own ``openai``-client code against the endpoint mas serves (``kind: openai``).

The pair.  ``kind: chain`` with ``sequence: [solver, checker]`` is the in-process kind whose model
calls an entry point can repeat exactly: the chain sends the solver ``[system: its role, user:
"Task: <task>"]`` and the checker ``[system: its role, user: "Task: <task>\\nsolver: <the solver's
reply, stripped>"]``, and the entry points below send those very messages through
``client.chat.completions.create`` (or post them as plain HTTP).  Every team is built from one
config that differs only in ``topology`` (the same model, embedded by default, the same agents,
roles, sampling, ``max_new_tokens``, tasks and rollout seeds), and the engine's batcher forms the same batches for
each (a batch is served once every episode waits), so they all sample the same tokens: each
rollout's turns are checked to be the same, token for token (agent, prompt ids, completion ids),
before anything is printed.  What differs is only the path a call takes: a LangGraph node awaiting
``ctx.call`` on the engine's loop, against a worker thread running the user's function, whose
``openai`` client posts JSON over HTTP to uvicorn, which hands the request to the engine's loop
and sends the reply back.  (The built-in orchestrator makes other calls; a ``langgraph`` builder
would add LangChain's call path to the in-process side.)

Three entry points, three endpoint teams:
  - ``run_team_shared_client``: every episode's ``OpenAI`` client on one shared ``httpx.Client``,
    so only the endpoint and the client's per-request work are timed;
  - ``run_team``: a new ``OpenAI`` client per episode, as ``examples/openai_team.py`` writes it.
    Building one builds an httpx client with its TLS context (the certificate bundle loaded),
    tens of milliseconds of CPU per episode under the GIL, although the endpoint is plain HTTP;
  - ``run_team_raw_http``: the same requests as plain HTTP posts on the shared ``httpx.Client``
    (the JSON body the ``openai`` client sends: model and messages; the reply read with ``json``),
    no client library: what is left is the endpoint's own cost and httpx's.  The team's code runs
    in the engine's process (a worker thread), so a client library's CPU shares the engine's GIL:
    the 8 episodes' calls of a batch wait for each other's client code before the batch can form.

With ``--processes N`` (2 by default; 0 leaves them out) the shared-client and raw-HTTP teams run
again with ``processes: N``: their entry points in N worker processes of their own
(``mas.process.team_processes``), so the client code runs beside the engine instead of under its
GIL.  Their clocks are that process's, so those entry points return them as the episode's answer
(JSON), which the benchmark reads; the CPU per call adds the workers' CPU time (``/proc``).

Rollout tokens per second: completion tokens sampled / wall seconds of ``Engine.rollout``, over
``--rollouts`` rollouts of ``--tasks`` x ``--group`` concurrent episodes (8 by default) per round.
Within a round the teams' rollouts are interleaved (rollout i of every team, the team that goes
first rotating), so that the load of a shared machine hits every team alike; each round gives one
rate per team, and the medians over ``--rounds`` rounds are printed with each endpoint team's
ratio to the in-process one.  Also printed: the process's CPU seconds per call (steadier than wall
time on a busy machine), the CPU seconds of the team's own thread per call through the endpoint
(``time.thread_time`` around each request: the client library, httpx and the socket calls; what
the endpoint's server and the engine do is on their own threads), and per-call latency three ways,
medians over every call:
  - ms/call, in-process: the wall time of ``EpisodeContext.call`` as the chain's node awaits it;
  - ms/call, endpoint: the wall time of a request (``client.chat.completions.create``, or the plain
    post) as the team's code sees it.
    Both include the wait for the batch (every episode's request) and the batch's generation;
  - added ms/call, the latency the endpoint adds: the client's wall time minus the engine's handling
    of that same request (``EpisodeSession.complete``: the chat messages, ``ctx.call`` with its
    wait for the batch and the generation, the reply's choices), paired by the episode's token and
    the call's position.  What is left is the HTTP round trip, JSON both ways, the request's checks
    and the hand-offs between the worker thread, uvicorn's loop and the engine's loop.

The timers wrap ``EpisodeContext.call``, ``EpisodeSession.complete``, ``EndpointServer.register``
and the backend's ``generate_batch`` from this script (a ``time.perf_counter`` pair and a list
append each, the same for every team); mas's code is not changed.

    python bench/endpoint_overhead.py [--tasks 2] [--group 4] [--rollouts 10] [--rounds 5]
                                      [--max-new-tokens 16] [--threads 1] [--model embedded]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[1]

SOLVER = "You solve arithmetic problems. Reply with ANSWER: <number>."
CHECKER = "You check a solution. Reply with ANSWER: <number>, then ACCEPT or REJECT."

# token -> client wall seconds of each call, in order (filled by the entry points' worker threads)
CLIENT_SECONDS: dict[str, list[float]] = defaultdict(list)
# token -> CPU seconds of the calling thread for each call, in order
CLIENT_CPU: dict[str, list[float]] = defaultdict(list)


def run_team(task: str, base_url: str, api_key: str) -> str:
    """The chain's two calls with the plain ``openai`` client, one client per episode (as
    ``examples/openai_team.py`` does): the entry point of ``kind: openai``."""
    from openai import OpenAI

    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        return _chain_calls(_openai_create(client), task, base_url)


_HTTP: list[Any] = []  # the one httpx client the shared-client entry points use
_HTTP_LOCK = threading.Lock()


def _shared_http() -> Any:
    import httpx

    with _HTTP_LOCK:
        if not _HTTP:
            _HTTP.append(httpx.Client(timeout=600))
    return _HTTP[0]


def run_team_shared_client(task: str, base_url: str, api_key: str) -> str:
    """``run_team`` with every episode's ``OpenAI`` client on one shared ``httpx.Client``: building a
    client builds an httpx client, whose TLS context (the certificate bundle loaded) is most of its
    cost, paid per episode by ``run_team``, never by this one."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=_shared_http())
    return _chain_calls(_openai_create(client), task, base_url)


def run_team_raw_http(task: str, base_url: str, api_key: str) -> str:
    """The chain's two calls as plain HTTP posts on the shared ``httpx.Client``, no client library:
    the body the ``openai`` client sends for them (model, messages), the reply's first choice read."""
    http = _shared_http()

    def create(model: str, messages: list[dict[str, str]]) -> str:
        reply = http.post(f"{base_url}/chat/completions", json={"messages": messages, "model": model},
                          headers={"authorization": f"Bearer {api_key}"})
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"] or ""

    return _chain_calls(create, task, base_url)


def _reported(run: Any, task: str, base_url: str, api_key: str) -> str:
    """``run``'s calls, and as the answer their clocks (JSON): in a worker process (``processes: N``)
    they are that process's, which the benchmark reads from the episode's answer."""
    run(task, base_url, api_key)
    token = _token(base_url)
    return json.dumps({"token": token, "seconds": CLIENT_SECONDS.pop(token), "cpu": CLIENT_CPU.pop(token)})


def run_team_shared_client_reporting(task: str, base_url: str, api_key: str) -> str:
    """``run_team_shared_client`` for a worker process: the answer is its clocks (see ``_reported``)."""
    return _reported(run_team_shared_client, task, base_url, api_key)


def run_team_raw_http_reporting(task: str, base_url: str, api_key: str) -> str:
    """``run_team_raw_http`` for a worker process: the answer is its clocks (see ``_reported``)."""
    return _reported(run_team_raw_http, task, base_url, api_key)


def _token(base_url: str) -> str:
    return base_url.rstrip("/").split("/")[-2]  # http://127.0.0.1:<port>/<token>/v1


def _openai_create(client: Any) -> Any:
    def create(model: str, messages: list[dict[str, str]]) -> str:
        return client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
    return create


def _chain_calls(create: Any, task: str, base_url: str) -> str:
    """The chain's messages: the solver gets the task, the checker the task and the solver's reply.
    ``create(model, messages)``: one chat completion's text; each is timed (wall and this thread's CPU)."""
    token = _token(base_url)
    seconds, cpu = CLIENT_SECONDS[token], CLIENT_CPU[token]

    def timed(model: str, messages: list[dict[str, str]]) -> str:
        t0, c0 = time.perf_counter(), time.thread_time()
        text = create(model, messages)
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        return text

    user = f"Task: {task}"
    draft = timed("solver", [{"role": "system", "content": SOLVER}, {"role": "user", "content": user}])
    review = timed("checker", [{"role": "system", "content": CHECKER},
                               {"role": "user", "content": f"{user}\nsolver: {draft.strip()}"}])
    return review if "ANSWER:" in review else draft


IN_PROCESS = "in-process (chain)"
TOPOLOGIES = {
    IN_PROCESS: {"kind": "chain", "sequence": ["solver", "checker"]},
    "endpoint, shared client": {"kind": "openai", "entry": "endpoint_overhead:run_team_shared_client", "max_model_calls": 4},
    "endpoint, client/episode": {"kind": "openai", "entry": "endpoint_overhead:run_team", "max_model_calls": 4},
    "endpoint, raw HTTP": {"kind": "openai", "entry": "endpoint_overhead:run_team_raw_http", "max_model_calls": 4},
}


def topologies(processes: int) -> dict[str, dict]:
    """The teams above, and with ``processes`` > 0 the shared-client and raw-HTTP teams again with
    ``processes: N`` (their entry points in N worker processes, off the engine's GIL)."""
    out = dict(TOPOLOGIES)
    if processes:
        for name, entry in (("shared client", "run_team_shared_client_reporting"),
                            ("raw HTTP", "run_team_raw_http_reporting")):
            out[f"endpoint, {name}, {processes} proc"] = {"kind": "openai", "entry": f"endpoint_overhead:{entry}",
                                                          "max_model_calls": 4, "processes": processes}
    return out


def config(topology: dict, max_new_tokens: int, threads: int, model: str = "embedded") -> dict:
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": max_new_tokens}
    return {
        "team": {"name": "endpoint-bench"},
        "policies": {"p": {"kind": "full", "model": model, "device": "cpu"}},
        "agents": [{"name": "solver", "policy": "p", "role": SOLVER, "parser": "answer", "sampling": sampling},
                   {"name": "checker", "policy": "p", "role": CHECKER, "parser": "verdict", "sampling": sampling}],
        "topology": topology,
        "env": {"name": "synthetic_math", "num_ops": 1, "seed": 0},
        "credit": {"method": "grpo"},
        "trainer": {"steps": 1, "batch_size": 2, "group_size": 4, "eval_size": 0},
        "runtime": {"num_threads": threads},
        "logging": {"progress": False},
    }


class Clocks:
    """Per-call timers around the engine's and the endpoint's own methods (see the module docstring)."""

    def __init__(self) -> None:
        self.ctx_call: list[float] = []  # EpisodeContext.call wall seconds
        self.complete: dict[int, list[float]] = defaultdict(list)  # id(session) -> EpisodeSession.complete seconds
        self.sessions: dict[str, Any] = {}  # episode token -> its session (kept alive: ids stay unique)
        self.generate: list[float] = []  # backend generate_batch wall seconds

    @contextlib.contextmanager
    def installed(self, backends: list[Any]) -> Iterator["Clocks"]:
        """The timers in place while the block runs; the methods are restored after it."""
        from mas.rollout.endpoint import EndpointServer, EpisodeSession
        from mas.rollout.engine import EpisodeContext

        clocks = self
        call, complete, register = EpisodeContext.call, EpisodeSession.complete, EndpointServer.register

        async def timed_call(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await call(self, *args, **kwargs)
            finally:
                clocks.ctx_call.append(time.perf_counter() - t0)

        async def timed_complete(self, req: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await complete(self, req)
            finally:
                clocks.complete[id(self)].append(time.perf_counter() - t0)

        def recorded_register(self, session: Any) -> str:
            token = register(self, session)
            clocks.sessions[token] = session
            return token

        def timed_generate(generate: Any) -> Any:
            def timed(requests: Any, seed: Any = None) -> Any:
                t0 = time.perf_counter()
                try:
                    return generate(requests, seed=seed)
                finally:
                    clocks.generate.append(time.perf_counter() - t0)
            return timed

        EpisodeContext.call, EpisodeSession.complete, EndpointServer.register = timed_call, timed_complete, recorded_register
        for backend in backends:
            backend.generate_batch = timed_generate(backend.generate_batch)
        try:
            yield self
        finally:
            EpisodeContext.call, EpisodeSession.complete, EndpointServer.register = call, complete, register
            for backend in backends:
                del backend.generate_batch  # the instance attribute: the class's method again

    def clear(self) -> None:
        self.ctx_call.clear()
        self.complete.clear()
        self.sessions.clear()
        self.generate.clear()


def added_per_call(clocks: Clocks, client: dict[str, list[float]]) -> list[float]:
    """Client wall seconds minus ``EpisodeSession.complete`` seconds of the same request, every call."""
    out = []
    for token, seconds in client.items():
        served = clocks.complete[id(clocks.sessions[token])]
        assert len(served) == len(seconds), (token, len(served), len(seconds))
        out += [c - s for c, s in zip(seconds, served)]
    return out


def workers_cpu() -> float:
    """CPU seconds of the live team worker processes (``processes: N`` teams), from /proc (0 elsewhere)."""
    from mas.process.team_processes import shared_worker_pids

    total = 0.0
    for pid in shared_worker_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def signature(groups: list) -> list[tuple]:
    """What must match on both sides: every turn's agent, prompt ids and completion ids."""
    return [(t.agent, tuple(t.prompt_ids), tuple(t.completion_ids))
            for g in groups for ep in g.episodes for t in ep.turns]


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        return out.stdout.strip() + (" (tree has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@dataclass
class Measured:
    """Per team: one rate and one CPU figure per round, and every call's and every batch's seconds."""

    rate: dict[str, list[float]]  # completion tokens per wall second of the rollouts
    cpu: dict[str, list[float]]  # process CPU seconds per call
    per_call: dict[str, list[float]]  # seconds, every call (ctx.call in-process, the client's call otherwise)
    added: dict[str, list[float]]  # endpoint teams: client seconds - the engine's handling of the request
    client_cpu: dict[str, list[float]]  # endpoint teams: CPU seconds of the team's thread, every call
    generate: dict[str, list[float]]  # seconds, every backend batch
    calls: int  # model calls per team and round
    tokens: int  # completion tokens per team and round (the last round's)


def measure(teams: dict[str, Any], tasks: list[list[Any]], group: int, rounds: int) -> Measured:
    """``rounds`` rounds of the same rollouts (``tasks``, ``group`` episodes per task) by every team,
    interleaved; every rollout's turns are checked to be the same for every team."""
    from mas.topologies.endpoint import EndpointTeam

    names = list(teams)
    out = Measured(*({n: [] for n in names} for _ in range(6)), calls=0, tokens=0)
    clocks = Clocks()
    with clocks.installed([team.backend for team in teams.values()]):
        for name in names:  # warm-up: the endpoint's server starts, the first prompts render
            teams[name].engine.rollout(tasks[0], group, seed=10_000)
        for rnd in range(rounds):
            n_tokens, seconds, cpu = dict.fromkeys(names, 0), dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
            calls = 0
            for i, step_tasks in enumerate(tasks):
                k = rnd * len(tasks) + i
                signatures = {}
                for name in names[k % len(names):] + names[:k % len(names)]:  # each team goes first in turn
                    clocks.clear()
                    CLIENT_SECONDS.clear()
                    CLIENT_CPU.clear()
                    t0, c0, w0 = time.perf_counter(), time.process_time(), workers_cpu()
                    groups = teams[name].engine.rollout(step_tasks, group, seed=k)
                    seconds[name] += time.perf_counter() - t0
                    cpu[name] += time.process_time() - c0 + workers_cpu() - w0
                    bad = [ep.error for g in groups for ep in g.episodes if ep.status == "error"]
                    assert not bad, f"{name}: {bad[0]}"
                    n_tokens[name] += sum(len(t.completion_ids) for g in groups for ep in g.episodes for t in ep.turns)
                    signatures[name] = signature(groups)
                    out.generate[name] += clocks.generate
                    topology = teams[name].engine.topology
                    if isinstance(topology, EndpointTeam):
                        client_seconds, client_cpu = CLIENT_SECONDS, CLIENT_CPU
                        if topology.cfg.processes:  # the clocks of the workers' calls came back as the answers
                            reports = [json.loads(ep.answer) for g in groups for ep in g.episodes]
                            client_seconds = {r["token"]: r["seconds"] for r in reports}
                            client_cpu = {r["token"]: r["cpu"] for r in reports}
                        out.per_call[name] += [s for ss in client_seconds.values() for s in ss]
                        out.added[name] += added_per_call(clocks, client_seconds)
                        out.client_cpu[name] += [s for ss in client_cpu.values() for s in ss]
                    else:
                        out.per_call[name] += clocks.ctx_call
                first = signatures[names[0]]
                assert all(sig == first for sig in signatures.values()), "the teams sampled different turns"
                calls += len(first)
            for name in names:
                out.rate[name].append(n_tokens[name] / seconds[name])
                out.cpu[name].append(cpu[name] / calls)
            out.calls, out.tokens = calls, n_tokens[names[0]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2, help="tasks per rollout")
    ap.add_argument("--group", type=int, default=4, help="episodes per task (tasks x group run concurrently)")
    ap.add_argument("--rollouts", type=int, default=10, help="rollouts per team per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (a rate per team each), the teams' rollouts interleaved")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="each agent's token budget per call")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--model", default="embedded", help="every agent's model (e.g. smollm2-135m-instruct)")
    ap.add_argument("--processes", type=int, default=2,
                    help="also run the shared-client and raw-HTTP teams with processes: N (0: not)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))  # the entry points: endpoint_overhead:run_team, ...
    import endpoint_overhead as bench  # the module the engine imports them from (not __main__): its CLIENT_SECONDS

    import torch

    from mas.config.schema import validate_config
    from mas.training.team import build_team

    teams = {name: build_team(validate_config(config(topo, args.max_new_tokens, args.threads, args.model)))
             for name, topo in topologies(args.processes).items()}
    try:
        tasks = [teams[IN_PROCESS].env.sample_tasks(args.tasks) for _ in range(args.rollouts)]
        m = bench.measure(teams, tasks, args.group, args.rounds)
    finally:
        for team in teams.values():
            team.close()

    def ms(values: list[float]) -> str:
        return f"{1e3 * statistics.median(values):.2f}" if values else "-"

    base, base_cpu = statistics.median(m.rate[IN_PROCESS]), statistics.median(m.cpu[IN_PROCESS])
    print(f"commit {commit()}  model {args.model}  torch threads {torch.get_num_threads()}")
    print(f"{args.tasks * args.group} concurrent episodes ({args.tasks} tasks x {args.group}), {args.rollouts} rollouts "
          f"per team per round, {args.rounds} rounds, the teams' rollouts interleaved; per team and round {m.calls} calls, "
          f"{m.tokens} completion tokens (max_new_tokens {args.max_new_tokens}); every team sampled the same turns")
    print("medians; tokens/s per round in brackets; cpu: the process's CPU time per call (and its team worker processes'); client cpu: the team's thread's "
          "CPU time per call (client library, httpx, sockets); ms/call: ctx.call in-process, the client's call through the "
          "endpoint; added: client - the engine's handling of the same request")
    print(f"{'team':<34}{'tokens/s':>9}{'vs chain':>9}  {'per round':<28}{'cpu ms/call':>12}{'client cpu':>11}{'ms/call':>8}"
          f"{'added ms/call':>14}{'generate ms/batch':>18}")
    for name in teams:
        med = statistics.median(m.rate[name])
        rounds = "(" + ", ".join(f"{r:.0f}" for r in m.rate[name]) + ")"
        print(f"{name:<34}{med:>9.0f}{med / base:>8.2f}x  {rounds:<28}{ms(m.cpu[name]):>12}{ms(m.client_cpu[name]):>11}"
              f"{ms(m.per_call[name]):>8}{ms(m.added[name]):>14}{ms(m.generate[name]):>18}")
    for name in list(teams)[1:]:
        ratio = statistics.median(m.rate[name]) / base
        per_round = ", ".join(f"{b / a:.2f}" for a, b in zip(m.rate[IN_PROCESS], m.rate[name]))
        print(f"{name}: endpoint / in-process tokens per second {ratio:.2f} (per round {per_round}), target >= 0.8 "
              f"{'met' if ratio >= 0.8 else 'not met'}; added latency per call {ms(m.added[name])} ms (median of "
              f"{len(m.added[name])} calls); CPU per call {1e3 * (statistics.median(m.cpu[name]) - base_cpu):+.2f} ms; the team's "
              f"thread's CPU per call {ms(m.client_cpu[name])} ms")


if __name__ == "__main__":
    main()
