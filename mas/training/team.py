"""Build every runtime component of a run from its validated config.

Builders take the few values they need; only this module reads the whole RunConfig.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mas.agents.agent import Agent, build_agents
from mas.rollout.backends.base import Backend
from mas.config.checks import check_config, eval_size_issues, package_issues
from mas.config.messages import issue_lines
from mas.config.schema import ConfigError, RunConfig, RuntimeConfig
from mas.config.defaults import resolve_default_lrs
from mas.embedded.build import ensure_embedded
from mas.process.memory import keep_large_blocks_off_the_heap
from mas.rollout.engine import Engine
from mas.envs import build_env
from mas.envs.verifiers import resolve_verifier
from mas.envs.base import Env
from mas.runtime import Runtime, build_runtime
from mas.topologies import build_topology


@dataclass
class Team:
    """A run's parts.  ``runtime`` holds the policies, their rollout backend and learners (in this
    process, or in Ray actors); use the team as a context manager, or call ``close()``, so a Ray
    runtime's actors and Ray instance are freed."""

    cfg: RunConfig
    agents: dict[str, Agent]
    engine: Engine
    env: Env
    runtime: Runtime
    defaults: dict[str, str] = field(default_factory=dict)  # YAML path -> the value build_team chose, and why

    @property
    def backend(self) -> Backend:
        return self.engine.backend

    @backend.setter
    def backend(self, backend: Backend) -> None:  # e.g. a test routing some policies elsewhere
        self.engine.backend = backend

    @property
    def learners(self) -> dict[str, Any]:
        """One per trainable policy that some agent uses."""
        return self.runtime.learners

    @property
    def policies(self) -> dict:
        """The ``PolicyHandle``s by name (local runtime only: under Ray the weights live in actors)."""
        handles = getattr(self.runtime, "policies", None)
        if handles is None:
            raise AttributeError(f"runtime.kind {self.cfg.runtime.kind!r}: the policies live in Ray actors, not in this process; "
                                 "use team.runtime (describe, save_policies, load_policies)")
        return handles

    def close(self) -> None:
        """Stop the engine's tool workers and free the runtime (Ray: its actors and Ray instance)."""
        try:
            self.engine.close()
        finally:
            self.runtime.close()

    def __enter__(self) -> "Team":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def apply_runtime(runtime: RuntimeConfig) -> None:
    """Process-wide settings: torch threads, deterministic algorithms, and large blocks off the heap
    (``keep_large_blocks_off_the_heap``: a learner's passes would otherwise leave it fragmented)."""
    import torch
    from transformers.utils import logging as hf_logging

    keep_large_blocks_off_the_heap()
    hf_logging.disable_progress_bar()  # the training progress bar is the one that matters
    if runtime.num_threads:
        torch.set_num_threads(runtime.num_threads)
    if runtime.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def check_eval_size(env: Env, size: int, where: str) -> None:
    """A held-out size larger than the env's held-out split is a config error (named by ``where``)."""
    issues = eval_size_issues(env, size, where)
    if issues:
        raise ConfigError("config", [f"{where}: {message}" for _, _, message in issues])


def build_team(cfg: RunConfig, eval_size: tuple[int, str] | None = None, run_dir: Path | None = None) -> Team:
    """Everything a run needs.  ``eval_size``: (size, where it was set) of the held-out evaluation
    to check against the env before any model loads; default trainer.eval_size.  ``run_dir``:
    where a Ray runtime that starts its own Ray instance keeps Ray's temp files.  A config whose
    meaning is wrong (``mas.config.checks.meaning_errors``) is refused first, whoever validated it."""
    check_config(cfg)
    missing = package_issues(cfg)  # refused here, not by every episode's import
    if missing:
        raise ConfigError("config", issue_lines(missing))
    apply_runtime(cfg.runtime)
    try:
        env = build_env(cfg.env)  # before the models: a data problem should not wait for them to load
    except (OSError, ValueError) as e:  # a task file or reward reference that does not load: mas validate's line
        raise ConfigError("config", issue_lines([(("env",), getattr(cfg.env, "name", None),
                                                  f"the data cannot be read: {e}")])) from None
    check_eval_size(env, *(eval_size or (cfg.trainer.eval_size, "trainer.eval_size")))
    verify = resolve_verifier(cfg.verifier.name, env)  # the turn verifier (a user's reference is imported now)
    cfg, defaults = resolve_default_lrs(cfg)  # unset optim.lr -> the model's default (from its config, no weights)
    if any(p.model == "embedded" for p in cfg.policies.values()):  # the shipped model, or one built now (and said so)
        ensure_embedded(log=lambda msg: print(msg, file=sys.stderr))
    tools = getattr(env, "tools", {})  # an env with tools exposes them by name (envs/base.py)
    agents = build_agents(cfg.agents, cfg.team.name, tools)
    runtime = build_runtime(cfg, {a.policy for a in agents.values()}, run_dir)
    try:
        engine = Engine(
            topology=build_topology(cfg.topology),
            agents=agents,
            tokenizers=runtime.tokenizers,
            trainable=runtime.trainable,
            backend=runtime.backend,
            score=env.score,
            episode_timeout=cfg.runtime.episode_timeout_s,
            tools=tools,
            tool_timeout_s=cfg.runtime.tool_timeout_s,
            tool_memory_mb=cfg.runtime.tool_memory_mb,
            tool_workers=cfg.runtime.tool_workers,
            verify=verify,
            verify_timeout_s=cfg.verifier.timeout_s,
        )
    except BaseException:
        runtime.close()
        raise
    return Team(cfg, agents, engine, env, runtime, defaults)


def describe_team(team: Team) -> dict:
    """What this run trains and on what (models and sizes, data, credit method, devices), for
    ``run_info.json`` and the report's reporting checklist."""
    import platform

    import torch

    from mas.agents.policy import policy_dtype
    from mas.credit import get_credit
    from mas.models.sources import describe_source
    from mas.version import __version__

    policies = {}
    for name, info in team.runtime.describe().items():
        policies[name] = {
            "model": team.cfg.policies[name].model,
            "source": describe_source(team.cfg.policies[name].model),  # e.g. a GGUF's sha256, a wheel's version
            "kind": info["kind"],
            "dtype": policy_dtype(team.cfg.policies[name]),  # as loaded: 'auto' resolved for the device
            "device": info["device"],
            "parameters": info["parameters"],
            "trainable_parameters": info["trainable_parameters"],
            "lr": team.cfg.policies[name].optim.lr if team.cfg.policies[name].optim else None,
            "agents": [a.name for a in team.agents.values() if a.policy == name],
            **({"actor": info["actor"]} if "actor" in info else {}),
        }
    card = get_credit(team.cfg.credit.method).card
    describe = getattr(team.env, "describe", None)
    devices = sorted({p["device"] for p in policies.values()})
    return {
        "mas_version": __version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "policies": policies,
        "env": describe() if describe else {"name": getattr(team.cfg.env, "name", "?")},
        "credit": {"method": team.cfg.credit.method, **(card.__dict__ if card else {})},
        "devices": devices,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_count": os.cpu_count(),
        "runtime": team.cfg.runtime.kind,
        "defaults": team.defaults,  # values the config left unset and build_team chose (e.g. optim.lr)
    }
