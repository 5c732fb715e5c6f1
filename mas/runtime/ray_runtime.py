"""The Ray runtime: one actor per policy, holding its weights, learner and rollout backend.

Actor groups.  Every policy served by ``hf`` or ``vllm`` lives in a Ray actor (a
``PolicyWorker``, mas/runtime/worker.py): a full policy in its own, the LoRA and frozen
policies on one base in one (``actor_groups``), so the base is loaded once; ``workers: N`` gives a policy N
actors that train data-parallel (mas/runtime/data_parallel.py; rank 0 serves rollouts).  A
policy on an OpenAI-compatible endpoint stays a client in the driver.  Each actor asks for its
policy's ``resources`` (default: 1 GPU where the cluster has GPUs, else 1 CPU; a ``custom``
resource pins it to the nodes that have it).

The driver keeps the engine, the topologies, the env and the credit code.  The seams:

    RayBackend.generate_batch   splits a batch by actor, sends each its requests and the batch
                                seed, gathers (actors sample at the same time); each actor
                                seeds each of its policies as the local runtime does
    RayLearner.start_update     sends the policy's turns (a shard per data-parallel worker) and
                                returns at once; ``result()`` waits.  All actors train at once.
    sync_weights                tells the actor to serve what it trained: weights never leave it

Faults.  A dead actor (killed, out of memory, node lost) surfaces at the next call to it as
``PolicyActorDied``, naming its policies, node and process, with Ray's reason.  Actors are not
restarted behind the trainer's back (``max_restarts=0``): a restarted actor would hold its
initial weights.  ``runtime.restart_actors`` lets the trainer restart them and restore every
policy from the last checkpoint (mas/training/trainer.py).

Checkpoints are written by the actors: straight into the run directory when they share the
driver's node (or ``runtime.shared_run_dir`` says every node mounts it), else their files
travel back to the driver through Ray; loading sends files the other way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas.rollout.backends.base import Backend, BatchError, GenRequest, GenResult
from mas.learning.learner import TrainSample, UpdateSpan
from mas.runtime.base import PolicyActorDied, learner_args
from mas.runtime.ray_cluster import RaySession
from mas.runtime.worker import PolicyWorker, describe_policy
from mas.models.sources import model_key

if TYPE_CHECKING:
    from mas.config.schema import PolicyConfig, RunConfig


def actor_groups(policies: dict[str, "PolicyConfig"]) -> list[list[str]]:
    """Policies that share one actor, in config order: the LoRA and frozen policies on one base
    (the same resolved weights, ``mas.models.sources.model_key``: a short name and the path of its file
    are one; the same dtype, device, resources and workers) share one, which loads the base once
    (``build_policies``); a full policy has its own; endpoint policies have none.  A frozen
    policy given other resources than the LoRA family on its model keeps an actor (and a copy)
    of its own, where those resources place it."""
    groups: dict[tuple, list[str]] = {}
    for name, p in policies.items():
        if p.backend == "openai":
            continue
        if p.kind == "full":
            key: tuple = ("own", name)
        else:
            key = ("base", model_key(p.model), p.dtype, p.device, p.trust_remote_code,
                   p.resources.model_dump_json(), p.workers)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


@dataclass
class ActorGroup:
    """The actor(s) of one policy group: one per data-parallel worker, rank 0 serves."""

    names: tuple[str, ...]
    options: dict[str, Any]  # Ray resource options of each actor
    actors: list[Any] = field(default_factory=list)
    where: list[dict[str, Any]] = field(default_factory=list)  # per rank: pid, host, node_id
    tickets: Any = field(default_factory=itertools.count)  # update order (PolicyWorker docstring)

    def label(self) -> str:
        return ", ".join(repr(n) for n in self.names)

    def get(self, refs: Any) -> Any:
        """``ray.get`` that turns an actor's death into ``PolicyActorDied`` naming policy and node."""
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise PolicyActorDied(self.death_message(e), self.names) from None

    def death_message(self, error: Exception) -> str:
        dead = getattr(error, "actor_id", None)
        rank = next((r for r, a in enumerate(self.actors) if a._actor_id.hex() == dead), 0)
        w = self.where[rank] if rank < len(self.where) else {}
        worker = f" (data-parallel worker {rank} of {len(self.actors)})" if len(self.actors) > 1 else ""
        reason = " ".join(str(error).split())
        return (f"policy {self.label()}: its Ray actor{worker} on node {w.get('host', '?')} "
                f"(node id {str(w.get('node_id'))[:12]}, pid {w.get('pid', '?')}) died. Ray's reason: {reason[:1200]}")


