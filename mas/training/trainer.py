"""The training loop.  One step reads top to bottom:

    rollout -> score -> credit (plan -> execute -> assign) -> update (one learner per policy)
    -> sync -> log

Every step reseeds python, numpy and torch from (seed, step), so a resumed run repeats the
steps a straight run would have taken.

Updates run apart: every active learner's update is started, then all are collected, so under
the Ray runtime each policy's actor trains at the same time (the local runtime runs them in
turn).  With ``trainer.max_staleness: 1`` (Ray) the next step's rollout runs while this step's
updates do, on the weights they started from: every turn is then at most one update old (its
``weight_version``; the staleness seen is in each policy's step metrics), and the PPO ratio is
taken against its sampling logprobs as always.  Credit-time generations (replays,
interventions, critic calls) never overlap an update: they run after the previous step's sync,
on the weights this step's update starts from.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mas.rollout.backends.base import policy_seed, take_backend_metrics
from mas.training.callbacks import Callback, CallbackList, RunControl
from mas.training.checkpoint import (BEST, WARMUP_STATE, WARMUP_STEP, latest_checkpoint, load_checkpoint, load_extra,
                                     prune_checkpoints, save_checkpoint)
from mas.config.checks import config_warnings, machine_warnings
from mas.config.schema import _path
from mas.credit import build_credit_batch, get_credit, run_credit
from mas.credit.filters import drop_constant_groups
from mas.credit.registry import followup_credit, plan_credit
from mas.embedded.fit import fit_checks
from mas.process.fault_points import enter_step, pause_point
from mas.learning.learner import TrainSample, UpdateSpan
from mas.process.memory import release_freed_memory
from mas.training.evaluation import evaluate, regression
from mas.training.metrics import (RunLogger, Silence, credit_cost, divergence_warning, eval_summary, held_out_story,
                                  step_metrics)
from mas.training.rundir import check_fresh
from mas.runtime import PolicyActorDied
from mas.training.team import Team, describe_team
from mas.training.warmup import WarmupStopped, warm_up
from mas.types import (FAILURE, Credit, CritiqueRequest, Episode, EpisodeGroup, InterventionRequest, ReplayRequest,
                       StepAbandoned, flatten_turns)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919) % (2**31 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@dataclass
class Rollout:
    """One step's episodes, how long they took, the completion tokens and faults of their
    generation, and the task stream's position before their tasks were drawn (what a
    checkpoint records if this rollout ran ahead of its step)."""

    step: int
    groups: list[EpisodeGroup]
    seconds: float
    env_state: dict
    tokens: int = 0
    faults: tuple[dict[str, int], dict[str, str]] = ({}, {})


@dataclass
class StepResult:
    groups: list[EpisodeGroup]
    credit: Credit
    metrics: dict
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (kind, message) for the run's warnings.jsonl
    upcoming: Rollout | None = None  # the next step's rollout, taken during this step's updates
    spans: dict[str, UpdateSpan] = field(default_factory=dict)  # where and when each policy's update ran


def rollout(team: Team, step: int, abort: Callable[[], bool] | None = None) -> Rollout:
    """B tasks, G joint episodes each; the engine scores each episode with env.score as it ends."""
    env_state = team.env.state_dict()
    t0 = time.perf_counter()
    tokens = team.engine.stats["generated_tokens"]
    tasks = team.env.sample_tasks(team.cfg.trainer.batch_size)
    groups = team.engine.rollout(tasks, team.cfg.trainer.group_size, seed=step_seed(team.cfg.trainer.seed, step), abort=abort)
    tokens = team.engine.stats["generated_tokens"] - tokens
    return Rollout(step, groups, time.perf_counter() - t0, env_state, tokens, team.engine.take_faults())


def train_step(team: Team, step: int, ready: Rollout | None = None, prefetch: bool = False,
               abort: Callable[[], bool] | None = None) -> StepResult:
    """One training step.  ``ready``: this step's rollout if it was taken already (max_staleness 1);
    ``prefetch``: take the next step's rollout while this step's updates run.

    ``abort`` is asked at the step's safe points: before each generation batch of the rollout
    and the credit's evaluations, and before each micro-batch of the updates' gradients while
    no optimizer has stepped (every policy's gradients are computed before any steps, in the
    local runtime).  True raises ``StepAbandoned``: nothing of the step reached the weights.
    Once the updates are committed (Ray actors update on their own; or every gradient is in),
    the step runs to its end."""
    cfg = team.cfg
    seed = step_seed(cfg.trainer.seed, step)
    seed_everything(seed)
    timings: dict[str, float] = {}
    t_step = time.perf_counter()

    # 1. rollout + score: G joint episodes for each of B tasks (replays and interventions are
    #    scored the same way); with max_staleness 1 it ran during the previous step's updates
    current = ready if ready is not None else rollout(team, step, abort)
    assert current.step == step, f"rollout of step {current.step} handed to step {step}"
    groups = current.groups
    timings["rollout"] = current.seconds
    generated = GeneratedTokens(team.engine, rollout_tokens=current.tokens)
    pause_point("after_rollout", step)

    # 2. credit: extra evaluations if the method plans any (timed per kind), then one advantage per turn
    t0 = time.perf_counter()
    batch = build_credit_batch(groups, list(team.agents))
    requests = plan_credit(groups, cfg.credit)
    timings.update(dict.fromkeys(CREDIT_TIMERS, 0.0))
    results = execute_timed(team.engine, requests, seed + 1, timings, abort) if requests else None
    more = followup_credit(groups, cfg.credit, results)  # e.g. a critic's format retries
    if more:
        results.update(execute_timed(team.engine, more, seed + 2, timings, abort))
        requests += more
    cost = credit_cost(requests, results)
    generated.mark("credit_tokens")  # the method's own generations: replays, coalitions, removal runs, critic replies
    t1 = time.perf_counter()
    try:
        credit = run_credit(batch, cfg.credit, results)
    except FloatingPointError as e:  # name the step too (the method names the agents)
        raise FloatingPointError(f"step {step}: {e}") from e
    if cfg.trainer.drop_constant_groups:  # DAPO's filter: groups with one reward for every episode teach nothing
        credit, constant = drop_constant_groups(batch, credit)
    timings["credit_assign"] = time.perf_counter() - t1
    timings["credit"] = time.perf_counter() - t0

    # 3. update: each trainable policy learns from its own turns only; every update is started
    #    first, then all are collected (under Ray each policy's actor trains at the same time)
    t0 = time.perf_counter()
    active = active_learners(team, step)
    samples, staleness = training_batches(team, groups, credit, active)
    abort_updates = abort if team.runtime.can_abandon_updates else None  # Ray actors step on their own
    started = {}
    for name, learner in active.items():  # local: each policy's gradients now (abortable); its step at result()
        started[name] = learner.start_update(samples[name], seed=policy_seed(seed, name), abort=abort_updates)
    try:
        #    with max_staleness 1 the next step's rollout runs now, on the weights these updates started from
        upcoming = rollout(team, step + 1) if prefetch else None
        updates = {name: handle.result() for name, handle in started.items()}
    except FloatingPointError as e:  # the learner names the policy; add the step
        wait_all(started)
        raise FloatingPointError(f"step {step}: {e}") from e
    except Exception:
        wait_all(started)  # no update may still be running when the error leaves the step
        raise
    spans = {name: handle.span for name, handle in started.items()}
    for name, span in spans.items():
        timings[f"update/{name}"] = span.seconds  # this policy's own update, inside the phase's wall time
        lag = staleness[name]
        updates[name].update(staleness_mean=sum(lag) / len(lag) if lag else 0.0, staleness_max=float(max(lag, default=0)))
    timings["update"] = time.perf_counter() - t0
    if upcoming is not None:
        timings["rollout_overlapped"] = upcoming.seconds  # the next step's rollout, inside this update phase
    pause_point("after_update", step)

    # 4. sync: the rollout backend serves the new weights
    t0 = time.perf_counter()
    for name in updates:
        team.backend.sync_weights(name)
    timings["sync"] = time.perf_counter() - t0
    timings["step"] = time.perf_counter() - t_step

    faults, fault_messages = merge_faults(current.faults, team.engine.take_faults())  # this step's rollout, then credit
    metrics = step_metrics(step, groups, batch, credit, updates, timings, cost, generated.counts(), faults)
    # who went unheard: agents without a turn in any episode, updated policies without a sample
    # (train() warns the first time and counts after that: mas.training.metrics.Silence)
    metrics["silent_agents"] = [a for a in batch.agent_names if a not in metrics["agents"]]
    metrics["idle_policies"] = [name for name in active if not samples[name]]
    if cfg.trainer.drop_constant_groups:
        metrics["constant_groups_dropped"] = constant
    if cfg.trainer.train_failed:
        metrics["failed_episodes_trained"] = sum(ep.status == "error" and trained_episode(ep, cfg.trainer.train_failed)
                                                 for g in groups for ep in g.episodes)
    engines = take_backend_metrics(team.backend)  # vLLM: engine start-up (first step), per-call cost, sync time
    if engines:
        metrics["backend"] = engines
    warnings = [(f"fault.{kind}", f"step {step}: {faults[kind]} x {kind}, e.g. {message}") for kind, message in fault_messages.items()]
    diverged = divergence_warning(results)
    if diverged:
        warnings.append(("replay_divergence", diverged))
    return StepResult(groups, credit, metrics, warnings, upcoming, spans)


class GeneratedTokens:
    """Completion tokens the engine generated in each phase of a step (the compute a budget matches)."""

    def __init__(self, engine, **earlier: int) -> None:
        self.engine = engine
        self.last = engine.stats["generated_tokens"]
        self.phases: dict[str, int] = dict(earlier)  # phases counted before (a rollout taken ahead)

    def mark(self, phase: str) -> None:
        """Attribute the tokens generated since the previous mark to ``phase``."""
        now = self.engine.stats["generated_tokens"]
        self.phases[phase] = self.phases.get(phase, 0) + now - self.last
        self.last = now

    def counts(self) -> dict[str, int]:
        return {**self.phases, "total": sum(self.phases.values())}


def merge_faults(*parts: tuple[dict[str, int], dict[str, str]]) -> tuple[dict[str, int], dict[str, str]]:
    """Fault counts summed by kind, and the first message of each kind, over ``take_faults`` results."""
    counts: dict[str, int] = {}
    messages: dict[str, str] = {}
    for part_counts, part_messages in parts:
        for kind, n in part_counts.items():
            counts[kind] = counts.get(kind, 0) + n
        for kind, message in part_messages.items():
            messages.setdefault(kind, message)
    return counts, messages


# extra evaluations by request kind -> the timer they count under
REQUEST_TIMERS = {ReplayRequest: "credit_replays", InterventionRequest: "credit_interventions", CritiqueRequest: "credit_critic"}
CREDIT_TIMERS = (*REQUEST_TIMERS.values(), "credit_assign")


def execute_timed(engine, requests: list, seed: int, timings: dict[str, float], abort: Callable[[], bool] | None = None) -> dict:
    """``engine.execute`` one request kind at a time, adding each kind's wall time to ``timings``
    (replays, interventions such as SHARP coalitions or CCPO solo runs, critic calls)."""
    unknown = sorted({type(r).__name__ for r in requests if not isinstance(r, tuple(REQUEST_TIMERS))})
    if unknown:
        raise TypeError(f"unknown request types {unknown}; valid: {[k.__name__ for k in REQUEST_TIMERS]}")
    results: dict = {}
    for kind, timer in REQUEST_TIMERS.items():
        batch = [r for r in requests if isinstance(r, kind)]
        if batch:
            t0 = time.perf_counter()
            results.update(engine.execute(batch, seed=seed, abort=abort))
            timings[timer] += time.perf_counter() - t0
    return results


def trained_episode(ep: Episode, train_failed: tuple[str, ...]) -> bool:
    """Whether an episode's turns go into the update: every one that did not fail, and a failed one
    whose failure ``trainer.train_failed`` lists (the others count, at reward 0, in the credit's
    statistics only)."""
    return ep.status != "error" or ep.info.get(FAILURE) in train_failed


def training_batches(team: Team, groups: list[EpisodeGroup], credit: Credit, active: dict) -> tuple[dict, dict]:
    """Each active policy's turns as ``TrainSample``s (of the episodes ``trained_episode`` keeps),
    and how many updates old each one's weights were (learner version minus the turn's weight
    version)."""
    samples: dict[str, list[TrainSample]] = {name: [] for name in active}
    staleness: dict[str, list[int]] = {name: [] for name in active}
    n = sum(len(ep.turns) for g in groups for ep in g.episodes)
    keep = credit.train_mask.tolist() if credit.train_mask is not None else [True] * n
    train_failed = team.cfg.trainer.train_failed
    for (ep, turn), adv, kept in zip(flatten_turns(groups), credit.advantages.tolist(), keep):
        if kept and turn.trainable and turn.completion_ids and turn.policy in samples and trained_episode(ep, train_failed):
            # the temperature the turn was drawn at (the engine records it); a turn recorded before turns
            # kept their sampling falls back to its agent's configured one
            temperature = turn.temperature if turn.temperature is not None else team.agents[turn.agent].sampling.temperature
            samples[turn.policy].append(TrainSample(turn.prompt_ids, turn.completion_ids, turn.logprobs, adv, temperature))
            if turn.weight_version is not None:
                staleness[turn.policy].append(active[turn.policy].version - turn.weight_version)
    return samples, staleness


def wait_all(handles: dict) -> None:
    """Wait until every started update has ended, whatever its outcome (errors are the caller's)."""
    for handle in handles.values():
        try:
            handle.result()
        except Exception:  # noqa: BLE001 - the step already fails with the first error
            pass


def active_learners(team: Team, step: int) -> dict:
    """Learners that update at ``step``: all, or with ``trainer.alternate`` one policy at a time
    for ``switch_every`` steps while the others are frozen (as in CCPO's alternating schedule)."""
    order = team.cfg.trainer.alternate
    if not order:
        return team.learners
    name = order[(step // team.cfg.trainer.switch_every) % len(order)]
    return {name: team.learners[name]}


def restart_actors(team: Team, run_dir: Path, logger: RunLogger, error: Exception, restarts: int,
                   first: tuple[int, dict]) -> int:
    """``runtime.restart_actors``: start the dead actor(s) again, restore every policy, the data
    cursor and the credit state from the last checkpoint (or, before the first one, start the
    run again with fresh actors), and return the step to continue from."""
    limit = team.cfg.runtime.max_restarts
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        team.runtime.restart()
        state = load_checkpoint(ckpt, team)
        step = state["step"] + 1
    else:  # nothing saved yet: every actor starts from its initial weights
        team.runtime.restart(everything=True)
        step, env_state = first
        team.env.load_state_dict(env_state)
        method = get_credit(team.cfg.credit.method)
        if method.state is not None:
            method.state.reset()
    logger.truncate_after(step - 1)  # the lost steps' records and warnings go; then say what happened
    logger.warn(f"{error} Restarted the actor (restart {restarts} of {limit}); repeating from step {step}.",
                kind="actor_restart", step=step)
    if logger.bar is not None:
        logger.bar.n = step
        logger.bar.refresh()
    return step


def periodic_eval_due(cfg, step: int, end: int, stopping: bool) -> bool:
    """Whether ``trainer.eval_every`` asks for a held-out evaluation after ``step``: every N
    steps, after the last step of this call, and when the run is about to stop."""
    every = cfg.trainer.eval_every
    return bool(every and cfg.trainer.eval_size) and ((step + 1) % every == 0 or step == end - 1 or stopping)


def train(
    team: Team,
    run_dir: Path,
    resume: bool = False,
    stop_after: int | None = None,
    callbacks: Iterable[Callback] = (),
    control: RunControl | None = None,
) -> dict:
    """Run (or continue) training; returns a summary with held-out accuracy before/after.

    ``callbacks`` are called after each step, evaluation and checkpoint (``mas.training.callbacks``).
    ``control`` carries the stop flag that callbacks and signal handlers set.  A plain stop
    request is read at the next step boundary: the run checkpoints the last completed step,
    records ``summary["stopped"]`` and returns.  A request to abandon (a signal) is read at
    the safe points inside a step (``train_step``) and inside evaluations: the step in
    progress is dropped, and the checkpoint written is the state it started from (its
    weights, which no optimizer touched yet, the task stream's position and the credit
    method's state before it), so ``--resume`` repeats that step exactly.  A dropped
    periodic evaluation is recorded as due and run first on resume.
    """
    cfg = team.cfg
    control = control or RunControl()
    abort = control.abandoning
    if not resume:
        check_fresh(run_dir)  # a new run never mixes its logs and checkpoints with an old one
    logger = RunLogger(run_dir, cfg, show_progress=cfg.logging.progress)
    hooks = CallbackList([*fit_checks(cfg, logger.warn), *callbacks], control)  # + a warning if the embedded model cannot parse the team
    logger.write_run_info(describe_team(team))
    if not resume:
        for path, value, message in config_warnings(cfg):
            logger.warn(f"{_path(path)}: {message} (found {value!r})", kind="config")
        for path, value, message in machine_warnings(cfg):
            logger.warn(f"{_path(path)}: {message} (found {value!r})", kind="machine")
    start = 0
    summary: dict = {}
    warmup_from: WarmupStopped | None = None  # a warm-up stopped part-way, which this run goes on with
    method = get_credit(cfg.credit.method)
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"--resume {run_dir}: no complete checkpoint there (checkpoints/latest is missing)")
        state = load_checkpoint(ckpt, team)
        start = max(0, state["step"] + 1)
        summary = state["summary"]
        summary.pop("stopped", None)
        logger.truncate_after(state["step"])
        if state["step"] < 0:  # a warm-up checkpoint: the evaluations after it run again
            logger.drop_evals(("warmup", "noise"))
        if state["step"] == WARMUP_STEP:
            part = summary.pop("warmup_stopped")
            warmup_from = WarmupStopped("", part["record"], part["current"], load_extra(ckpt, WARMUP_STATE))
    elif method.state is not None:  # a fresh run starts without history from earlier runs
        method.state.reset()
    if not resume and cfg.trainer.eval_size and cfg.trainer.eval_before:
        try:
            summary["eval_before"] = evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed, abort, logger.show_progress,
                                              "eval before training")
        except StepAbandoned:  # nothing was trained: nothing to checkpoint
            return _stopped(summary, logger, control, None, "during the evaluation before training")
        logger.info(f"held-out team {eval_summary(summary['eval_before'])} before training")
        logger.log_eval("before", summary["eval_before"])
        hooks.on_eval("before", summary["eval_before"])
    if cfg.trainer.warmup.steps and "warmup" not in summary:  # the format warm-up: its own phase, before RL
        try:
            summary["warmup"] = warm_up(team, logger.info, abort, progress=logger.show_progress, resume=warmup_from)
        except WarmupStopped as e:  # its weights and where it stood: the resumed run goes on from the next step
            part = {"record": e.record, "current": e.current}
            hooks.on_checkpoint(WARMUP_STEP, save_checkpoint(run_dir, WARMUP_STEP, team, {**summary, "warmup_stopped": part},
                                                             extra={WARMUP_STATE: e.state} if e.state is not None else None))
            return _stopped(summary, logger, control, WARMUP_STEP, f"during the format warm-up ({e}); its checkpoint "
                            f"keeps the steps taken")
        logger.log_warmup(summary["warmup"])
        if start < cfg.trainer.steps:
            # the warm-up's weights (cpu_facts: 40 minutes), saved as soon as it ends: a run stopped
            # or killed later, in the evaluations that follow or before its first step checkpoint,
            # resumes from here instead of warming up again
            hooks.on_checkpoint(-1, save_checkpoint(run_dir, -1, team, summary))
    if start == 0 and "warmup" in summary and "eval_warmup" not in summary and cfg.trainer.warmup.eval and cfg.trainer.eval_size:
        try:
            summary["eval_warmup"] = evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed, abort, logger.show_progress,
                                              "eval after the warm-up")
        except StepAbandoned:  # the warm-up's checkpoint stays: resuming evaluates it again
            return _stopped(summary, logger, control, -1, "during the evaluation after the warm-up")
        logger.info(f"held-out team {eval_summary(summary['eval_warmup'])} after the warm-up")
        logger.log_eval("warmup", summary["eval_warmup"])
        hooks.on_eval("warmup", summary["eval_warmup"])
    if start == 0 and cfg.trainer.eval_size:  # a resume from the warm-up's checkpoint runs them again
        try:
            _start_evals(team, run_dir, summary, logger, abort)
        except StepAbandoned:
            return _stopped(summary, logger, control, -1 if "warmup" in summary else None,
                            "during the evaluations at the start")
    due = summary.pop("eval_due", None)  # a periodic evaluation a stop dropped: it comes first
    if due is not None and not _periodic_eval(team, summary, logger, hooks, due, abort):
        summary["eval_due"] = due
        return _stopped(summary, logger, control, due, f"during the evaluation after step {due}")
    end = cfg.trainer.steps if stop_after is None else min(cfg.trainer.steps, stop_after)
    overlap = cfg.trainer.max_staleness >= 1 and team.runtime.can_overlap
    upcoming: Rollout | None = None  # the next step's rollout when it ran during the updates
    initial_env = team.env.state_dict()  # where a run restarted before its first checkpoint begins again
    restarts = 0
    agent_policy = {name: agent.policy for name, agent in team.agents.items()}
    silence = Silence.from_records(agent_policy, logger.step_records())  # a resumed run's earlier steps count
    logger.start_progress(total=cfg.trainer.steps, initial=start)
    step = start
    while step < end:
        if control.should_stop:  # asked before this step started (e.g. by an evaluation callback)
            summary["stopped"] = {"reason": control.stop_reason, "after_step": step - 1 if step else None}
            break
        enter_step(step)
        release_freed_memory()  # the heap the last step or evaluation freed goes back to the system
        pause_point("step_start", step)
        start_env = upcoming.env_state if upcoming is not None else team.env.state_dict()  # what the step draws from
        credit_before = method.state.state_dict() if method.state is not None else None
        try:
            result = train_step(team, step, ready=upcoming, prefetch=overlap and step + 1 < end, abort=abort)
        except PolicyActorDied as e:  # without runtime.restart_actors the run stops; its last checkpoint is intact
            if not cfg.runtime.restart_actors or restarts >= cfg.runtime.max_restarts:
                raise
            restarts += 1
            step, upcoming = restart_actors(team, run_dir, logger, e, restarts, (start, initial_env)), None
            silence = Silence.from_records(agent_policy, logger.step_records())  # the dropped steps are counted again
            continue
        except StepAbandoned:  # no optimizer stepped: the weights are still the state before this step
            team.engine.take_faults()  # the dropped step's generations
            if method.state is not None:
                method.state.load_state_dict(credit_before)
            hooks.on_checkpoint(step - 1, save_checkpoint(run_dir, step - 1, team, summary, env_state=start_env))
            prune_checkpoints(run_dir, cfg.trainer.keep_last)
            return _stopped(summary, logger, control, step - 1, f"in step {step}, which was dropped; "
                            f"the checkpoint holds the state before it", close_progress=True)
        upcoming = result.upcoming
        store = step % cfg.logging.episodes_every == 0 or step == cfg.trainer.steps - 1
        unheard = silence.observe(result.metrics)  # agents that said nothing, policies that got no samples
        logger.log_step(result.metrics, result.groups, result.credit, cfg.trainer.sample_episodes, store_episodes=store,
                        note=silence.brief())
        for kind, message in [*result.warnings, *unheard]:  # the run goes on; the user sees what went wrong
            logger.warn(message, kind=kind, step=step)
        pause_point("after_log", step)
        hooks.on_step_end(step, result.metrics, result.groups, result.credit)
        if periodic_eval_due(cfg, step, end, control.should_stop and not control.abandon):  # held-out curve (trainer.eval_every)
            if control.abandon or not _periodic_eval(team, summary, logger, hooks, step, abort):
                if periodic_eval_due(cfg, step, end, False):  # a regular one: resume runs it first
                    summary["eval_due"] = step
        last = step == cfg.trainer.steps - 1
        periodic = cfg.trainer.save_every and (step + 1) % cfg.trainer.save_every == 0
        if last or step == end - 1 or periodic or control.should_stop:
            # a rollout taken ahead is not in the checkpoint: a resumed run draws its tasks again
            env_state = upcoming.env_state if upcoming is not None else None
            hooks.on_checkpoint(step, save_checkpoint(run_dir, step, team, summary, env_state=env_state))
            prune_checkpoints(run_dir, cfg.trainer.keep_last)
        if control.should_stop:
            summary["stopped"] = {"reason": control.stop_reason, "after_step": step}
            logger.info(f"stopped after step {step} ({control.stop_reason}); its checkpoint is written")
            break
        step += 1
    for line in silence.closing():
        logger.info(line)
    logger.close_progress()
    if end == cfg.trainer.steps and not control.should_stop and cfg.trainer.eval_size and cfg.trainer.eval_after:
        last_eval = summary.get("eval_last", {})
        if last_eval.get("step") == end - 1:  # the periodic evaluation after the last step is the same greedy run
            summary["eval_after"] = {k: v for k, v in last_eval.items() if k != "step"}
        else:
            try:
                summary["eval_after"] = evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed, abort, logger.show_progress,
                                                 "eval after training")
            except StepAbandoned:  # the last checkpoint is written: a resume evaluates again
                return _stopped(summary, logger, control, end - 1, "during the evaluation after training")
            check_regression(summary, summary["eval_after"], logger, end - 1)
        logger.info(f"held-out team {eval_summary(summary['eval_after'])} after training")
        logger.log_eval("after", summary["eval_after"])
        hooks.on_eval("after", summary["eval_after"])
        story = held_out_story(summary.get("eval_before"), summary.get("eval_warmup"), summary["eval_after"])
        if story is not None:  # before -> after warm-up -> after RL, RL's gain from where RL started
            summary["held_out"] = story
    logger.write_summary(summary)
    return summary


