"""Real ``mas`` commands without paying Python's start-up each time: one pre-imported interpreter
(the "zygote") forks a process per command, and that process runs ``mas.cli`` as ``__main__``
exactly as ``python -m mas.cli ARGS`` would, in its own process with its own environment, stdout
and stderr, so a test can SIGKILL or SIGTERM it and read its exit status.

Why: a short ``mas train`` spends most of its time importing torch, transformers, accelerate and
the rest (about two thirds of a 4-step quickstart).  The zygote imports those once and runs nothing;
each forked command then starts with nothing of any run in memory (no model, no cache, no
training state: the zygote never trained), as a new process would.  What it shares with its
siblings is only what an import does: a test that needs a fresh interpreter's import-time state
(e.g. its hash seed) runs ``python -m mas.cli`` instead (tests/test_kill_resume.py compares the
forked runs with such a run).

The zygote stays single-threaded and never touches a tensor, so forking it is safe.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The zygote: import what a `mas train` imports, then fork one child per "run" request.  A child
# leaves the request loop and runs mas.cli as __main__ at the top level, so its SystemExit, an
# uncaught exception and interpreter exit (atexit, flushing) behave as under `python -m mas.cli`.
_ZYGOTE = r"""
import importlib, json, os, sys
reply = os.fdopen(os.dup(1), "w")  # the answers to the test; anything printed on stdout goes to stderr
os.dup2(2, 1)
import mas.cli  # first: it sets MKL_CBWR before torch loads, as `python -m mas.cli` does
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:  # a warm-up only: a command imports what it needs itself
        pass
job = None
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "run":
        pid = os.fork()
        if pid == 0:
            job = req
            break
        reply.write(json.dumps({"pid": pid}) + "\n")
    elif req["op"] == "poll":
        done, status = os.waitpid(req["pid"], os.WNOHANG)
        reply.write(json.dumps({"code": os.waitstatus_to_exitcode(status) if done else None}) + "\n")
    reply.flush()
if job is None:  # stdin closed: the zygote ends (it ran nothing, so it has nothing to clean up)
    os._exit(0)
reply.close()
os.environ.clear()
os.environ.update(job["env"])
os.chdir(job["cwd"])
for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                        (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    new = os.open(path, flags, 0o644)
    os.dup2(new, fd)
    os.close(new)
sys.argv = [mas.cli.__file__, *json.loads(os.environ.pop("MAS_FORKED_ARGV"))]
del sys.modules["mas.cli"], sys.modules["mas"].cli  # as under `python -m`: mas.cli runs as __main__ only
import runpy
runpy.run_module("mas.cli", run_name="__main__", alter_sys=True)
"""

# what `mas train` imports on its way (its lazy imports, and the libraries they pull in)
TRAIN_IMPORTS = ("mas.training.trainer", "mas.training.team", "mas.training.checkpoint", "mas.training.signals",
                 "mas.training.rundir", "mas.training.callbacks", "mas.config.checks", "mas.runtime.local",
                 "mas.runtime.policy_state", "mas.learning.learner", "mas.rollout.engine", "mas.embedded.build",
                 "accelerate", "accelerate.checkpointing", "peft", "ray", "jsonschema", "safetensors.torch",
                 "torch.utils.tensorboard", "transformers.optimization", "transformers.trainer_pt_utils",
                 "transformers.models.auto.modeling_auto", "transformers.models.qwen2.modeling_qwen2",
                 "transformers.models.qwen2.tokenization_qwen2")


class Zygote:
    """A pre-imported interpreter that starts ``mas`` commands by forking (see the module docstring)."""

    def __init__(self, env: dict[str, str], imports: tuple[str, ...] = TRAIN_IMPORTS):
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, *imports], cwd=ROOT, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.started: list[ForkedCommand] = []

    def _ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote ended (exit {self.proc.wait()})")
        return json.loads(line)

    def mas(self, args: list[str], out_dir: Path, env: dict[str, str] | None = None) -> ForkedCommand:
        """Start ``mas ARGS`` (cwd: the repository), its stdout and stderr to files in ``out_dir``."""
        env = {**(self.env if env is None else env), "MAS_FORKED_ARGV": json.dumps(args)}
        n = len(list(out_dir.glob("cmd-*.out")))
        stdout, stderr = out_dir / f"cmd-{n}.out", out_dir / f"cmd-{n}.err"
        pid = self._ask(op="run", env=env, cwd=str(ROOT), stdout=str(stdout), stderr=str(stderr))["pid"]
        self.started.append(ForkedCommand(self, pid, stdout, stderr))
        return self.started[-1]

    def close(self) -> None:
        """Kill what it started and is still running (a failed test's paused run), then end the zygote."""
        for cmd in self.started:
            cmd.kill()
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class ForkedCommand:
    """The part of ``subprocess.Popen`` the tests use: pid, poll(), wait(), communicate(), returncode."""

    def __init__(self, zygote: Zygote, pid: int, stdout: Path, stderr: Path):
        self.zygote, self.pid, self.stdout, self.stderr = zygote, pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote._ask(op="poll", pid=self.pid)["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"mas (pid {self.pid})", timeout)
            time.sleep(0.02)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.stdout.read_text(errors="replace"), self.stderr.read_text(errors="replace")

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()
