"""Entry points of ``kind: openai`` for teams run in worker processes (``processes: N``): a worker
process is another interpreter, so each reports what its client received in its answer (the
parent cannot read this module's state in the worker), with ``ANSWER:`` written as ``A=`` so the
answer is read as the text it is."""

from __future__ import annotations

import json
import os
import threading

from openai import OpenAI

_BARRIER: list[threading.Barrier] = []
_LOCK = threading.Lock()


def two_agents_report(task: str, base_url: str, api_key: str) -> str:
    """lead, then helper; returns the worker's pid and both replies as the client received them."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    replies = []
    for agent in ("lead", "helper"):
        reply = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": task}])
        replies.append(reply.choices[0].message.content)
    return json.dumps({"pid": os.getpid(), "replies": replies}).replace("ANSWER:", "A=")


async def async_pid(task: str) -> str:
    return f"{task} from {os.getpid()}"


def unpicklable(task: str) -> object:
    class Answer:  # a local class does not pickle
        def __str__(self) -> str:
            return f"answer to {task}"

    return Answer()


def boom(task: str, base_url: str = "", api_key: str = "") -> str:
    raise ValueError(f"boom at {task}")


def exits(task: str, base_url: str = "", api_key: str = "") -> str:
    os._exit(3)


def together(n: int) -> int:
    """Returns only when n calls run at once in this worker (a barrier), so calls that ran one after
    another would fail with BrokenBarrierError at its timeout."""
    with _LOCK:
        if not _BARRIER:
            _BARRIER.append(threading.Barrier(n))
    _BARRIER[0].wait(timeout=120)
    return os.getpid()


def call_pause_call(task: str, base_url: str, api_key: str) -> str:
    """One call, a pause, another call: the episode's timeout falls in the pause, so the second call
    finds the episode gone.  The task is a file path, written once the first call has its reply
    (the test's clock lets the timeout pass when it sees the file)."""
    import time
    from pathlib import Path

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}])
    Path(task).write_text("first call served")
    time.sleep(2)
    client.chat.completions.create(model="lead", messages=[{"role": "user", "content": task}])
    return "never reached"


def loaded(module: str) -> bool:
    """Whether the worker has imported ``module``."""
    import sys

    return module in sys.modules


class TwoArgs(Exception):
    """Pickles (as its args) but does not unpickle: ``__init__`` wants two arguments."""

    def __init__(self, a: int, b: int):
        super().__init__(f"{a}/{b}")


def does_not_come_back(task: str) -> object:
    return TwoArgs(1, 2)


class Mute(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


def raises_mute(task: str) -> str:
    raise Mute()
