"""The format warm-up: a short supervised stage on demonstrations of the team's protocol, before RL.

RL cannot start from zero reward.  A small real model (SmolLM2-135M-Instruct) asked to
orchestrate writes prose instead of ``CALL adder: 3+4``, and nothing it does parses, so every
episode scores 0 and every advantage is 0.  ``trainer.warmup`` fine-tunes each trainable
policy for a few steps on demonstrations of its agents' turns, in the team's own messages and
the model's own chat template, so that RL starts from a team that follows the protocol.

Where demonstrations come from (``WarmupConfig``):

* the team's **scripted teacher**: the teachers the embedded model is warm-started on
  (``mas.topologies.teaching``), generalised to the team's own agent names and played through the
  real engine and topology with the team's own role prompts and tokenizers, so every
  demonstration is exactly a turn the team would produce.  Each teacher teaches the protocol
  but keeps a deliberate weakness (``p_direct``: answering at once instead of delegating or
  working it out) for RL to fix;
* or a JSONL file the user supplies (``{agent, messages, completion}`` per line).

The warm-up never sees a held-out task: the teacher plays training tasks from a task stream of
its own (the env's training split, seeded apart from the run's stream, which stays untouched).
It is recorded in the run as its own phase: its steps, losses and time, and the held-out
accuracy after it (``summary["warmup"]``, ``{"eval": "warmup"}`` in metrics.jsonl).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mas.agents.prompts import render_prompt
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.messages import ConfigError
from mas.config.schema import RunConfig
from mas.rollout.engine import Engine
from mas.envs import build_env
from mas.process.memory import release_freed_memory
from mas.learning.sft import Demonstration
from mas.topologies import build_topology, kind_of
from mas.topologies.teaching import NoTeacher, Teacher
from mas.types import StepAbandoned

DEMO_STREAM = 1_000_003  # the teacher's task stream: the env's seed plus this (training split, apart from the run's)


def scripted_teacher(cfg: RunConfig, knobs: dict[str, float]) -> Teacher:
    """The scripted teacher of ``cfg``'s team, with its agents' own names; a ``ConfigError`` naming
    ``trainer.warmup.demonstrations`` when the team has none (another layout, another task).

    Teams and their teachers (each keeps a deliberate, documented weakness for RL to fix):

    * arithmetic (``synthetic_math``): orchestrator, debate and solver/verifier chain teams, the
      embedded model's teachers (``mas.topologies.teaching``) under the team's agent names; the
      AutoGen selector team (``SelectorTeacher``); a LangGraph graph of one answering and one
      verdict agent, on ``synthetic_math`` or a custom task set of arithmetic expressions
      (``ChainTeacher`` on the task read from the framework's messages, ``FrameworkChainTeacher``);
    * GSM8K solver/verifier chains: the training problem's own worked solution (``SolutionChainTeacher``);
    * HotpotQA researcher (search, read) -> answerer chains (``ResearchTeacher``);
    * researcher (search, read) -> answerer chains on the generated two-hop facts (``FactsTeacher``, the embedded
      model's research teacher, which copies every name from what it has read);
    * the team tasks of ``envs/team`` (conjunctive and relay as parts chains, saboteur);
    * any other AutoGen or LangGraph team, on any env: the generic ``FrameworkTeacher``
      (``topologies/framework_teaching.py``), which reads each request from the messages the
      framework built (who routes, who hands off, who answers); weakness ``p_skip``/``p_slip``.
    """
    try:
        return kind_of(cfg.topology).teacher(cfg, knobs, lambda: build_env(demo_env_config(cfg)))
    except NoTeacher as e:
        raise ConfigError("config", [f"trainer.warmup: no scripted teacher for this team ({e}); give "
                                     "trainer.warmup.demonstrations, a JSONL file of {agent, messages, completion}"]) from None


def demo_env_config(cfg: RunConfig) -> Any:
    """The env config of the teacher's task stream: the run's env, seeded apart (training split only)."""
    return cfg.env.model_copy(update={"seed": cfg.env.seed + DEMO_STREAM}) if hasattr(cfg.env, "seed") else cfg.env


def teacher_demonstrations(team: Any, episodes: int, teacher: Teacher, seed: int) -> tuple[list[tuple[str, Demonstration]], float]:
    """``(agent, (prompt_ids, completion_ids))`` of every turn of ``episodes`` teacher episodes
    played through the team's own topology, agents and tokenizers on training tasks of a task
    stream of its own; and the teacher's mean reward."""
    cfg = team.cfg
    env = build_env(demo_env_config(cfg))
    rng = random.Random(f"warmup/{seed}")
    tokenizers = team.runtime.tokenizers
    backend = ScriptedBackend(lambda req: teacher(req, rng), tokenizers)
    rt = cfg.runtime
    engine = Engine(build_topology(cfg.topology), team.agents, tokenizers, dict.fromkeys(tokenizers, False), backend, env.score,
                    tools=getattr(env, "tools", {}), tool_timeout_s=rt.tool_timeout_s, tool_memory_mb=rt.tool_memory_mb,
                    tool_workers=rt.tool_workers)  # the env's tools (search, read) run for the teacher's calls too
    out: list[tuple[str, Demonstration]] = []
    rewards = []
    try:
        groups = engine.rollout(env.sample_tasks(episodes), group_size=1, seed=seed)
    finally:
        engine.close()
    failed = [g.episodes[0] for g in groups if g.episodes[0].status == "error"]
    if failed:  # a teacher that cannot play its team (its messages, the model-call cap): loud, not a missing demonstration
        raise ConfigError("config", [teacher_failure(failed, len(groups))])
    for group in groups:
        ep = group.episodes[0]
        rewards.append(ep.reward)
        out += [(t.agent, (list(t.prompt_ids), list(t.completion_ids))) for t in ep.turns if t.completion_ids]
    return out, sum(rewards) / max(len(rewards), 1)


def teacher_failure(failed: list[Any], played: int) -> str:
    """The line that stops a run whose warm-up teacher failed episodes: how many, the first one's
    task and error, and what to change.  Stopping (rather than dropping those episodes) keeps the
    warm-up from teaching a protocol the team's own topology cannot finish; the same error would
    fail RL's episodes too."""
    first = failed[0]
    return (f"trainer.warmup: {len(failed)} of the scripted teacher's {played} episodes failed, so the warm-up cannot "
            f"demonstrate the team's protocol (the first, task {first.task_id!r}: {first.error}); RL's episodes can "
            "stop the same way: fix what the error names (e.g. raise topology.max_model_calls), or give "
            "trainer.warmup.demonstrations (a JSONL file of {agent, messages, completion}), or skip the warm-up "
            "with trainer.warmup.steps=0")


def file_demonstrations(team: Any, path: str) -> list[tuple[str, Demonstration]]:
    """Demonstrations from a JSONL file of ``{agent, messages, completion}``, rendered with each
    agent's chat template (the completion ends with the tokenizer's EOS, as a sampled turn does)."""
    out = []
    file = Path(path)
    if not file.is_file():
        raise ConfigError("config", [f"trainer.warmup.demonstrations: no such file {path!r}"])
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            agent, messages, completion = row["agent"], row["messages"], row["completion"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError("config", [f"trainer.warmup.demonstrations: {path}:{n}: expected "
                                          f"{{agent, messages, completion}} ({type(e).__name__}: {e})"]) from None
        if agent not in team.agents:
            raise ConfigError("config", [f"trainer.warmup.demonstrations: {path}:{n}: unknown agent {agent!r}; "
                                         f"valid: {sorted(team.agents)}"])
        tok = team.runtime.tokenizers[team.agents[agent].policy]
        prompt = render_prompt(tok, messages)
        out.append((agent, (prompt, tok.encode(completion, add_special_tokens=False) + [tok.eos_token_id])))
    return out


class WarmupStopped(StepAbandoned):
    """A stop between warm-up steps.  ``record``: the warm-up's record with the policies that
    finished; ``current``: the policy it stopped in, ``state`` where that one stands
    (``SupervisedRun.state_dict``): what a checkpoint keeps so that the resumed run goes on from
    the next step (``warm_up(resume=...)``).  ``state`` is None where the runtime cannot say (a
    policy sharded over several workers): the resumed run then warms that policy up again, from
    the weights the checkpoint holds."""

    def __init__(self, message: str, record: dict[str, Any], current: str, state: dict[str, Any] | None):
        super().__init__(message)
        self.record, self.current, self.state = record, current, state


def warm_up(team: Any, log: Callable[[str], None], abort: Callable[[], bool] | None = None,
            progress: bool = False, resume: WarmupStopped | None = None) -> dict[str, Any]:
    """Fine-tune every trainable policy on its agents' demonstrations (``trainer.warmup``);
    returns the phase's record: per policy its steps, losses, tokens and seconds.  ``progress``:
    a bar per policy on stderr (steps, loss, time left).  ``abort`` is asked before each step:
    the warm-up then stops with ``WarmupStopped``, which ``resume`` takes back to go on from
    there (the weights are the checkpoint's; the demonstrations are played again, the same)."""
    cfg = team.cfg
    w = cfg.trainer.warmup
    if w.demonstrations is not None:
        demos, teacher_reward = file_demonstrations(team, w.demonstrations), None
    else:
        demos, teacher_reward = teacher_demonstrations(team, w.episodes, scripted_teacher(cfg, w.teacher), cfg.trainer.seed)
    chosen = set(w.agents) or set(team.agents)
    unknown = sorted(chosen - set(team.agents))
    if unknown:
        raise ConfigError("config", [f"trainer.warmup.agents: unknown agents {unknown}; valid: {sorted(team.agents)}"])
    by_policy: dict[str, list[Demonstration]] = {}
    for agent, demo in demos:
        policy = team.agents[agent].policy
        if agent in chosen and policy in team.learners:
            by_policy.setdefault(policy, []).append(demo)
    record: dict[str, Any] = {"steps": w.steps, "batch_size": w.batch_size, "lr": w.lr,
                              "source": w.demonstrations or "teacher", "teacher_reward": teacher_reward, "policies": {}}
    if resume is not None:
        record["policies"].update(resume.record["policies"])
    for name, items in by_policy.items():
        if name in record["policies"]:  # finished before the stop the run resumed from
            continue
        state = resume.state if resume is not None and resume.current == name else None
        done = len(state["losses"]) if state is not None else 0
        log(f"warm-up: policy {name!r} on {len(items)} demonstration turns, {w.steps} supervised steps before RL "
            f"(its own phase: trainer.steps does not shorten it; trainer.warmup.steps=N does, 0 skips it)"
            + (f"; going on from step {done + 1}" if done else ""))
        try:
            got = supervised_phase(team.runtime, name, items, w, cfg.trainer.seed, abort, progress, state)
        except WarmupStopped as e:
            e.record = record
            raise
        team.backend.sync_weights(name)
        release_freed_memory()  # this policy's activations and its dropped optimizer: back to the system before the next phase
        record["policies"][name] = {**got, "loss_first": got["losses"][0], "loss_last": got["losses"][-1]}
    return record


def supervised_phase(runtime: Any, name: str, items: list[Demonstration], w: Any, seed: int,
                     abort: Callable[[], bool] | None, progress: bool, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """``w.steps`` supervised steps of policy ``name`` through its runtime, one step a call, so a
    stop is seen between steps (Ray actors included) and the bar moves with each; ``state``:
    where a stopped warm-up of it stood (``WarmupStopped.state``)."""
    done = runtime.warm_up_begin(name, items, batch_size=w.batch_size, lr=w.lr, seed=seed, state=state)
    bar = tqdm(total=w.steps, initial=done, desc=f"warm-up {name}", unit="step", file=sys.stderr, dynamic_ncols=True,
               disable=not progress)
    try:
        for step in range(done, w.steps):
            if abort is not None and abort():
                raise WarmupStopped(f"policy {name!r}: warm-up stopped before step {step + 1} of {w.steps}",
                                    {}, name, runtime.warm_up_state(name))
            loss = runtime.warm_up_steps(name, 1)[-1]
            bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)
            bar.update(1)
    finally:
        bar.close()
        got = runtime.warm_up_end(name)  # its optimizer dropped whether or not it finished
    return got
