"""Checks across a config's sections: the tools an agent names must be offered by the env, and the agents and
critic a credit method names must exist; settings that only work together (LoRA policies that share a base,
FSDP sharding, a group-relative credit method with one episode per task).

Each check returns ``(YAML path, value found, message)`` per problem; RunConfig's validator
(``mas.config.schema``) gathers them and raises ``mas.config.messages.CrossFieldErrors``.  This module sits
below the schema: a check receives the sections it reads (and the envs' tools) as arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _lora_family_refs(policies: dict) -> list[tuple[tuple, Any, str]]:
    """LoRA policies on one base share one model, hence one Ray actor: their resources and workers must agree."""
    families: dict[tuple, list[str]] = {}
    for name, p in policies.items():
        if p.kind == "lora":
            families.setdefault((p.model, p.dtype, p.device, p.trust_remote_code), []).append(name)
    errs = []
    for names in families.values():
        first = policies[names[0]]
        for name in names[1:]:
            p = policies[name]
            for field, value, want in (("resources", p.resources, first.resources), ("workers", p.workers, first.workers),
                                       ("sharding", p.sharding, first.sharding)):
                if value != want:
                    found = value.model_dump() if field == "resources" else value
                    errs.append((("policies", name, field), found, f"LoRA policies on one base share one actor; "
                                 f"set the same {field} as policies.{names[0]}.{field}"))
    return errs


def _sharding_refs(cfg: Any) -> list[tuple[tuple, Any, str]]:
    """``sharding: fsdp`` only where it can work (mas/runtime/sharding.py); ``cfg``: the RunConfig."""
    errs = []
    for name, p in cfg.policies.items():
        if p.sharding != "fsdp":
            continue
        where = ("policies", name, "sharding")
        if p.workers < 2:
            errs.append((where, "fsdp", f"shards the policy over its workers; set policies.{name}.workers to 2 or more "
                         f"(found {p.workers}), or sharding: none"))
        if cfg.runtime.kind != "ray":
            errs.append((where, "fsdp", "the workers of a sharded policy are Ray actors; set runtime.kind: ray"))
        if p.kind == "full" and cfg.trainer.kl_coef > 0:
            errs.append((where, "fsdp", "the KL term's reference of a full policy is a whole copy of its initial weights, "
                         "which is not sharded: every worker would hold it; set trainer.kl_coef: 0, or use kind: lora "
                         "(its reference is the base with the adapter off)"))
        if cfg.trainer.max_staleness:
            errs.append((where, "fsdp", "trainer.max_staleness 1 samples from rank 0's copy while an update gathers new "
                         "weights into it; set trainer.max_staleness: 0 with sharding"))
    return errs


def _tool_refs(agents: tuple, env: Any, env_tools: Mapping[str, Iterable[str]]) -> list[tuple[tuple, Any, str]]:
    """Every tool an agent names must be offered by the env: ``env_tools`` (``mas.envs.ENV_TOOLS``) maps each env's
    name to its tools' names."""
    if env is None:  # the env section did not validate; its own errors are reported
        return []
    offered = list(env_tools[env.name])
    errs = []
    for i, a in enumerate(agents):
        for j, tool in enumerate(a.tools):
            if tool not in offered:
                errs.append((("agents", i, "tools", j), tool,
                             f"env {env.name!r} offers no such tool; valid: {offered}" if offered else f"env {env.name!r} offers no tools"))
            elif a.tools.index(tool) != j:
                errs.append((("agents", i, "tools", j), tool, "listed twice"))
    return errs


def _credit_refs(credit: Any, agents: list[str], policies: list[str], trainer: Any) -> list[tuple[tuple, Any, str]]:
    """Agents and policies a credit method names must exist (checked here, not at step 0)."""
    if credit is None:
        return []
    errs = []
    for field in ("main_agent", "upstream", "final_agent"):
        value = getattr(credit, field, None)
        if value is not None and value not in agents:
            errs.append((("credit", field), value, f"unknown agent; valid: {agents}"))
    for field in ("exclude", "agents"):
        for i, value in enumerate(getattr(credit, field, ()) or ()):
            if value not in agents:
                errs.append((("credit", field, i), value, f"unknown agent; valid: {agents}"))
    critic = getattr(credit, "critic", None)
    if critic is not None and critic not in policies:
        errs.append((("credit", "critic"), critic, f"unknown policy; valid: {policies}"))
    fanout = getattr(credit, "fanout", None)
    if fanout and trainer is not None and trainer.group_size != fanout[0]:
        errs.append((("trainer", "group_size"), trainer.group_size,
                     f"C3's tree has fanout[0] = {fanout[0]} roots per task; set group_size to {fanout[0]}"))
    why = group_relative(credit)
    if why and trainer is not None and trainer.group_size == 1:
        other = ", or credit.normaliser: global" if why.startswith("normaliser") else ""
        errs.append((("trainer", "group_size"), 1,
                     f"credit {credit.method!r}: {why}, so with one episode per task every advantage is 0 and nothing "
                     f"trains; set trainer.group_size to 2 or more (GRPO-style runs use 4 to 16){other}"))
    return errs


# normalisers whose mean and std are taken per task group (credit/normalise.py): group and
# group_batch_std over its episodes, agent over each agent's turns in it
GROUP_NORMALISERS = ("group", "group_batch_std", "agent")


def group_relative(credit: Any) -> str | None:
    """Why ``credit`` measures an episode against the other episodes of its task's group (so
    that a group of one gives every advantage 0), or None where one episode per task still
    trains (normaliser global or none, reinforce_pp without baseline, C3, whose tree's fanout
    sets its groups).  A reason that starts with "normaliser" is the normaliser's alone.
    tests/test_newcomer_config.py checks this against ``run_credit`` on groups of one."""
    method = getattr(credit, "method", None)
    if method == "rloo":
        return "its baseline is the mean of the task's other episodes"
    if method == "magrpo" and credit.advantage_mode != "raw":
        return f"advantage_mode {credit.advantage_mode!r} compares each joint sample with the task's other samples"
    if method == "ccpo":
        return "its GRPO step centres each role's reward on the task's group"
    if method == "m_grpo":
        return "it normalises the main and the sub-agent rewards over the task's group"
    if method == "reinforce_pp" and credit.baseline:
        return "baseline: true subtracts the task group's mean reward"
    normaliser = getattr(credit, "normaliser", None)
    if normaliser in GROUP_NORMALISERS:
        return f"normaliser {normaliser!r} takes its mean and std over each task's group of episodes"
    return None
