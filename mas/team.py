"""Build every runtime component of a run from its validated config.

Builders take the few values they need; only this module reads the whole RunConfig.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from mas.agents.agent import Agent, build_agents
from mas.agents.policy import PolicyHandle, build_policies
from mas.backends import build_backend
from mas.backends.base import Backend
from mas.config import ConfigError, RunConfig, RuntimeConfig
from mas.defaults import resolve_default_lrs
from mas.engine import Engine
from mas.envs import build_env
from mas.envs.base import Env
from mas.learner import Learner
from mas.topologies import build_topology


@dataclass
class Team:
    cfg: RunConfig
    policies: dict[str, PolicyHandle]
    agents: dict[str, Agent]
    backend: Backend
    engine: Engine
    env: Env
    learners: dict[str, Learner]  # one per trainable policy that some agent uses
    defaults: dict[str, str] = field(default_factory=dict)  # YAML path -> the value build_team chose, and why


def apply_runtime(runtime: RuntimeConfig) -> None:
    """Process-wide settings: torch threads and deterministic algorithms."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the training progress bar is the one that matters
    if runtime.num_threads:
        torch.set_num_threads(runtime.num_threads)
    if runtime.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def check_eval_size(env: Env, size: int, where: str) -> None:
    """A held-out size larger than the env's held-out split is a config error (named by ``where``)."""
    from mas.checks import eval_size_issues

    issues = eval_size_issues(env, size, where)
    if issues:
        raise ConfigError("config", [f"{where}: {message}" for _, _, message in issues])


def build_team(cfg: RunConfig, eval_size: tuple[int, str] | None = None) -> Team:
    """Everything a run needs.  ``eval_size``: (size, where it was set) of the held-out evaluation
    to check against the env before any model loads; default trainer.eval_size."""
    apply_runtime(cfg.runtime)
    env = build_env(cfg.env)  # before the models: a data problem should not wait for them to load
    check_eval_size(env, *(eval_size or (cfg.trainer.eval_size, "trainer.eval_size")))
    cfg, defaults = resolve_default_lrs(cfg)  # unset optim.lr -> the model's default (from its config, no weights)
    policies = build_policies(dict(cfg.policies), seed=cfg.trainer.seed)
    tools = getattr(env, "tools", {})  # an env with tools exposes them by name (envs/base.py)
    agents = build_agents(cfg.agents, cfg.team.name, tools)
    backend = build_backend(policies)
    engine = Engine(
        topology=build_topology(cfg.topology),
        agents=agents,
        tokenizers={name: p.tokenizer for name, p in policies.items()},
        trainable={name: p.trainable for name, p in policies.items()},
        backend=backend,
        score=env.score,
        episode_timeout=cfg.runtime.episode_timeout_s,
        tools=tools,
        tool_timeout_s=cfg.runtime.tool_timeout_s,
        tool_memory_mb=cfg.runtime.tool_memory_mb,
        tool_workers=cfg.runtime.tool_workers,
    )
    used = {a.policy for a in agents.values()}
    t = cfg.trainer
    learners = {
        name: Learner(
            p,
            cfg.policies[name].optim,
            total_steps=t.steps,
            clip_low=t.clip_low,
            clip_high=t.clip_high,
            kl_coef=t.kl_coef,
            loss_agg=t.loss_agg,
            ppo_epochs=t.ppo_epochs,
            max_tokens=t.loss_agg_max_tokens or max(a.sampling.max_new_tokens for a in cfg.agents if a.policy == name),
        )
        for name, p in policies.items()
        if p.trainable and name in used
    }
    return Team(cfg, policies, agents, backend, engine, env, learners, defaults)


def describe_team(team: Team) -> dict:
    """What this run trains and on what (models and sizes, data, credit method, devices), for
    ``run_info.json`` and the report's reporting checklist."""
    import platform

    import torch

    from mas import __version__
    from mas.credit import get_credit

    policies = {}
    for name, p in team.policies.items():
        named = list(p.model.named_parameters()) if p.model is not None else []  # None: a remote endpoint
        base = sum(t.numel() for n, t in named if "lora_" not in n)  # a LoRA policy: the shared base only
        trainable = sum(t.numel() for t in p.trainable_parameters())
        policies[name] = {
            "model": team.cfg.policies[name].model,
            "kind": p.kind,
            "dtype": team.cfg.policies[name].dtype,
            "device": str(p.device),
            "parameters": base,
            "trainable_parameters": trainable,
            "lr": team.cfg.policies[name].optim.lr if team.cfg.policies[name].optim else None,
            "agents": [a.name for a in team.agents.values() if a.policy == name],
        }
    card = get_credit(team.cfg.credit.method).card
    describe = getattr(team.env, "describe", None)
    devices = sorted({str(p.device) for p in team.policies.values()})
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
        "defaults": team.defaults,  # values the config left unset and build_team chose (e.g. optim.lr)
    }
