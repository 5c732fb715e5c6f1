"""``kind: openai`` with ``processes: N``: the team's entry point runs in worker processes of its
own (mas.process.team_processes), and the rollout is the one the threads give: batched, never
cross-wired, each fault counted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from team_helpers import team_config
from test_engine import scripted_engine

from mas.process.team_processes import TeamProcesses, TeamProcessError, close_shared_team_processes
from mas.types import Task

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(autouse=True, scope="module")
def _stop_workers():
    yield
    close_shared_team_processes()


def process_config(entry: str, processes: int, **topology) -> dict:
    cfg = team_config("m", "chain")
    cfg["topology"] = {"kind": "openai", "entry": f"team_process_helpers:{entry}", "processes": processes, **topology}
    return cfg


def reply(req) -> str:
    return f"ANSWER: {req.messages[-1]['content']}"


def test_episodes_in_worker_processes_are_batched_as_on_threads_and_never_cross_wired(tiny_tokenizer):
    engine, backend = scripted_engine(process_config("two_agents_report", 2), reply, tiny_tokenizer)
    tasks = [Task(f"t{i}", f"{i}+{i}", str(2 * i)) for i in range(20)]
    groups = engine.rollout(tasks, group_size=2, seed=0)
    pids = set()
    for ep in (e for g in groups for e in g.episodes):
        assert ep.status == "ok", ep.error
        report = json.loads(ep.answer)
        pids.add(report["pid"])
        assert [t.agent for t in ep.turns] == ["lead", "helper"]
        assert [t.text for t in ep.turns] == [f"ANSWER: {ep.task.prompt}"] * 2
        assert [r.replace("A=", "ANSWER:") for r in report["replies"]] == [t.text for t in ep.turns]
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # the team ran in the workers, at most two
    assert backend.requests == 80 and backend.calls == 2  # 40 episodes, two batched rounds, as on threads


def test_the_team_codes_error_ends_its_episode_with_the_type_and_message(tiny_tokenizer):
    engine, _ = scripted_engine(process_config("boom", 1), reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
    for ep in group.episodes:
        assert ep.status == "error" and ep.error == "ValueError: boom at 2+3"  # as on threads
        assert 'raise ValueError(f"boom at {task}")' in ep.info["traceback"]  # the worker's own frames
    assert engine.take_faults()[0]["agent_error"] == 2


def test_a_worker_that_dies_fails_its_episodes_and_the_next_rollout_gets_a_new_one(tiny_tokenizer):
    engine, _ = scripted_engine(process_config("exits", 3), reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    assert group.episodes[0].status == "error" and group.episodes[0].error.startswith("WorkerExited: ")
    assert "exited with code 3" in group.episodes[0].error
    engine, _ = scripted_engine(process_config("two_agents_report", 3), reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    assert group.episodes[0].status == "ok", group.episodes[0].error


def test_the_cap_on_model_calls_is_the_episodes_error_not_the_clients(tiny_tokenizer):
    cfg = process_config("two_agents_report", 1, max_model_calls=1)
    engine, _ = scripted_engine(cfg, reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    ep = group.episodes[0]
    assert ep.status == "error" and "model call limit" in ep.error and len(ep.turns) == 1
    assert engine.take_faults()[0]["model_call_limit"] == 1


def test_the_episode_timeout_ends_an_episode_whose_code_runs_in_a_worker(tiny_tokenizer, tmp_path):
    engine, _ = scripted_engine(process_config("call_pause_call", 1), reply, tiny_tokenizer)
    mark = tmp_path / "first_call"

    async def after_the_first_call(_seconds):  # the clock: the limit passes once the first call has its reply
        while not mark.exists():
            await asyncio.sleep(0.01)

    engine.episode_timeout, engine.sleep = 30.0, after_the_first_call
    [group] = engine.rollout([Task("t0", str(mark), "5")], group_size=1, seed=0)
    ep = group.episodes[0]
    assert ep.status == "error" and "timeout" in ep.error and len(ep.turns) == 1
    assert engine.take_faults()[0]["episode_timeout"] == 1


# --- the pool itself ----------------------------------------------------------------------------------


def test_a_worker_runs_its_jobs_at_once_and_returns_what_pickles_or_its_text():
    pool = TeamProcesses(1)

    async def main():
        together = await asyncio.gather(*(pool.run("team_process_helpers:together", 3) for _ in range(3)))
        awaited = await pool.run("team_process_helpers:async_pid", "q")
        text = await pool.run("team_process_helpers:unpicklable", "q")
        with pytest.raises(TeamProcessError) as err:
            await pool.run("team_process_helpers:boom", "q")
        return together, awaited, text, err.value

    try:
        together, awaited, text, error = asyncio.run(main())
    finally:
        pool.close()
    assert len(set(together)) == 1 and together[0] != os.getpid()  # three calls at once in one worker
    assert awaited == f"q from {together[0]}"
    assert text == "answer to q"
    assert error.type_name == type(error).__name__ == "ValueError" and str(error) == "boom at q"
    assert 'raise ValueError(f"boom at {task}")' in error.remote_traceback


def test_an_answer_that_does_not_unpickle_or_an_error_without_words_fails_its_job_and_the_worker_goes_on():
    """The worker pickles the answer and the parent unpickles it apart from the message, so an
    answer that does not come back fails its own job (it had killed the reader thread, and every
    job of that worker then waited forever)."""
    pool = TeamProcesses(1)

    async def main():
        with pytest.raises(TeamProcessError) as lost:
            await pool.run("team_process_helpers:does_not_come_back", "q")
        with pytest.raises(TeamProcessError) as mute:
            await pool.run("team_process_helpers:raises_mute", "q")
        after = await pool.run("team_process_helpers:async_pid", "q")
        return lost.value, mute.value, after

    try:
        lost, mute, after = asyncio.run(asyncio.wait_for(main(), 120))  # a guard against a hang, not a measure
        pids = pool.pids()
    finally:
        pool.close()
    assert type(lost).__name__ == "TypeError" and "does not unpickle here" in str(lost) and "TwoArgs" in str(lost)
    assert type(mute).__name__ == "Mute" and "str() raised RuntimeError: no words" in str(mute)
    assert after == f"q from {pids[0]}"  # the same worker answered the next job


def test_arguments_that_do_not_pickle_fail_the_call_and_leave_no_job_behind():
    pool = TeamProcesses(1)
    try:
        with pytest.raises(Exception, match="pickle"):
            asyncio.run(pool.run("team_process_helpers:async_pid", lambda: None))
        [worker] = pool._workers
        assert worker.jobs == {}  # a job left here would count against the worker when the next is placed
        assert asyncio.run(pool.run("team_process_helpers:async_pid", "q")) == f"q from {worker.process.pid}"
    finally:
        pool.close()


def test_a_closed_pool_stops_its_workers_and_refuses_new_jobs():
    pool = TeamProcesses(2)
    asyncio.run(pool.run("team_process_helpers:async_pid", "q"))
    [pid] = pool.pids()
    pool.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(pool.run("team_process_helpers:async_pid", "q"))


def test_a_worker_does_not_import_the_parents_main_module(tmp_path):
    """Under the `mas` command the main module imports torch; a worker that imported it again (as
    multiprocessing's spawn does) would hold torch too, about 290 MB instead of about 60."""
    script = tmp_path / "main_with_torch.py"
    script.write_text(
        "import asyncio, sys\n"
        "import torch  # noqa: F401 - as mas.cli does\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from mas.process.team_processes import TeamProcesses\n"
        "if __name__ == '__main__':\n"
        "    pool = TeamProcesses(1)\n"
        "    print('torch in worker:', asyncio.run(pool.run('team_process_helpers:loaded', 'torch')))\n"
        "    print('openai in worker:', asyncio.run(pool.run('team_process_helpers:loaded', 'openai')))\n"
        "    pool.close()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch in worker: False" in out.stdout and "openai in worker: True" in out.stdout, out.stdout


def test_a_worker_ignores_ctrl_c_which_its_run_handles():
    """Ctrl-C in a terminal reaches every process of the group: the worker neither dies nor prints
    a traceback, and the run that handles it ends the worker."""
    import signal

    pool = TeamProcesses(1)
    try:
        first = asyncio.run(pool.run("team_process_helpers:async_pid", "q"))
        [pid] = pool.pids()
        os.kill(pid, signal.SIGINT)
        assert asyncio.run(pool.run("team_process_helpers:async_pid", "q")) == first
        assert pool.pids() == [pid]
    finally:
        pool.close()
