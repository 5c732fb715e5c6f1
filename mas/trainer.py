"""The training loop.  One step reads top to bottom:

    rollout -> score -> credit (plan -> execute -> assign) -> update (one learner per policy)
    -> sync -> log

Every step reseeds python, numpy and torch from (seed, step), so a resumed run repeats the
steps a straight run would have taken.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mas.callbacks import Callback, CallbackList, RunControl
from mas.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from mas.checks import config_warnings
from mas.config import _path
from mas.credit import build_credit_batch, get_credit, run_credit
from mas.credit.registry import followup_credit, plan_credit
from mas.embedded.fit import fit_checks
from mas.fault_points import pause_point
from mas.learner import TrainSample
from mas.metrics import RunLogger, credit_cost, divergence_warning, eval_metrics, eval_summary, step_metrics
from mas.rundir import check_fresh
from mas.team import Team, describe_team
from mas.types import Credit, CritiqueRequest, EpisodeGroup, InterventionRequest, ReplayRequest, flatten_turns


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919) % (2**31 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@dataclass
class StepResult:
    groups: list[EpisodeGroup]
    credit: Credit
    metrics: dict
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (kind, message) for the run's warnings.jsonl


def train_step(team: Team, step: int) -> StepResult:
    cfg = team.cfg
    seed = step_seed(cfg.trainer.seed, step)
    seed_everything(seed)
    timings: dict[str, float] = {}
    t_step = time.perf_counter()

    # 1. rollout + score: G joint episodes for each of B tasks; the engine scores each episode
    #    with env.score as it ends (replays and interventions are scored the same way)
    t0 = time.perf_counter()
    generated = GeneratedTokens(team.engine)
    tasks = team.env.sample_tasks(cfg.trainer.batch_size)
    groups = team.engine.rollout(tasks, cfg.trainer.group_size, seed=seed)
    generated.mark("rollout_tokens")
    timings["rollout"] = time.perf_counter() - t0
    pause_point("after_rollout", step)

    # 2. credit: extra evaluations if the method plans any (timed per kind), then one advantage per turn
    t0 = time.perf_counter()
    batch = build_credit_batch(groups, list(team.agents))
    requests = plan_credit(groups, cfg.credit)
    timings.update(dict.fromkeys(CREDIT_TIMERS, 0.0))
    results = execute_timed(team.engine, requests, seed + 1, timings) if requests else None
    more = followup_credit(groups, cfg.credit, results)  # e.g. a critic's format retries
    if more:
        results.update(execute_timed(team.engine, more, seed + 2, timings))
        requests += more
    cost = credit_cost(requests, results)
    generated.mark("credit_tokens")  # the method's own generations: replays, coalitions, removal runs, critic replies
    t1 = time.perf_counter()
    try:
        credit = run_credit(batch, cfg.credit, results)
    except FloatingPointError as e:  # name the step too (the method names the agents)
        raise FloatingPointError(f"step {step}: {e}") from e
    timings["credit_assign"] = time.perf_counter() - t1
    timings["credit"] = time.perf_counter() - t0

    # 3. update: each trainable policy learns from its own turns only (turns of episodes that
    #    failed for infrastructure reasons count in the credit statistics but are not trained on)
    t0 = time.perf_counter()
    samples: dict[str, list[TrainSample]] = {name: [] for name in active_learners(team, step)}
    keep = credit.train_mask.tolist() if credit.train_mask is not None else [True] * batch.num_turns
    for (ep, turn), adv, kept in zip(flatten_turns(groups), credit.advantages.tolist(), keep):
        if kept and turn.trainable and turn.completion_ids and turn.policy in samples and ep.status != "error":
            temperature = team.agents[turn.agent].sampling.temperature
            samples[turn.policy].append(TrainSample(turn.prompt_ids, turn.completion_ids, turn.logprobs, adv, temperature))
    updates = {}
    for name, learner in active_learners(team, step).items():
        try:
            updates[name] = learner.update(samples[name])
        except FloatingPointError as e:  # the learner names the policy; add the step
            raise FloatingPointError(f"step {step}: {e}") from e
    timings["update"] = time.perf_counter() - t0
    pause_point("after_update", step)

    # 4. sync: the rollout backend serves the new weights
    t0 = time.perf_counter()
    for name in updates:
        team.backend.sync_weights(name)
    timings["sync"] = time.perf_counter() - t0
    timings["step"] = time.perf_counter() - t_step

    faults, fault_messages = team.engine.take_faults()  # what went wrong in this step's rollouts, by kind
    metrics = step_metrics(step, groups, batch, credit, updates, timings, cost, generated.counts(), faults)
    warnings = [(f"fault.{kind}", f"step {step}: {faults[kind]} x {kind}, e.g. {message}") for kind, message in fault_messages.items()]
    diverged = divergence_warning(results)
    if diverged:
        warnings.append(("replay_divergence", diverged))
    return StepResult(groups, credit, metrics, warnings)


class GeneratedTokens:
    """Completion tokens the engine generated in each phase of a step (the compute a budget matches)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.last = engine.stats["generated_tokens"]
        self.phases: dict[str, int] = {}

    def mark(self, phase: str) -> None:
        """Attribute the tokens generated since the previous mark to ``phase``."""
        now = self.engine.stats["generated_tokens"]
        self.phases[phase] = self.phases.get(phase, 0) + now - self.last
        self.last = now

    def counts(self) -> dict[str, int]:
        return {**self.phases, "total": sum(self.phases.values())}


