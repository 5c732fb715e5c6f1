"""Run a study's grid: one ordinary run directory per (credit method, seed), resumable.

    OUT/study_spec.json                what was asked (config, methods, seeds, budget, overrides)
    OUT/not_applicable.json            methods asked for that do not apply to this team, and why
    OUT/runs/<method>/seed_<s>/        an ordinary run directory (``mas report`` works on it)
        study_run.json                 written when the run is finished: why it ended, what it used

A study over team sizes (several configs, e.g. ``team_relay_n2.yaml team_relay_n4.yaml
team_relay_n8.yaml``) is one such study per config, each in its own directory named by the
team's size N, plus what was asked for the whole:

    OUT/scaling_spec.json              the configs, their sizes and directories, and the shared arguments
    OUT/n<N>/                          the study of the config of size N (the layout above)

N is the number of parts the env splits each task into where it does (team_relay's
``env.size``, team_conjunctive's 2: one specialist per part), else the number of agents of
the team.  Two configs of the same size are refused (their directories would collide).

Re-running the same command continues where it stopped: a finished run (``study_run.json``)
is skipped, a run with a checkpoint resumes from it (``mas train --resume`` semantics: same
data order and RNG), and a run that never reached a checkpoint starts again.

Budgets (``--budget KIND N``), so that methods are compared at equal cost:

    steps    every run trains N steps (``trainer.steps = N``)
    tokens   every run stops after the step at which its generated tokens reach N, counting
             the credit method's own generations (replays, coalition re-runs, removal runs,
             critic replies) with the rollouts: a method that generates 3x per step gets a
             third of the steps.  ``trainer.steps`` is the cap.
    seconds  every run stops after the step at which its training wall time (the sum of its
             step times; evaluations excluded) reaches N.  ``trainer.steps`` is the cap.

A budget stop is the trainer's ordinary early stop (``mas.training.callbacks``): the last completed
step is checkpointed and held-out accuracy is measured there (``trainer.eval_every``).

Executors: ``local`` runs the grid one run after another in this process; ``ray`` sends
every run to a Ray cluster as a task (``ray.init(address=...)``, or a local Ray instance),
so runs go in parallel up to the cluster's CPUs.

Credit blocks: a method's run uses the config's own ``credit`` section when it names that
method, else ``{method: <name>}`` with the method's defaults, plus what ``--credit-set
METHOD.key=value`` gives.  Some defaults follow the team: C3's ``fanout`` is
``[trainer.group_size, 4]`` (the G rollouts are its roots, 4 siblings per later decision as in
the paper's (2, 4)), and M-GRPO's ``main_agent`` is the orchestrator of an orchestrator team.
A team of specialists (a chain with ``topology.parts``) has no answering agent and N decisions
in a row: SHARP's players are all of them (``exclude: []``; its default leaves out whoever
speaks last), and C3's tree covers every specialist with one context-matched alternative each,
``fanout [G, 2, ..., 2]`` of length N (the paper's 4 siblings at every later depth would
re-sample 3·N(N-1)/2 turns per episode, 84 at N = 8, against N rollout turns).

Methods that do not apply to a team are left out of its grid and said, with why
(``not_applicable``): CCPO's counterfactual removes the upstream agent of a two-agent dyad;
M-GRPO needs a main agent; the LLM critic needs a critic model.

What every run measures (``mas.training.evaluation``): greedy held-out accuracy (what the study
ranks by, unless ``metric`` is ``sampled``), the sampled avg@k and pass@k where the team trains
by sampling, and the same on a fixed set of training tasks (``trainer.eval_train``, set for every
run); the baseline's runs also evaluate their start twice (``trainer.eval_noise``), the noise floor.

Held-out evaluation: the config's ``trainer.eval_every`` if it sets one, else every 2 steps
(the resolution of "steps to reach the baseline's final accuracy") where that costs at most as
many episodes as the training itself (``eval_size <= 2 * batch_size * group_size``), else about
five evaluations per run, with a hint to ask for ``--eval-every 2``.  ``--eval-every`` wins.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

try:
    import fcntl  # POSIX; where it is missing, runs are not locked
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from mas.config.checks import meaning_errors
from mas.config.loading import apply_overrides, read_config_data, validate_config
from mas.config.messages import ConfigError
from mas.runtime.ray_cluster import FORWARDED_ENV, start_local_ray
from mas.topologies import kind_of
from mas.training.callbacks import RunControl

BudgetKind = Literal["steps", "tokens", "seconds"]
BUDGET_KINDS: tuple[str, ...] = ("steps", "tokens", "seconds")
SPEC_FILE = "study_spec.json"
DONE_FILE = "study_run.json"
NA_FILE = "not_applicable.json"
SCALING_SPEC_FILE = "scaling_spec.json"
PROGRESS_POLL_S = 2.0  # how often the Ray study's bar reads the runs' step counts


@dataclass(frozen=True)
class StudySpec:
    """What a study runs; saved as ``study_spec.json`` so a re-run can check it is the same study."""

    config: str  # path of the team YAML
    methods: tuple[str, ...]
    seeds: int  # seeds 0..seeds-1, added to the config's trainer.seed
    out: str
    budget_kind: BudgetKind = "steps"
    budget: float | None = None  # None with steps: the config's trainer.steps
    overrides: tuple[str, ...] = ()  # key.sub=value for every run
    credit_sets: tuple[str, ...] = ()  # METHOD.key=value for one method's credit block
    eval_every: int | None = None  # None: about five held-out evaluations per run
    baseline: str | None = None  # None: grpo if in methods, else the first method
    metric: str = "greedy"  # what the study ranks by: greedy held-out accuracy, or sampled (avg@k)

    @property
    def baseline_method(self) -> str:
        return self.baseline or ("grpo" if "grpo" in self.methods else self.methods[0])


@dataclass
class Job:
    """One (method, seed) run of a study: its resolved config and where it lives."""

    method: str
    seed: int
    run_dir: str
    config: dict[str, Any]  # the validated config, as a plain dict
    budget_kind: BudgetKind
    budget: float
    state: str = "new"  # new | resume | done (what run_job will do)

    @property
    def name(self) -> str:
        return f"{self.method}/seed_{self.seed}"


# --- building the grid -----------------------------------------------------------------------


def is_parts_team(topology: Any) -> bool:
    """A team of specialists, one per part of the task (a chain with ``topology.parts``: its kind says)."""
    return kind_of(topology).parts(topology) is not None


def team_size(cfg: Any) -> int:
    """N of a team (module docstring): the env's parts per task where it splits tasks, else the agents."""
    parts = getattr(cfg.env, "num_parts", None)  # only envs that split tasks into parts declare it
    return int(parts) if parts else len(cfg.agents)