class RayBackend:
    """Serves every policy: requests go to the actor of their policy (or a driver-side client)."""

    def __init__(self, groups: dict[str, ActorGroup], local: Backend | None, local_names: set[str]):
        self.groups = groups  # policy -> its actor group
        self.local, self.local_names = local, local_names  # OpenAI-compatible endpoints

    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        by_group: dict[int, list[int]] = {}
        here: list[int] = []
        for i, r in enumerate(requests):
            if r.policy in self.local_names:
                here.append(i)
            elif r.policy in self.groups:
                by_group.setdefault(id(self.groups[r.policy]), []).append(i)
            else:
                raise KeyError(f"unknown policy {r.policy!r}; valid: {sorted({*self.groups, *self.local_names})}")
        pending = []
        for idx in by_group.values():  # every actor starts sampling before any result is awaited
            group = self.groups[requests[idx[0]].policy]
            ref = group.actors[0].generate.options(concurrency_group="serve").remote([requests[i] for i in idx], seed)
            pending.append((group, idx, ref))
        out: list[GenResult | None] = [None] * len(requests)
        errors: list[BaseException | None] = [None] * len(requests)
        if here:
            try:
                for i, res in zip(here, self.local.generate_batch([requests[i] for i in here], seed=seed)):
                    out[i] = res
            except BatchError as e:  # some endpoint requests failed: keep the rest (as RoutedBackend does)
                for i, res, err in zip(here, e.results, e.errors):
                    out[i], errors[i] = res, err
        for group, idx, ref in pending:
            for i, res in zip(idx, group.get(ref)):
                out[i] = res
        if any(e is not None for e in errors):
            raise BatchError(out, errors)
        return out  # type: ignore[return-value]

    def sync_weights(self, policy: str) -> None:
        if policy in self.local_names:
            self.local.sync_weights(policy)
            return
        group = self.groups[policy]
        group.get(group.actors[0].sync.options(concurrency_group="serve").remote(policy))


class RayUpdate:
    """A started update on a policy's actor(s); ``result()`` waits for it."""

    def __init__(self, learner: "RayLearner", refs: list[Any]):
        self.learner, self.refs = learner, refs
        self.span: UpdateSpan | None = None

    def result(self) -> dict[str, float]:
        outs = self.learner.group.get(self.refs)  # per rank: (metrics, span, version); ranks agree
        metrics, first, version = outs[0]
        spans = [span for _, span, _ in outs]
        self.span = UpdateSpan(first.pid, first.host, min(s.start for s in spans), max(s.end for s in spans))
        self.learner.version = version
        return metrics


class RayLearner:
    """The driver's handle on one policy's learner in its actor(s)."""

    def __init__(self, name: str, group: ActorGroup, version: int = 0):
        self.name, self.group = name, group
        self.version = version  # of the weights it trains; mirrored from the actor

    def start_update(self, samples: list[TrainSample], seed: int | None = None,
                     abort: Callable[[], bool] | None = None) -> RayUpdate:
        """Start the actors' update; ``abort`` is not passed on: an actor's update runs to its
        end (its optimizer steps on its own), so a stop waits for it (the trainer's bound)."""
        actors = self.group.actors
        ticket = next(self.group.tickets)
        refs = [a.update.options(concurrency_group="train").remote(self.name, samples[rank :: len(actors)], seed, ticket)
                for rank, a in enumerate(actors)]
        return RayUpdate(self, refs)


