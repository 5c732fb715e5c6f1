"""What running tools outside the training process costs, side by side in one run.

The research env's BM25 ``search`` and ``read`` tools (over the shipped HotpotQA sample) are
called with the same arguments three ways:

    in-process       the tool function called directly (no limits: how tools ran before)
    sandbox pool     ``mas.process.sandbox.Sandbox``: forked worker processes that stay up, with a time
                     limit, a memory limit and no network (how the engine runs them)
    fresh process    a new forked process per call with the same limits (the pool's alternative)

and the math verifier's LaTeX path (math-verify in its sandboxed worker) is timed the same
way against a direct call.  Prints one table of mean milliseconds per call.

    .venv/bin/python bench/sandbox_overhead.py --calls 200
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

QUERIES = ["Shirley Temple film director", "river flowing through Paris", "Kiss and Tell 1945 film", "Chief of Protocol"]


def timed(fn, calls: int) -> float:
    """Mean milliseconds per call of ``fn(i)``."""
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - t0) * 1000 / calls


def _child(conn, fn, args):
    conn.send(fn(*args))
    conn.close()


def fresh_process(fn, *args, timeout=30.0):
    """One forked process for one call (what a pool saves)."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, fn, args))
    proc.start()
    if not parent.poll(timeout):
        proc.kill()
    out = parent.recv()
    proc.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()

    from mas.envs.math import verify
    from mas.envs.research import HotpotQAConfig, HotpotQAEnv
    from mas.process.sandbox import Sandbox

    env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa"))
    search, read = env.tools["search"].fn, env.tools["read"].fn
    box = Sandbox({"search": search, "read": read}, timeout_s=30, memory_mb=1024, workers=1, name="tools")
    box("read", "Shirley Temple")  # fork the worker before timing

    rows = []
    n = args.calls
    direct = timed(lambda i: search(QUERIES[i % 4], 3), n)
    pooled = timed(lambda i: box("search", QUERIES[i % 4], 3), n)
    fresh = timed(lambda i: fresh_process(search, QUERIES[i % 4], 3), max(10, n // 10))
    rows.append(("search (BM25, k=3)", direct, pooled, fresh))
    direct = timed(lambda i: read("Shirley Temple"), n)
    pooled = timed(lambda i: box("read", "Shirley Temple"), n)
    fresh = timed(lambda i: fresh_process(read, "Shirley Temple"), max(10, n // 10))
    rows.append(("read", direct, pooled, fresh))
    box.close()

    latex = ["\\frac{3}{4}", "2\\frac{1}{2}", "\\dfrac{-7}{8}", "18\\,000"]
    verify._latex_number("\\frac{1}{2}")  # start the math-verify worker before timing
    direct = timed(lambda i: verify._latex_number_local(latex[i % 4]), n)
    pooled = timed(lambda i: verify._latex_number(latex[i % 4]), n)
    rows.append(("math-verify LaTeX number", direct, pooled, float("nan")))
    plain = timed(lambda i: verify.read_answer(f"ANSWER: {i},000.5"), n)

    print(f"{'call':28} {'in-process ms':>14} {'sandbox pool ms':>16} {'fresh process ms':>17} {'pool - in-process ms':>21}")
    for name, d, p, f in rows:
        print(f"{name:28} {d:14.3f} {p:16.3f} {f:17.3f} {p - d:21.3f}")
    print(f"plain-number answer (no sandbox): {plain:.3f} ms per call")
    print(f"sandbox round trip over the tool's own time: {statistics.fmean(p - d for _, d, p, _ in rows[:2]):.3f} ms")


if __name__ == "__main__":
    main()
