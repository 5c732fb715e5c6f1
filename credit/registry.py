"""Registry of credit methods: pure functions registered by name, all with one signature.

    @register_credit("dr_mas", DrMasConfig)
    def dr_mas(batch: CreditBatch, cfg: DrMasConfig, results: Results | None = None) -> Credit

The trainer calls ``run_credit(batch, cfg, results)``, which dispatches on ``cfg.method``
(no ``if method == ...`` branches anywhere else), casts the result once and checks that the
advantages are finite.  Precision: every method computes in float64 (``CREDIT_DTYPE``) from
float64 inputs (``build_credit_batch``) and returns float64; ``run_credit`` is the one place
that rounds, to ``dtype`` (float32 by default, the learner's precision), so a method's
advantages equal its float64 result rounded once, never float32 arithmetic (an integer
ratio such as RLOO's G/(G−1) would otherwise land in float32 and differ by ~1e-7).
Methods that need extra evaluations (replays, interventions, critic calls) also register a
``plan(groups, cfg) -> list[Request]``; the engine executes the requests and passes the
results back to the method.  ``credit_config_union()`` is the discriminated union of all
registered config classes for the pydantic run config.

Shapes: N flattened turns, E episodes.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, TypeVar, Union

import torch
from pydantic import BaseModel, Field

from mas.types import Credit, CreditBatch, EpisodeGroup, Request, Results

CREDIT_DTYPE = torch.float64  # all credit arithmetic
OUTPUT_DTYPE = torch.float32  # what run_credit hands to the learner (one cast, at the end)

CreditFn = Callable[[CreditBatch, Any, "Results | None"], Credit]
PlanFn = Callable[[list[EpisodeGroup], Any], list[Request]]
F = TypeVar("F", bound=Callable[..., Credit])


@dataclass(frozen=True)
class MethodCard:
    """What a method is, for the reporting checklist (``mas report``)."""

    family: str  # methodology family, e.g. "counterfactual: Shapley values from coalition re-runs"
    granularity: str  # what one credit value is attached to: episode, agent, turn
    baseline: str  # what the advantage is measured against


@dataclass(frozen=True)
class CreditMethod:
    """A registered credit method.

    ``plan`` receives the episode groups (requests need the source ``Episode`` objects)
    and the method's config, and returns the extra evaluations to execute; ``None`` for
    methods that need none.
    """

    name: str
    fn: CreditFn
    config_cls: type[BaseModel]
    plan: PlanFn | None = None
    state: Any = None  # for methods that keep state across steps: an object with state_dict/load_state_dict/reset
    followup: Callable[..., list[Request]] | None = None  # (groups, cfg, results) -> a second round (e.g. critic retries)
    card: MethodCard | None = None  # family, granularity and baseline for reports


class UnknownCreditMethodError(KeyError):
    """An unknown credit-method name; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class NonFiniteCreditError(FloatingPointError):
    """A credit method produced (or was given) NaN/Inf; ``agents`` names whose turns."""

    def __init__(self, message: str, agents: list[str]):
        super().__init__(message)
        self.agents = agents


_REGISTRY: dict[str, CreditMethod] = {}


def _check_config_cls(name: str, config_cls: type[BaseModel]) -> None:
    if not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel)):
        raise TypeError(f"credit method {name!r}: config_cls must be a pydantic BaseModel subclass, got {config_cls!r}")
    field = config_cls.model_fields.get("method")
    if field is None or typing.get_origin(field.annotation) is not Literal or typing.get_args(field.annotation) != (name,):
        raise TypeError(
            f"credit method {name!r}: {config_cls.__name__} must declare `method: Literal[{name!r}]` "
            f"(found {getattr(field, 'annotation', None)!r})"
        )


def register_credit(
    name: str,
    config_cls: type[BaseModel],
    plan: PlanFn | None = None,
    state: Any = None,
    followup: Callable[..., list[Request]] | None = None,
    card: MethodCard | None = None,
) -> Callable[[F], F]:
    """Decorator registering ``fn(batch, cfg, results=None) -> Credit`` under ``name``.

    Registering a name twice is a ValueError; ``config_cls`` must declare
    ``method: Literal[name]`` (TypeError otherwise).  ``state``: for a method that keeps
    state across steps (CCPO v1's history), an object with ``state_dict()``,
    ``load_state_dict(d)`` and ``reset()``; checkpoints save it and a fresh run resets it.
    ``followup(groups, cfg, results)``: a second round of requests planned from the first
    round's results (e.g. a critic's format-retry prompts); [] when none are needed.
    ``card``: the method's family, credit granularity and baseline, shown by ``mas report``.
    """

    def decorator(fn: F) -> F:
        if name in _REGISTRY:
            raise ValueError(f"credit method {name!r} is already registered (by {_REGISTRY[name].fn.__module__}.{_REGISTRY[name].fn.__qualname__})")
        _check_config_cls(name, config_cls)
        _REGISTRY[name] = CreditMethod(name=name, fn=fn, config_cls=config_cls, plan=plan, state=state, followup=followup, card=card)
        return fn

    return decorator