def _credit_block(data: dict, method: str, sets: tuple[str, ...], cfg: Any) -> dict:
    """The credit section of ``method``'s run (module docstring); ``cfg``: the team's validated config."""
    base = data.get("credit") if isinstance(data.get("credit"), dict) else {}
    block = dict(base) if base.get("method") == method else {"method": method}
    parts = is_parts_team(cfg.topology)
    if method == "c3" and "fanout" not in block:
        later = [2] * (len(kind_of(cfg.topology).parts(cfg.topology)) - 1) if parts else [4]
        block["fanout"] = [cfg.trainer.group_size, *later]
    if method == "sharp" and "exclude" not in block and parts:
        block["exclude"] = []
    main = kind_of(cfg.topology).main_agent(cfg.topology)
    if method == "m_grpo" and "main_agent" not in block and main is not None:
        block["main_agent"] = main
    for item in sets:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError("--credit-set", [f"{item!r}: expected METHOD.key=value (e.g. c3.fanout=[8,2])"])
        key, value = item.split("=", 1)
        target, sub = key.split(".", 1)
        if target == method:
            block = apply_overrides({"credit": block}, [f"credit.{sub}={value}"])["credit"]
    return block


def _team_data(spec: StudySpec) -> dict:
    """The study's config file with its overrides, as data."""
    return apply_overrides(read_config_data(spec.config), list(spec.overrides))


def team_config(spec: StudySpec) -> Any:
    """The study's team as configured (its own credit section), validated."""
    return validate_config(_team_data(spec), spec.config)


def default_eval_every(trainer: Any) -> int:
    """trainer.eval_every of a study run when neither the config nor --eval-every sets one: 2
    where evaluating every 2 steps costs at most as many episodes as the training (module
    docstring), else about five evaluations per run."""
    if trainer.eval_size <= 2 * trainer.batch_size * trainer.group_size:
        return 2
    return max(1, math.ceil(trainer.steps / 5))