class RayRuntime:
    can_overlap = True
    can_abandon_updates = False  # actors step their optimizers themselves: a stop waits for the updates

    def __init__(self, cfg: "RunConfig", train: set[str], run_dir: Path | None = None):
        self.cfg = cfg
        self.train = train
        self.groups: list[ActorGroup] = []
        self.by_policy: dict[str, ActorGroup] = {}
        self.session: RaySession | None = None
        self.endpoints: dict[str, Any] = {}
        policies = cfg.policies
        plan = actor_groups(dict(policies))
        cpus = sum(_resources(policies[names[0]], False)["num_cpus"] * policies[names[0]].workers for names in plan)
        try:
            self.session = RaySession(cfg.runtime.address, run_dir, cpus)
            import ray

            self.ray = ray
            gpus = ray.cluster_resources().get("GPU", 0) > 0
            for names in plan:
                group = ActorGroup(tuple(names), _resources(policies[names[0]], gpus))
                self.groups.append(group)
                self.by_policy.update(dict.fromkeys(names, group))
            self._start_actors(self.groups)
            # policies on OpenAI-compatible endpoints: clients in the driver
            self.endpoints, endpoint_backend = _endpoint_clients(policies)
            self.tokenizers = {name: self.by_policy[name].where[0]["tokenizers"][name] for name in self.by_policy}
            self.tokenizers.update({n: h.tokenizer for n, h in self.endpoints.items()})
            self.trainable = {name: p.kind != "frozen" for name, p in policies.items()}
            self.backend = RayBackend(self.by_policy, endpoint_backend, set(self.endpoints))
            self.learners = {
                name: RayLearner(name, self.by_policy[name])
                for name in policies
                if name in self.by_policy and self.trainable[name] and name in train
            }
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- actors

    def _actor_class(self):
        learners = max((len(g.names) for g in self.groups), default=1)
        # serve: one rollout at a time; train: the group's updates, in ticket order
        return self.ray.remote(concurrency_groups={"serve": 1, "train": learners})(PolicyWorker)

    def _start_actors(self, groups: list[ActorGroup]) -> None:
        """Start every actor of ``groups``, wait until the cluster placed and built them all, join
        data-parallel groups.  A policy that cannot be placed in time, or whose actor fails to
        build, is named with what it asked for."""
        ray, cfg = self.ray, self.cfg
        actor_class = self._actor_class()
        for group in groups:
            subset = {n: cfg.policies[n] for n in group.names}
            workers = cfg.policies[group.names[0]].workers
            threads = cfg.runtime.num_threads or max(1, int(group.options["num_cpus"]))
            group.actors = [
                actor_class.options(**group.options, max_restarts=0).remote(
                    subset, sorted(self.train & set(group.names)), learner_args(cfg), cfg.trainer.seed,
                    serving_copy=cfg.trainer.max_staleness >= 1, num_threads=threads,
                    deterministic=cfg.runtime.deterministic, rank=rank,
                )
                for rank in range(workers)
            ]
            group.tickets = itertools.count()
        ready = {a.ready.remote(): g for g in groups for a in g.actors}
        done, pending = ray.wait(list(ready), num_returns=len(ready), timeout=cfg.runtime.placement_timeout_s)
        if pending:
            stuck = sorted({ready[r].label() for r in pending})
            raise RuntimeError(
                f"runtime.kind ray: the cluster did not start the actor(s) of policy {', '.join(stuck)} within "
                f"runtime.placement_timeout_s={cfg.runtime.placement_timeout_s:g}s; they ask for "
                + "; ".join(f"{ready[r].label()}: {ready[r].options}" for r in pending)
                + f"; the cluster has {ray.available_resources()} free (see policies.<name>.resources)"
            )
        for ref in done:
            group = ready[ref]
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                cause = getattr(e, "cause", None) or e
                from mas.errors import ModelLoadError

                if isinstance(cause, ModelLoadError):
                    raise ModelLoadError(str(cause)) from None
                raise RuntimeError(f"policy {group.label()}: its Ray actor failed to start: {cause}") from None
        for group in groups:
            group.where = group.get([a.info.remote() for a in group.actors])
            if len(group.actors) > 1:
                address, port = group.get(group.actors[0].data_parallel_address.remote())
                n = len(group.actors)
                sharding = cfg.policies[group.names[0]].sharding
                group.get([a.init_data_parallel.remote(address, port, rank, n, sharding) for rank, a in enumerate(group.actors)])

    def restart(self, everything: bool = False) -> list[str]:
        """Start again every actor group that has a dead actor (a data-parallel group as a whole;
        ``everything``: every group); returns their policies.  The new actors hold initial
        weights: restore a checkpoint next."""
        dead = []
        for group in self.groups:
            try:
                group.get([a.ready.remote() for a in group.actors])
                if everything:
                    dead.append(group)
            except PolicyActorDied:
                dead.append(group)
        for group in dead:
            for a in group.actors:
                self.ray.kill(a, no_restart=True)
        self._start_actors(dead)
        names = [n for g in dead for n in g.names]
        for name in names:
            if name in self.learners:
                self.learners[name].version = 0
        return names

    # ---------------------------------------------------------------- facts

    def describe(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name in self.cfg.policies:
            if name in self.by_policy:
                group = self.by_policy[name]
                w = group.where[0]
                info = {k: v for k, v in w["policies"][name].items() if k != "version"}
                info["actor"] = {"host": w["host"], "node_id": w["node_id"], "pid": w["pid"], "workers": len(group.actors),
                                 "resources": group.options}
            else:
                info = describe_policy(self.endpoints[name])
            out[name] = info
        return out

    # ---------------------------------------------------------------- checkpoints

    def _direct(self, group: ActorGroup, rank: int) -> bool:
        """Can this actor read and write the run directory itself?"""
        node = self.session.driver_node()
        return self.cfg.runtime.shared_run_dir or (node is not None and group.where[rank]["node_id"] == node)

    def save_policies(self, ckpt: Path, names: list[str]) -> None:
        calls = []
        for group in self.groups:
            mine = [n for n in names if n in group.names]
            for rank, a in enumerate(group.actors if mine else []):
                direct = self._direct(group, rank)
                calls.append((group, direct, a.save.remote(str(ckpt), mine) if direct else a.save_files.remote(mine)))
        for group, direct, ref in calls:  # all actors write at once
            files = group.get(ref)
            for rel, data in ({} if direct else files).items():
                path = Path(ckpt) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)

    def load_policies(self, ckpt: Path, names: list[str], learner_state: bool = True) -> None:
        calls = []
        for group in self.groups:
            mine = [n for n in names if n in group.names]
            for rank, a in enumerate(group.actors if mine else []):
                if self._direct(group, rank):
                    ref = a.load.remote(str(ckpt), mine, learner_state)
                else:
                    ref = a.load_files.remote(_checkpoint_files(Path(ckpt), mine), mine, learner_state)
                calls.append((group, ref))
        for group, ref in calls:
            versions = group.get(ref)
            for name in group.names:
                if name in self.learners:
                    self.learners[name].version = versions[name]

    def _warm_up_call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on every actor of ``name``'s group: with data-parallel workers each takes the
        whole warm-up from the same seed, so their weights stay equal; rank 0's answer."""
        group = next(g for g in self.groups if name in g.names)
        refs = [getattr(a, method).remote(name, *args, **kwargs) for a in group.actors]
        return [group.get(r) for r in refs][0]

    def warm_up_begin(self, name: str, demonstrations: list, **kwargs: Any) -> int:
        """Start ``name``'s supervised format warm-up in its actors (``PolicyWorker.warm_up_begin``)."""
        return self._warm_up_call(name, "warm_up_begin", demonstrations, **kwargs)

    def warm_up_steps(self, name: str, steps: int) -> list[float]:
        return self._warm_up_call(name, "warm_up_steps", steps)

    def warm_up_state(self, name: str) -> dict[str, Any] | None:
        """Where ``name``'s warm-up stands; None for a group of several workers (a sharded
        optimizer's state is split over them: a stop there starts the warm-up again)."""
        group = next(g for g in self.groups if name in g.names)
        return self._warm_up_call(name, "warm_up_state") if len(group.actors) == 1 else None

    def warm_up_end(self, name: str) -> dict[str, Any]:
        got = self._warm_up_call(name, "warm_up_end")
        group = next(g for g in self.groups if name in g.names)
        self.learners[name].version = group.get(group.actors[0].versions.remote())[name]
        return got

    def close(self) -> None:
        """Kill the actors and leave Ray (shutting down a local instance this run started).  Each
        actor first closes its backend: a vLLM engine's processes are the actor's children, and
        killing the actor alone would leave them running."""
        ray = getattr(self, "ray", None)
        closing = [a.close.remote() for group in self.groups for a in group.actors if ray is not None]
        if closing:
            try:  # wait for all (a dead actor's call is ready at once, as an error); a stuck one is killed below
                ray.wait(closing, num_returns=len(closing), timeout=30)
            except Exception:  # noqa: BLE001 - Ray already gone
                pass
        for group in self.groups:
            for a in group.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already dead, or Ray already gone
                    pass
            group.actors = []
        if self.session is not None:
            self.session.close()
            self.session = None