def _periodic_eval(team: Team, summary: dict, logger: RunLogger, hooks: CallbackList, step: int,
                   abort: Callable[[], bool]) -> bool:
    """The held-out evaluation after ``step`` (``trainer.eval_every``); False if a stop dropped it."""
    try:
        summary["eval_last"] = {"step": step, **evaluate(team, team.cfg.trainer.eval_size, team.cfg.trainer.seed, abort,
                                                          logger.show_progress, f"eval after step {step}")}
    except StepAbandoned:
        return False
    check_regression(summary, summary["eval_last"], logger, step)
    keep_if_best(team, summary, logger.run_dir, step, summary["eval_last"])
    logger.log_eval("periodic", summary["eval_last"])
    hooks.on_eval("periodic", summary["eval_last"])
    return True


def start_eval(summary: dict) -> dict | None:
    """The evaluation RL starts from: after the format warm-up where there was one, else before training."""
    return summary.get("eval_warmup") or summary.get("eval_before")


def _start_evals(team: Team, run_dir: Path, summary: dict, logger: RunLogger, abort: Callable[[], bool]) -> None:
    """At the start of RL: the evaluation's own noise floor (``trainer.eval_noise``: the start
    evaluated again with another seed) and the first best checkpoint (``trainer.keep_best``)."""
    cfg = team.cfg
    start = start_eval(summary)
    if start is None:  # eval_before: false and no warm-up evaluation: nothing to compare with
        return
    if cfg.trainer.eval_noise:
        summary["eval_noise"] = evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed + 1, abort, logger.show_progress,
                                         "eval noise floor")
        logger.log_eval("noise", summary["eval_noise"])
    keep_if_best(team, summary, run_dir, -1, start)