def eval_hint(spec: StudySpec) -> str | None:
    """A line for the terminal when the runs evaluate less often than every 2 steps by default."""
    cfg = team_config(spec)
    if spec.eval_every or cfg.trainer.eval_every:
        return None
    trainer = cfg.trainer.model_copy(update={"steps": int(spec.budget)}) if spec.budget_kind == "steps" and spec.budget else cfg.trainer
    every = default_eval_every(trainer)
    if every <= 2:
        return None
    return (f"{spec.config}: held-out evaluation every {every} steps (eval_size {trainer.eval_size} is more than twice the "
            f"{trainer.batch_size * trainer.group_size} episodes of a training step), so steps-to-target is resolved to "
            f"{every} steps; add --eval-every 2 for a finer curve at the cost of more evaluation")


def not_applicable(method: str, cfg: Any) -> str | None:
    """Why ``method`` does not apply to the team ``cfg`` (its validated config), or None."""
    parts = is_parts_team(cfg.topology)
    if method == "ccpo" and (parts or len(cfg.agents) != 2):
        why = ("CCPO's counterfactual removes the upstream agent of a two-agent dyad (a thinker, then a solver who can "
               "answer alone) and re-runs the rest (credit/ccpo.py)")
        if parts:
            return (f"{why}; in a team of specialists a removed specialist leaves its part unanswered, so every "
                    "counterfactual scores 0 and tells the credit nothing")
        return f"{why}; this team has {len(cfg.agents)} agents, and only the first would get counterfactual credit"
    if (method == "m_grpo" and kind_of(cfg.topology).main_agent(cfg.topology) is None
            and getattr(cfg.credit, "main_agent", None) is None):
        return (f"M-GRPO is hierarchical: a main agent (planner, orchestrator) and the sub-agents it calls "
                f"(credit/mgrpo.py); this {cfg.topology.kind} team has none (name one with --credit-set m_grpo.main_agent=...)")
    if method == "critic" and getattr(cfg.credit, "critic", None) is None:
        return "the LLM critic needs a critic model (credit.critic: a policy of the team); this config names none"
    return None


def not_applicable_methods(spec: StudySpec) -> dict[str, str]:
    """The methods of ``spec`` that do not apply to its team, with why."""
    cfg = team_config(spec)
    return {m: why for m in spec.methods if (why := not_applicable(m, cfg)) is not None}


def job_config(spec: StudySpec, method: str, seed: int) -> dict:
    """The validated config (as a dict) of one run; a ConfigError names the method and seed."""
    data = _team_data(spec)
    team = validate_config(data, spec.config)
    data["credit"] = _credit_block(data, method, spec.credit_sets, team)
    trainer = data.setdefault("trainer", {})
    trainer["seed"] = team.trainer.seed + seed
    if spec.budget_kind == "steps" and spec.budget is not None:
        trainer["steps"] = int(spec.budget)
    steps = int(trainer.get("steps", team.trainer.steps))
    trainer["eval_every"] = (spec.eval_every or team.trainer.eval_every
                             or default_eval_every(team.trainer.model_copy(update={"steps": steps})))
    trainer["eval_train"] = True  # the training-vs-held-out gap, under the same decodings
    trainer["eval_noise"] = method == spec.baseline_method  # the noise floor: the baseline's start, evaluated twice
    data.setdefault("logging", {})["progress"] = False  # one line per run instead of interleaved bars
    cfg = validate_config(data, f"{spec.config} [{method}, seed {seed}]", check=meaning_errors)
    if not cfg.trainer.eval_size:
        raise ConfigError(spec.config, ["trainer.eval_size: a study measures held-out accuracy during training; set it > 0 (found 0)"])
    return cfg.model_dump(mode="json", by_alias=True)


def plan_jobs(spec: StudySpec) -> list[Job]:
    """Every (method, seed) run with its state, for the methods that apply to the team
    (``not_applicable_methods`` are left out); every config is validated before anything runs."""
    unknown_sets = sorted({s.split(".", 1)[0] for s in spec.credit_sets} - set(spec.methods))
    if unknown_sets:
        raise ConfigError("--credit-set", [f"names methods not in --methods: {unknown_sets}; methods: {list(spec.methods)}"])
    skipped = not_applicable_methods(spec)
    jobs = []
    for method in spec.methods:
        if method in skipped:  # said by the caller (run_study logs it and keeps it in not_applicable.json)
            continue
        for seed in range(spec.seeds):
            cfg = job_config(spec, method, seed)
            budget = spec.budget if spec.budget is not None else cfg["trainer"]["steps"]
            run_dir = Path(spec.out) / "runs" / method / f"seed_{seed}"
            jobs.append(Job(method, seed, str(run_dir), cfg, spec.budget_kind, float(budget), run_state(run_dir)))
    return jobs


