"""Build every runtime component of a run from its validated config.

Builders take the few values they need; only this module reads the whole RunConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mas.agents.agent import Agent, build_agents
from mas.agents.policy import PolicyHandle, build_policies
from mas.backends import build_backend
from mas.config import RunConfig
from mas.engine import Engine
from mas.envs import build_env
from mas.learner import Learner
from mas.topologies import build_topology


@dataclass
class Team:
    cfg: RunConfig
    policies: dict[str, PolicyHandle]
    agents: dict[str, Agent]
    backend: Any
    engine: Engine
    env: Any
    learners: dict[str, Learner]  # one per trainable policy that some agent uses


def build_team(cfg: RunConfig) -> Team:
    policies = build_policies(dict(cfg.policies), seed=cfg.trainer.seed)
    agents = build_agents(cfg)
    backend = build_backend(policies)
    env = build_env(cfg.env)
    engine = Engine(
        topology=build_topology(cfg.topology),
        agents=agents,
        tokenizers={name: p.tokenizer for name, p in policies.items()},
        trainable={name: p.trainable for name, p in policies.items()},
        backend=backend,
        score=env.score,
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
        )
        for name, p in policies.items()
        if p.trainable and name in used
    }
    return Team(cfg, policies, agents, backend, engine, env, learners)