def check_regression(summary: dict, now: dict, logger: RunLogger, step: int) -> None:
    """The greedy-regression guard: an evaluation whose greedy accuracy is below the start's by
    more than the paired noise floor (``mas.training.evaluation.regression``) is recorded on the
    evaluation, in the summary and as a warning (the progress line, warnings.jsonl, the report)."""
    start = start_eval(summary)
    found = regression(start, now) if start else None
    if found is None:
        return
    now["regression"] = found
    summary["greedy_regression"] = {"step": step, **found}
    logger.warn(f"greedy held-out accuracy fell from {found['start']:.3f} at the start to {found['now']:.3f} after step "
                f"{step} ({100 * found['change']:+.1f} points; noise floor ±{100 * found['floor']:.1f} on these "
                f"{found['tasks']} tasks): RL is making the deployed (greedy) team worse; trainer.keep_best keeps the best "
                f"checkpoint, and docs/benchmarks/team_size.md ('Greedy regression') says what helps", kind="greedy_regression", step=step)


def keep_if_best(team: Team, summary: dict, run_dir: Path, step: int, result: dict) -> None:
    """``trainer.keep_best``: checkpoint as ``best`` when this evaluation's greedy accuracy beats
    every earlier one of the run (the start counts, at step -1: its weights, before any update)."""
    if not team.cfg.trainer.keep_best:
        return
    best = summary.get("best")
    if best is not None and result["accuracy"] <= best["accuracy"]:
        return
    summary["best"] = {"step": step, "accuracy": result["accuracy"]}
    save_checkpoint(run_dir, step, team, summary, name=BEST)


def _stopped(summary: dict, logger: RunLogger, control: RunControl, after_step: int | None, where: str,
             close_progress: bool = False) -> dict:
    """End a run that a stop cut short ``where``; ``after_step``: the step its last checkpoint holds
    (-1: the state before step 0; -2, ``WARMUP_STEP``: part-way through the warm-up; None: no checkpoint)."""
    if close_progress:
        logger.close_progress()
    summary["stopped"] = {"reason": control.stop_reason, "after_step": after_step}
    logger.info(f"stopped {where} ({control.stop_reason})")
    logger.write_summary(summary)
    return summary