def _resources(cfg: "PolicyConfig", cluster_has_gpus: bool) -> dict[str, Any]:
    """Ray options of one actor of this policy: its ``resources``, with the defaults filled in."""
    r = cfg.resources
    wants_gpu = cluster_has_gpus and cfg.device != "cpu"
    num_gpus = r.num_gpus if r.num_gpus is not None else (1 if wants_gpu else 0)
    num_cpus = r.num_cpus if r.num_cpus is not None else 1
    out: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if r.custom:
        out["resources"] = dict(r.custom)
    return out


def _endpoint_clients(policies: dict[str, "PolicyConfig"]) -> tuple[dict[str, Any], Backend | None]:
    """Handles of the policies on OpenAI-compatible endpoints, and one backend of their clients."""
    names = [n for n, p in policies.items() if p.backend == "openai"]
    if not names:
        return {}, None
    from mas.agents.policy import build_policies
    from mas.rollout.backends import build_backend

    handles = build_policies({n: policies[n] for n in names})
    return handles, build_backend(handles)


def _checkpoint_files(ckpt: Path, names: list[str]) -> dict[str, bytes]:
    """The files of ``names`` in a checkpoint (relative path -> bytes), to send to an actor."""
    out = {}
    for name in names:
        for folder in (ckpt / "policies" / name, ckpt / "learners" / name):
            for p in folder.rglob("*") if folder.is_dir() else ():
                if p.is_file():
                    out[str(p.relative_to(ckpt))] = p.read_bytes()
        legacy = ckpt / "learners" / f"{name}.pt"
        if legacy.is_file():
            out[str(legacy.relative_to(ckpt))] = legacy.read_bytes()
    return out