def run_state(run_dir: Path) -> str:
    """done (finished), resume (has a checkpoint) or new."""
    if (run_dir / DONE_FILE).exists():
        return "done"
    if (run_dir / "checkpoints" / "latest").exists():
        return "resume"
    return "new"


# --- the budget ---------------------------------------------------------------------------------


def step_usage(record: dict) -> dict[str, float]:
    """What one metrics.jsonl step record spent: steps, generated tokens, seconds."""
    return {
        "steps": 1.0,
        "tokens": float((record.get("generated") or {}).get("total", 0)),
        "seconds": float((record.get("time") or {}).get("step", 0.0)),
    }


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file; a line a crash left half-written is skipped."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


class BudgetStop:
    """Callback that asks the run to stop once its usage of ``kind`` reaches ``limit``."""

    def __init__(self, kind: BudgetKind, limit: float, used: float = 0.0):
        if kind not in BUDGET_KINDS:
            raise ValueError(f"unknown budget {kind!r}; valid: {list(BUDGET_KINDS)}")
        self.kind, self.limit, self.used = kind, float(limit), float(used)

    @classmethod
    def resuming(cls, kind: BudgetKind, limit: float, run_dir: Path) -> "BudgetStop":
        """The budget of a run resumed from its latest checkpoint: usage of the steps it keeps."""
        from mas.training.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(run_dir)
        last = json.loads((ckpt / "trainer_state.json").read_text())["step"] if ckpt else -1
        rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval" not in r and "step" in r and r["step"] <= last]
        return cls(kind, limit, sum(step_usage(r)[kind] for r in rows))

    @property
    def reached(self) -> bool:
        return self.used >= self.limit

    def on_step_end(self, step: int, metrics: dict, groups: list, credit: Any) -> bool:
        """Count the step; ask to stop once the budget is reached (a steps budget is the
        trainer's own trainer.steps, which ends the run normally, so it only counts)."""
        self.used += step_usage(metrics)[self.kind]
        return self.reached and self.kind != "steps"


# --- running one job ------------------------------------------------------------------------------


def run_job(job: Job | dict, control: StudyStop | None = None, progress: bool = False) -> dict:
    """Train (or resume, or skip) one run; returns its ``study_run.json`` record.

    Importable by Ray workers: takes and returns plain data.  ``control``: the study's stop flag
    (``mas study`` sets it at Ctrl-C): the run stops as ``mas train`` does, at its step's next
    safe point with a checkpoint, and is left unfinished (``interrupted`` in the record) so that
    the next ``mas study`` resumes it.  ``progress``: the run's own bars (its warm-up, its steps)
    on stderr, for runs made one at a time.
    """
    if isinstance(job, dict):
        job = Job(**job)
    run_dir = Path(job.run_dir)
    with run_lock(run_dir) as held:
        if not held:
            return {"method": job.method, "seed": job.seed, "run_dir": str(run_dir), "busy": True}
        return _train_run(job, run_dir, control, progress)


class StudyStop:
    """The stop flag of a study (``mas study`` hands it to its Ctrl-C/SIGTERM handler): a request
    goes on to the run in progress, whose own ``RunControl`` abandons its step at the next safe
    point and checkpoints, and no further run starts.  Each run has its own ``RunControl``, so a
    run's budget stop ends that run only."""

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.current: RunControl | None = None  # the run in progress

    def request_stop(self, reason: str, abandon: bool = True) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.current is not None:
            self.current.request_stop(reason, abandon=True)

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def run_control(self) -> RunControl:
        """A new run's own control, already stopped if the study was asked to stop."""
        self.current = RunControl()
        if self.stop_reason is not None:
            self.current.request_stop(self.stop_reason, abandon=True)
        return self.current