def credit_names() -> list[str]:
    """Registered method names, sorted."""
    return sorted(_REGISTRY)


def get_credit(name: str) -> CreditMethod:
    """The method registered as ``name``; unknown names raise ``UnknownCreditMethodError``
    (a KeyError) whose message lists the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownCreditMethodError(f"unknown credit method {name!r}; valid: {', '.join(credit_names())}") from None


def credit_config_union() -> Any:
    """``Annotated[Union[<config classes>], Field(discriminator="method")]`` of all methods.

    Build it after ``import mas.credit`` (which registers the built-in methods).
    """
    classes = tuple(_REGISTRY[n].config_cls for n in credit_names())
    if not classes:
        raise RuntimeError("no credit methods registered; import mas.credit first")
    if len(classes) == 1:  # pydantic needs two or more variants for a discriminated union
        return classes[0]
    return Annotated[Union[classes], Field(discriminator="method")]  # noqa: UP007


def plan_credit(groups: list[EpisodeGroup], cfg: Any) -> list[Request]:
    """The extra evaluations ``cfg.method`` asks for ([] for methods without a plan)."""
    method = get_credit(cfg.method)
    return [] if method.plan is None else list(method.plan(groups, cfg))


def followup_credit(groups: list[EpisodeGroup], cfg: Any, results: Results | None) -> list[Request]:
    """The second round ``cfg.method`` asks for after seeing ``results`` ([] for most methods)."""
    method = get_credit(cfg.method)
    if method.followup is None or results is None:
        return []
    return list(method.followup(groups, cfg, results))


def run_rewards(results: Results | None, key: str, method: str, what: str) -> tuple[list[float], int]:
    """Rewards of the usable episodes an executed request ``key`` produced, and how many failed.

    A key missing from ``results`` is a ValueError (the trainer runs plan -> execute -> credit);
    a failed run (status "error") is counted, not used.
    """
    if results is None or key not in results:
        raise ValueError(f"{method}: missing {what} results for {key!r}; run plan_credit and Engine.execute first")
    runs = results[key]
    return [float(ep.reward) for ep in runs if ep.status != "error"], sum(ep.status == "error" for ep in runs)


def _agents_of(batch: CreditBatch, turn_mask: torch.Tensor) -> list[str]:
    ids = torch.unique(batch.agent_ids[turn_mask]).tolist()
    return sorted(batch.agent_names[i] for i in ids)


def _episodes_of(batch: CreditBatch, turn_mask: torch.Tensor) -> list[int]:
    return sorted(set(batch.episode_ids[turn_mask].tolist()))


def _cast(credit: Credit, dtype: torch.dtype) -> Credit:
    """The one rounding of a method's float64 result: advantages and float breakdown tensors."""
    breakdown = {k: v.to(dtype) if v.is_floating_point() else v for k, v in credit.breakdown.items()}
    return dataclasses.replace(credit, advantages=credit.advantages.to(dtype), breakdown=breakdown)


def run_credit(batch: CreditBatch, cfg: Any, results: Results | None = None, dtype: torch.dtype = OUTPUT_DTYPE) -> Credit:
    """Run the method named by ``cfg.method``, cast its float64 result once to ``dtype``, check it.

    Raises ``NonFiniteCreditError`` (a FloatingPointError) naming the episodes and agents
    concerned when an episode reward is NaN/Inf (before running) or an advantage is NaN/Inf
    after the cast (e.g. a reward of 1e155 kept raw by normaliser none overflows float32:
    it fails here, loudly, instead of training on inf).
    """
    method = get_credit(cfg.method)
    if not isinstance(cfg, method.config_cls):
        raise TypeError(f"credit method {method.name!r} expects a {method.config_cls.__name__}, got {type(cfg).__name__}")

    bad_episodes = ~torch.isfinite(batch.episode_rewards)  # [E]
    if bool(bad_episodes.any()):
        bad_turns = bad_episodes[batch.episode_ids]  # [N]
        agents = _agents_of(batch, bad_turns)
        episodes = torch.nonzero(bad_episodes).flatten().tolist()
        raise NonFiniteCreditError(
            f"credit {method.name!r}: non-finite outcome reward in episodes {episodes}; agents with turns there: {agents}",
            agents,
        )

    credit = method.fn(batch, cfg, results)

    adv = credit.advantages  # [N]
    if adv.shape != (batch.num_turns,):
        raise ValueError(f"credit {method.name!r} returned advantages of shape {tuple(adv.shape)}, expected ({batch.num_turns},)")
    credit = _cast(credit, dtype)
    bad = ~torch.isfinite(credit.advantages)  # [N]
    if bool(bad.any()):
        agents = _agents_of(batch, bad)
        episodes = _episodes_of(batch, bad)
        rewards = batch.episode_rewards[episodes].tolist()
        raise NonFiniteCreditError(
            f"credit {method.name!r}: {int(bad.sum())} of {batch.num_turns} advantages are NaN/Inf in {dtype} "
            f"(episodes {episodes}, outcome rewards {rewards}; agents {agents}); check the env's reward scale",
            agents,
        )
    return credit