# extra evaluations by request kind -> the timer they count under
REQUEST_TIMERS = {ReplayRequest: "credit_replays", InterventionRequest: "credit_interventions", CritiqueRequest: "credit_critic"}
CREDIT_TIMERS = (*REQUEST_TIMERS.values(), "credit_assign")


def execute_timed(engine, requests: list, seed: int, timings: dict[str, float]) -> dict:
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
            results.update(engine.execute(batch, seed=seed))
            timings[timer] += time.perf_counter() - t0
    return results


def active_learners(team: Team, step: int) -> dict:
    """Learners that update at ``step``: all, or with ``trainer.alternate`` one policy at a time
    for ``switch_every`` steps while the others are frozen (as in CCPO's alternating schedule)."""
    order = team.cfg.trainer.alternate
    if not order:
        return team.learners
    name = order[(step // team.cfg.trainer.switch_every) % len(order)]
    return {name: team.learners[name]}


def evaluate(team: Team, size: int, seed: int) -> dict:
    episodes = team.engine.evaluate(team.env.eval_tasks(size), seed=seed)
    faults, _ = team.engine.take_faults()
    return {**eval_metrics(episodes, tool_agents=[a.name for a in team.cfg.agents if a.tools]), "faults": faults}


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

    ``callbacks`` are called after each step, evaluation and checkpoint (``mas.callbacks``).
    ``control`` carries the stop flag that callbacks and signal handlers set; when it is set
    the run stops at the next step boundary with a checkpoint of the last completed step, and
    the summary's ``stopped`` names the reason.
    """
    cfg = team.cfg
    control = control or RunControl()
    if not resume:
        check_fresh(run_dir)  # a new run never mixes its logs and checkpoints with an old one
    logger = RunLogger(run_dir, cfg, show_progress=cfg.logging.progress)
    hooks = CallbackList([*fit_checks(cfg, logger.warn), *callbacks], control)  # + a warning if the embedded model cannot parse the team
    logger.write_run_info(describe_team(team))
    if not resume:
        for path, value, message in config_warnings(cfg):
            logger.warn(f"{_path(path)}: {message} (found {value!r})", kind="config")
    start = 0
    summary: dict = {}
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"--resume {run_dir}: no complete checkpoint there (checkpoints/latest is missing)")
        state = load_checkpoint(ckpt, team)
        start = state["step"] + 1
        summary = state["summary"]
        summary.pop("stopped", None)
        logger.truncate_after(state["step"])
    else:
        method = get_credit(cfg.credit.method)
        if method.state is not None:  # a fresh run starts without history from earlier runs
            method.state.reset()
    if not resume and cfg.trainer.eval_size and cfg.trainer.eval_before:
        summary["eval_before"] = evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed)
        logger.info(f"held-out team {eval_summary(summary['eval_before'])} before training")
        logger.log_eval("before", summary["eval_before"])
        hooks.on_eval("before", summary["eval_before"])
    end = cfg.trainer.steps if stop_after is None else min(cfg.trainer.steps, stop_after)
    logger.start_progress(total=cfg.trainer.steps, initial=start)
    for step in range(start, end):
        if control.should_stop:  # asked before this step started (e.g. by an evaluation callback)
            summary["stopped"] = {"reason": control.stop_reason, "after_step": step - 1 if step else None}
            break
        pause_point("step_start", step)
        result = train_step(team, step)
        store = step % cfg.logging.episodes_every == 0 or step == cfg.trainer.steps - 1
        logger.log_step(result.metrics, result.groups, result.credit, cfg.trainer.sample_episodes, store_episodes=store)
        for kind, message in result.warnings:  # the run goes on; the user sees what went wrong
            logger.warn(message, kind=kind, step=step)
        pause_point("after_log", step)
        hooks.on_step_end(step, result.metrics, result.groups, result.credit)
        if periodic_eval_due(cfg, step, end, control.should_stop):  # held-out curve (trainer.eval_every)
            summary["eval_last"] = {"step": step, **evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed)}
            logger.log_eval("periodic", summary["eval_last"])
            hooks.on_eval("periodic", summary["eval_last"])
        last = step == cfg.trainer.steps - 1
        periodic = cfg.trainer.save_every and (step + 1) % cfg.trainer.save_every == 0
        if last or step == end - 1 or periodic or control.should_stop:
            hooks.on_checkpoint(step, save_checkpoint(run_dir, step, team, summary))
            prune_checkpoints(run_dir, cfg.trainer.keep_last)
        if control.should_stop:
            summary["stopped"] = {"reason": control.stop_reason, "after_step": step}
            logger.info(f"stopped after step {step} ({control.stop_reason}); its checkpoint is written")
            break
    logger.close_progress()
    if end == cfg.trainer.steps and not control.should_stop and cfg.trainer.eval_size and cfg.trainer.eval_after:
        last_eval = summary.get("eval_last", {})
        if last_eval.get("step") == end - 1:  # the periodic evaluation after the last step is the same greedy run
            summary["eval_after"] = {k: v for k, v in last_eval.items() if k != "step"}
        else:
            summary["eval_after"] = evaluate(team, cfg.trainer.eval_size, cfg.trainer.seed)
        logger.info(f"held-out team {eval_summary(summary['eval_after'])} after training")
        logger.log_eval("after", summary["eval_after"])
        hooks.on_eval("after", summary["eval_after"])
    logger.write_summary(summary)
    return summary