@contextmanager
def run_lock(run_dir: Path):
    """Yields whether this process holds ``run_dir``'s lock (a file beside it, held while the run
    trains).  A second ``mas study`` on the same directory then leaves a run that another one is
    training alone, instead of taking its unfinished directory for an abandoned start and
    deleting it."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield True
        return
    with open(run_dir.parent / f".{run_dir.name}.lock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _train_run(job: Job, run_dir: Path, control: StudyStop | None = None, progress: bool = False) -> dict:
    """Train, resume or skip the run in ``run_dir`` (its lock held); its ``study_run.json`` record."""
    from mas.training.team import build_team
    from mas.training.trainer import train

    state = run_state(run_dir)
    if state == "done":
        return json.loads((run_dir / DONE_FILE).read_text())
    if state == "new" and run_dir.exists():  # started before but never reached a checkpoint: start again
        shutil.rmtree(run_dir)
    data = copy.deepcopy(job.config)
    data.setdefault("logging", {})["progress"] = progress  # recorded as false (job_config): runs side by side do not show bars
    cfg = validate_config(data, f"{job.name}")
    resume = state == "resume"
    budget = BudgetStop.resuming(job.budget_kind, job.budget, run_dir) if resume else BudgetStop(job.budget_kind, job.budget)
    t0 = time.time()
    run_control = control.run_control() if control is not None else RunControl()
    if not budget.reached:
        with build_team(cfg) as team:  # closing frees a Ray runtime's actors at once
            summary = train(team, run_dir, resume=resume, callbacks=[budget], control=run_control)
        del team
        gc.collect()
    else:  # the budget was spent at the last checkpoint (a crash before this file was written)
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    record = {
        "method": job.method,
        "seed": job.seed,
        "run_dir": str(run_dir),
        "budget": {"kind": job.budget_kind, "limit": job.budget, "used": budget.used, "reached": budget.reached},
        "stopped": summary.get("stopped"),
        "wall_s_this_call": round(time.time() - t0, 3),
    }
    if run_control.abandon:  # a signal, not the budget: the run is not done
        return {**record, "interrupted": True}
    (run_dir / DONE_FILE).write_text(json.dumps(record, indent=2))
    return record


# --- the grid ---------------------------------------------------------------------------------------


@dataclass
class StudyRun:
    """Outcome of ``run_study``: the jobs and their records."""

    spec: StudySpec
    jobs: list[Job]
    records: list[dict] = field(default_factory=list)


def spec_defaults() -> dict[str, Any]:
    """StudySpec's defaults as JSON: what a key that an older study did not record stands for, so
    a study started before the key existed still continues."""
    return json.loads(json.dumps({f.name: f.default for f in fields(StudySpec) if f.default is not MISSING}))


def check_spec(spec: StudySpec) -> None:
    """A re-run into a study directory must be the same study (same grid and budget)."""
    path = Path(spec.out) / SPEC_FILE
    if not path.exists():
        return
    old = json.loads(path.read_text())
    new = json.loads(json.dumps(asdict(spec)))
    defaults = spec_defaults()
    differ = sorted(k for k in new if k not in ("out",) and old.get(k, defaults.get(k)) != new[k])
    if differ:
        raise ConfigError(str(path), [f"{k}: this study directory was started with {old.get(k)!r}, now {new[k]!r}; "
                                      "use another --out (or the same arguments to continue it)" for k in differ])


def _check_budget(spec: StudySpec) -> None:
    if spec.budget_kind not in BUDGET_KINDS:
        raise ConfigError("--budget", [f"unknown budget {spec.budget_kind!r}; valid: {list(BUDGET_KINDS)}"])
    if spec.budget is not None and not (spec.budget > 0 and math.isfinite(spec.budget)):
        raise ConfigError("--budget", [f"the budget must be a positive number (found {spec.budget})"])


def _plan(spec: StudySpec) -> tuple[list[Job], dict[str, str]]:
    """Every check of a study, nothing written: its jobs and the methods that do not apply."""
    _check_budget(spec)
    if (Path(spec.out) / SCALING_SPEC_FILE).exists():
        raise ConfigError(spec.out, ["holds a study over team sizes (scaling_spec.json): give all its configs again to "
                                     "continue it, or use another --out"])
    check_spec(spec)
    return plan_jobs(spec), not_applicable_methods(spec)


def _record(spec: StudySpec, jobs: list[Job], skipped: dict[str, str], log) -> None:
    """Write what was asked (and what does not apply) to the study's directory, and say so."""
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / SPEC_FILE).write_text(json.dumps(asdict(spec), indent=2))
    (out / NA_FILE).write_text(json.dumps(skipped, indent=2))
    counts = {s: sum(j.state == s for j in jobs) for s in ("done", "resume", "new")}
    budget = f"{jobs[0].budget:g}" if jobs else "-"
    log(f"study: {len(spec.methods) - len(skipped)} methods x {spec.seeds} seeds = {len(jobs)} runs in {out} "
        f"(budget {spec.budget_kind} {budget}); {counts['done']} done, {counts['resume']} to resume, {counts['new']} to start")
    for method, why in skipped.items():
        log(f"study: {method} does not apply to {spec.config}, left out: {why}")
    hint = eval_hint(spec)
    if hint:
        log(f"hint: {hint}")


