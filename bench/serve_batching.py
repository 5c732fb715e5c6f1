"""mas serve under concurrent clients: requests generated together against one at a time.

``mas serve`` answers every request through its session's ``ServeBatcher`` (mas/rollout/endpoint.py):
requests that arrive while a batch generates wait, and go to the backend together as one
``generate_batch`` call.  Before that, a request took a lock and generated alone, so N clients were
served one after another.  This bench starts ``mas serve CONFIG`` (the embedded model by default)
as its own process, as a user runs it, and sends it the same greedy requests two ways, side by side:

  - batched: N client threads, each sending its requests one after another, all at once;
  - one at a time: the same N threads sharing a semaphore of 1, so one request is in flight at a
    time: the old behaviour, as clients see it.

Each client has its own ``httpx.Client`` and its own prompts ("Task: a+b-c", a fixed list).  Greedy
requests get the same reply in a batch as alone, so both ways generate the same tokens: the replies
are checked to be equal before anything is printed, and the ratio of tokens per second is the ratio
of wall times.  Tokens per second: completion tokens (the replies' ``usage``) / wall seconds from
the first request to the last reply.  Each round runs both ways for every client count (the way
that goes first alternating); medians over ``--rounds`` rounds are printed.

    python bench/serve_batching.py [--config configs/cpu_chain.yaml] [--agent solver] [--clients 1 4 8]
                                   [--requests 16] [--rounds 5] [--max-tokens 24] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).parents[1]


def start_server(config: str, threads: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "mas.cli", "serve", config, f"runtime.num_threads={threads}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("base_url: "):
        proc.kill()
        raise SystemExit(f"mas serve did not start: {line}{proc.stderr.read()[-3000:]}")
    return proc, line.split(": ", 1)[1].strip()


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Task: {rng.randint(1, 9)}+{rng.randint(1, 9)}-{rng.randint(1, 9)}" for _ in range(n)]


def run_clients(url: str, agent: str, work: list[list[str]], max_tokens: int, one_at_a_time: bool) -> tuple[float, int, dict]:
    """Each client's prompts, one after another, all clients at once; (wall seconds, completion
    tokens, prompt -> reply text)."""
    gate = threading.Semaphore(1) if one_at_a_time else None
    start = threading.Barrier(len(work) + 1)
    replies: dict[str, str] = {}
    tokens = [0] * len(work)
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            with httpx.Client(timeout=600) as http:
                start.wait()
                for prompt in work[k]:
                    body = {"model": agent, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
                    if gate is not None:
                        with gate:
                            resp = http.post(f"{url}/chat/completions", json=body)
                    else:
                        resp = http.post(f"{url}/chat/completions", json=body)
                    resp.raise_for_status()
                    out = resp.json()
                    replies[prompt] = out["choices"][0]["message"]["content"]
                    tokens[k] += out["usage"]["completion_tokens"]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            raise

    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(work))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"a client failed: {errors[0]!r}")
    return wall, sum(tokens), replies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/cpu_chain.yaml", help="a config (or run directory) for mas serve")
    ap.add_argument("--agent", default=None, help="the agent asked (default: the first the server lists)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=16, help="requests each client sends, one after another")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads (runtime.num_threads)")
    args = ap.parse_args()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "mas"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    proc, url = start_server(args.config, args.threads)
    try:
        agent = args.agent or httpx.get(f"{url}/models", timeout=60).json()["data"][0]["id"]
        for n in args.clients:  # warm-up: the first batch of each size pays one-off costs
            run_clients(url, agent, [prompts(1, 999 + k) for k in range(n)], args.max_tokens, one_at_a_time=False)
        rates: dict[tuple[int, str], list[float]] = {}
        tokens_seen: dict[int, int] = {}
        for r in range(args.rounds):
            for n in args.clients:
                work = [prompts(args.requests, seed=1000 * n + k) for k in range(n)]
                order = ["batched", "one at a time"] if r % 2 == 0 else ["one at a time", "batched"]
                texts = {}
                for way in order:
                    wall, tokens, texts[way] = run_clients(url, agent, work, args.max_tokens, way == "one at a time")
                    rates.setdefault((n, way), []).append(tokens / wall)
                    tokens_seen[n] = tokens
                if texts["batched"] != texts["one at a time"]:
                    diff = [p for p in texts["batched"] if texts["batched"][p] != texts["one at a time"].get(p)]
                    raise SystemExit(f"{n} clients: greedy replies differ batched and one at a time, e.g. {diff[:3]}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    print(f"mas serve {args.config} (agent {agent}, greedy, max_tokens {args.max_tokens}, server torch threads "
          f"{args.threads}); commit {commit}{' + uncommitted changes under mas/' if dirty else ''}; "
          f"{os.cpu_count()} CPUs; medians of {args.rounds} rounds; each client sends {args.requests} requests")
    print(f"{'clients':>7}  {'tokens':>6}  {'one at a time tok/s':>19}  {'batched tok/s':>13}  {'batched / one at a time':>23}")
    for n in args.clients:
        one = statistics.median(rates[(n, "one at a time")])
        both = statistics.median(rates[(n, "batched")])
        print(f"{n:>7}  {tokens_seen[n]:>6}  {one:>19.1f}  {both:>13.1f}  {both / one:>22.2f}x")
    print("greedy replies: the same batched and one at a time, in every round")


if __name__ == "__main__":
    main()