def prepare_study(spec: StudySpec, log=print) -> list[Job]:
    """Check and plan a study, write what was asked (and what does not apply) to its directory,
    and say so; returns its jobs (none run yet)."""
    jobs, skipped = _plan(spec)
    _record(spec, jobs, skipped, log)
    return jobs


def run_jobs(jobs: list[Job], executor: Literal["local", "ray"] = "local", ray_address: str | None = None,
             cpus_per_run: float = 1.0, log=print, control: StudyStop | None = None, progress: bool = True) -> list[dict]:
    """Run every unfinished job (locally one by one, or all at once as Ray tasks); their records.
    Locally, a stop requested on ``control`` (Ctrl-C in ``mas study``) checkpoints the run in
    progress and starts no other: the same command continues the study from there.  ``progress``:
    locally each run's own bars after its ``[i/n]`` line; with Ray one bar of the steps every run
    has written (read from their metrics.jsonl)."""
    todo = [j for j in jobs if j.state != "done"]
    if executor == "ray" and todo:
        return _run_ray(todo, ray_address, cpus_per_run, log, progress)
    records = []
    for i, job in enumerate(todo):
        if control is not None and control.should_stop:
            break
        log(f"[{i + 1}/{len(todo)}] {job.name}: {'resuming' if job.state == 'resume' else 'training'} ({job.run_dir})")
        records.append(run_job(job, control, progress))
        if records[-1].get("busy"):
            log(f"[{i + 1}/{len(todo)}] {busy_note(job)}")
        if records[-1].get("interrupted"):
            log(f"[{i + 1}/{len(todo)}] {job.name}: stopped with a checkpoint; run the same command again to resume it")
    if control is not None and control.should_stop:
        left = len(todo) - sum(1 for r in records if not r.get("interrupted") and not r.get("busy"))
        log(f"study stopped ({control.stop_reason}): {left} of {len(todo)} runs left; run the same command again to continue")
    return records


def busy_note(job: Job) -> str:
    """What the log says of a run another process holds (``run_job``'s busy record)."""
    return f"{job.name}: another process is training it; left to that one (run this command again once it is done to include it)"


def run_study(spec: StudySpec, executor: Literal["local", "ray"] = "local", ray_address: str | None = None,
              cpus_per_run: float = 1.0, log=print, control: StudyStop | None = None) -> StudyRun:
    """Plan, then run every unfinished job of the grid (locally one by one, or as Ray tasks)."""
    jobs = prepare_study(spec, log)
    return StudyRun(spec, jobs, run_jobs(jobs, executor, ray_address, cpus_per_run, log, control))


# --- a study over team sizes ---------------------------------------------------------------------


def size_specs(spec: StudySpec, configs: list[str] | tuple[str, ...]) -> list[tuple[int, StudySpec]]:
    """One study per config, in ``OUT/n<N>/`` with the same arguments, smallest team first."""
    sizes: dict[int, StudySpec] = {}
    for config in configs:
        one = replace(spec, config=str(config))
        n = team_size(team_config(one))
        if n in sizes:
            raise ConfigError(str(config), [f"a team of size N = {n} again (also {sizes[n].config}): a study over team "
                                            "sizes takes one config per size"])
        sizes[n] = replace(one, out=str(Path(spec.out) / f"n{n}"))
    return sorted(sizes.items())


def scaling_record(spec: StudySpec, sizes: list[tuple[int, StudySpec]]) -> dict:
    """``scaling_spec.json``: the shared arguments, and each size's config and directory."""
    shared = {k: v for k, v in json.loads(json.dumps(asdict(spec))).items() if k not in ("config", "out")}
    return {**shared, "configs": [s.config for _, s in sizes],
            "sizes": [{"n": n, "config": s.config, "dir": Path(s.out).name} for n, s in sizes]}


def run_sizes(spec: StudySpec, configs: list[str] | tuple[str, ...], executor: Literal["local", "ray"] = "local",
              ray_address: str | None = None, cpus_per_run: float = 1.0, log=print,
              control: StudyStop | None = None) -> list[StudyRun]:
    """A study over team sizes (module docstring): every size's study is checked and planned
    before any run starts, then all their runs go together (one after another, or as Ray tasks)."""
    _check_budget(spec)
    out = Path(spec.out)
    if (out / SPEC_FILE).exists():
        raise ConfigError(str(out), ["holds a one-config study (study_spec.json): use another --out for a study over team sizes"])
    sizes = size_specs(spec, configs)
    record = scaling_record(spec, sizes)
    path = out / SCALING_SPEC_FILE
    if path.exists():
        old = json.loads(path.read_text())
        defaults = spec_defaults()
        differ = sorted(k for k in record if old.get(k, defaults.get(k)) != record[k])
        if differ:
            raise ConfigError(str(path), [f"{k}: this study directory was started with {old.get(k)!r}, now {record[k]!r}; "
                                          "use another --out (or the same arguments to continue it)" for k in differ])
    plans = [(n, one, *_plan(one)) for n, one in sizes]  # every size checked before anything is written
    planned = []
    for n, one, jobs, skipped in plans:
        log(f"team size N = {n}: {one.config}")
        _record(one, jobs, skipped, log)
        planned.append((one, jobs))
    path.write_text(json.dumps(record, indent=2))
    records = run_jobs([j for _, jobs in planned for j in jobs], executor, ray_address, cpus_per_run, log, control)
    by_dir = {str(Path(one.out)): StudyRun(one, jobs) for one, jobs in planned}
    for rec in records:
        by_dir[str(Path(rec["run_dir"]).parents[2])].records.append(rec)
    return list(by_dir.values())


def steps_written(jobs: list[Job]) -> int:
    """The step records the jobs' runs have written so far (their metrics.jsonl)."""
    return sum(sum(r.get("kind") == "step" for r in read_jsonl(Path(j.run_dir) / "metrics.jsonl")) for j in jobs)


def _run_ray(jobs: list[Job], address: str | None, cpus_per_run: float, log, progress: bool = False) -> list[dict]:
    """Every job as one Ray task; a local Ray instance when ``address`` is None and none is running."""
    import os

    try:
        import ray
    except ImportError:
        raise ConfigError("--executor", ["ray is not installed: pip install 'mas-rl[ray]' (or use --executor local)"]) from None
    started = False
    if not ray.is_initialized():
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}  # what a run's own Ray workers get
        kwargs = dict(include_dashboard=False, runtime_env={"env_vars": env} if env else None, log_to_driver=False)
        if address is None:
            start_local_ray(ray, **kwargs)  # its ports picked free: another run's Ray may be up
        else:
            ray.init(address=address, **kwargs)
        started = True
    try:
        task = ray.remote(num_cpus=cpus_per_run)(run_job)
        refs = {task.remote(asdict(j)): j for j in jobs}
        log(f"ray: {len(refs)} runs submitted ({cpus_per_run:g} CPU each; {ray.cluster_resources().get('CPU', 0):g} CPUs in the cluster)")
        records = []
        pending = list(refs)
        total = sum(int(j.config["trainer"]["steps"]) for j in jobs)
        bar = tqdm(total=total, initial=min(total, steps_written(jobs)), desc="study steps", unit="step",
                   file=sys.stderr, dynamic_ncols=True, disable=not progress)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=PROGRESS_POLL_S if progress else None)
                if progress:
                    bar.update(min(total, steps_written(jobs)) - bar.n)
                if not ready:
                    continue
                record = ray.get(ready[0])
                bar.clear()  # the line below, then the bar again under it
                if record.get("busy"):
                    log(busy_note(refs[ready[0]]))
                else:
                    log(f"done: {refs[ready[0]].name} ({record['budget']['kind']} used {record['budget']['used']:g})")
                bar.refresh()
                records.append(record)
        finally:
            bar.close()
        return records
    finally:
        if started:
            ray.shutdown()
