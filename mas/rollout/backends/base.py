"""The rollout backend interface: token ids in, sampled completions with their logprobs out.

A backend serves named policies.  Topology code sends it ``GenRequest``s (one per agent turn;
concurrent episodes send many at once) and gets back one ``GenResult`` per request, in order.
``logprobs`` are the sampling-time logprobs the PPO importance ratio is taken against.

Seeding: ``generate_batch(requests, seed)`` samples each policy's requests from its own RNG
stream, seeded by ``policy_seed(seed, policy)``, so what a policy samples never depends on
which other policies shared the batch, nor on which process serves them (the local runtime
serves every policy in one process, the Ray runtime each in its own actor).  ``seed=None``
leaves the RNG as it is.

A backend whose requests fail one by one (a remote endpoint) raises ``BatchError`` with the
results it has and the error of each request that failed, so only those fail; any other
exception fails the whole batch, and the engine then retries its requests one at a time
(``generate_apart``, which ``mas serve`` uses too).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Literal, Protocol


@dataclass
class GenRequest:
    policy: str  # name of the policy (entry of the config's 'policies') to sample from
    prompt_ids: list[int]
    temperature: float  # 0 means greedy
    top_p: float
    top_k: int  # 0 disables top-k
    max_new_tokens: int
    agent: str = ""  # which agent asks (for logging, per-agent adapters and scripted backends)
    messages: list[dict[str, str]] | None = None  # the chat messages prompt_ids were rendered from
    # the reply's forced start (a tool call a request's tool_choice asks for, a JSON reply's "{"), already at
    # the end of prompt_ids: the result is what follows it.  A backend that sends messages, not ids, sends it too.
    prefix: str = ""


@dataclass
class GenResult:
    completion_ids: list[int]  # ends with the stop id if finish_reason == "stop"
    logprobs: list[float]  # one per completion id
    text: str  # decoded completion without the stop id and special tokens
    finish_reason: Literal["stop", "length"]
    weight_version: int | None = None  # version of the policy's weights that sampled it (None: unversioned)
    usage_tokens: int | None = None  # completion tokens a remote endpoint reported (it returns no ids)


class ServedPolicy(Protocol):
    """What a backend reads of a policy it serves; ``mas.agents.policy.PolicyHandle`` is one.  The
    backends sit below the agents (docs/architecture.md, "Layering"), so they name this, not that class."""

    name: str
    kind: str  # full, lora or frozen
    backend: str  # hf, vllm or openai
    model: Any  # the transformers model (a PeftModel for LoRA); None for an endpoint
    tokenizer: Any
    device: Any  # torch.device
    adapter: str | None  # the LoRA adapter's name
    version: int  # updates so far
    endpoint: Any  # backend openai: the server's EndpointConfig
    remote_model: str | None  # backend openai: the model name sent to the server

    def activate(self) -> ContextManager[Any]: ...

    def save_pretrained(self, path: Any) -> None: ...


def completion_stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """Ids that end a completion: the model's generation EOS ids (int or list) and the tokenizer's EOS.

    Instruct models often stop on more than one id (Qwen2.5: ``<|im_end|>`` and
    ``<|endoftext|>``); generation stops on any of them.  Order is kept, duplicates dropped.
    """
    ids: list[int] = []
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    for i in ([] if eos is None else [eos] if isinstance(eos, int) else list(eos)) + [tokenizer.eos_token_id]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an EOS token id")
    return ids


class BackendUnavailable(RuntimeError):
    """The backend itself is gone (e.g. a policy's Ray actor died): no episode can go on, so the
    engine fails the whole rollout with this error instead of marking episodes failed."""


def policy_seed(seed: int, policy: str) -> int:
    """The RNG seed of ``policy``'s requests in a batch seeded ``seed`` (stable across processes:
    crc32, not Python's salted ``hash``)."""
    return (seed * 1_000_003 + zlib.crc32(policy.encode("utf-8"))) % (2**63 - 1)


class BatchError(RuntimeError):
    """Some requests of a batch failed: ``results[i]`` or ``errors[i]`` for each request, in order."""

    def __init__(self, results: list[GenResult | None], errors: list[BaseException | None]):
        self.results, self.errors = results, errors
        failed = [e for e in errors if e is not None]
        super().__init__(f"{len(failed)} of {len(errors)} requests failed; first: {type(failed[0]).__name__}: {failed[0]}"
                         if failed else "no request failed")


Outcome = tuple[list[GenResult | None] | None, BaseException | None]  # a group's results, or its error


def generate_apart(call: Callable[[list[GenRequest]], list[GenResult]], groups: list[list[GenRequest]],
                   on_retry: Callable[[BaseException], None] | None = None) -> list[Outcome]:
    """Generate every group's requests in one ``call`` and give each group its outcome: its
    results (in order), or the error that fails it.  A group is what fails together: one
    episode's request (the engine's ``Batcher``), one client request's ``n`` rows (``mas serve``).

    Where the call fails, only what failed fails:

    - ``BackendUnavailable``, from the batch or a retry, is raised to the caller: nothing can be served;
    - ``BatchError`` (the backend says which requests failed): each group gets its requests'
      results and the first of their errors;
    - any other error: each group is generated again on its own (``on_retry(error)`` first), so a
      group the backend cannot serve fails alone; a lone group is not sent again, which would only
      repeat the error;
    - a call that returns another number of results than it was sent fails the groups it was sent
      (every group, or on a retry that group), and so does a ``BatchError`` whose lists do not
      match the requests; a request with neither a result nor an error fails its group.
    """
    rows = [r for g in groups for r in g]
    try:
        results = call(rows)
    except BackendUnavailable:
        raise
    except BatchError as exc:
        return _split(groups, exc.results, exc.errors)
    except Exception as exc:  # noqa: BLE001 - isolate the bad group(s): one at a time
        if len(groups) == 1:
            return [(None, exc)]
        if on_retry is not None:
            on_retry(exc)
        out: list[Outcome] = []
        for group in groups:
            try:
                got = call(group)
            except BackendUnavailable:
                raise
            except BatchError as one:
                out.extend(_split([group], one.results, one.errors))
            except Exception as one:  # noqa: BLE001 - this group fails
                out.append((None, one))
            else:
                out.append((got, None) if len(got) == len(group) else (None, _miscounted(got, group)))
        return out
    if len(results) != len(rows):
        return [(None, _miscounted(results, rows))] * len(groups)
    return _split(groups, results, [None] * len(rows))


def _miscounted(results: list[GenResult], rows: list[GenRequest]) -> RuntimeError:
    return RuntimeError(f"the backend returned {len(results)} results for {len(rows)} requests")


def _split(groups: list[list[GenRequest]], results: list[GenResult | None],
           errors: list[BaseException | None]) -> list[Outcome]:
    n = sum(len(g) for g in groups)
    if len(results) != n or len(errors) != n:
        err = RuntimeError(f"the backend returned {len(results)} results and {len(errors)} errors for {n} requests")
        return [(None, err)] * len(groups)
    out: list[Outcome] = []
    at = 0
    for group in groups:
        got, errs = list(results[at:at + len(group)]), errors[at:at + len(group)]
        failed = [e for e in errs if e is not None]
        if not failed and any(r is None for r in got):
            failed = [RuntimeError("the backend returned neither a result nor an error for a request")]
        out.append((got, failed[0] if failed else None))
        at += len(group)
    return out


class Backend(Protocol):
    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        """Sample one completion per request; results are in the order of ``requests``.
        With a ``seed``, each policy samples from its own stream ``policy_seed(seed, policy)``."""
        ...

    def sync_weights(self, policy: str) -> None:
        """Make the backend serve the learner's current weights of ``policy`` (after an update)."""
        ...


class RoutedBackend:
    """Several backends behind one: each request goes to the backend serving its policy.

    Used when policies name different backends (e.g. a frozen critic on hf, the trained agents
    on vllm).  Results come back in request order.
    """

    def __init__(self, routes: dict[str, Backend]):
        self.routes = routes  # policy name -> backend

    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        by_backend: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            if r.policy not in self.routes:
                raise KeyError(f"unknown policy {r.policy!r}; valid: {sorted(self.routes)}")
            by_backend.setdefault(id(self.routes[r.policy]), []).append(i)
        out: list[GenResult | None] = [None] * len(requests)
        errors: list[BaseException | None] = [None] * len(requests)
        for idx in by_backend.values():
            backend = self.routes[requests[idx[0]].policy]
            try:
                for i, res in zip(idx, backend.generate_batch([requests[i] for i in idx], seed=seed)):
                    out[i] = res
            except BatchError as e:  # some of this backend's requests failed: keep the rest
                for i, res, err in zip(idx, e.results, e.errors):
                    out[i], errors[i] = res, err
        if any(e is not None for e in errors):
            raise BatchError(out, errors)
        return out  # type: ignore[return-value]

    def sync_weights(self, policy: str) -> None:
        self.routes[policy].sync_weights(policy)

    def _backends(self) -> list[Backend]:
        return list({id(b): b for b in self.routes.values()}.values())

    def take_metrics(self) -> dict[str, Any]:
        """The routed backends' ``take_metrics()`` records, merged (see ``take_backend_metrics``)."""
        out: dict[str, Any] = {}
        for backend in self._backends():
            out.update(take_backend_metrics(backend))
        return out

    def close(self) -> None:
        """Close every routed backend that holds something to close (a vLLM engine)."""
        close_backend(*self._backends())


def take_backend_metrics(backend: Any) -> dict[str, Any]:
    """What a backend's engines cost since the last call, by backend kind (``{"vllm": {...}}``),
    for a training step's record; {} for a backend that keeps no such record (hf)."""
    take = getattr(backend, "take_metrics", None)
    return take() if take is not None else {}


def close_backend(*backends: Any) -> None:
    """``close()`` each backend that has one (vLLM: its engine processes); all are tried, the
    first error is raised after."""
    errors = []
    for backend in backends:
        close = getattr(backend, "close", None)
        if close is not None:
            try:
                close()
            except Exception as e:  # noqa: BLE001 - close the others, then raise
                errors.append(e)
    if errors:
        raise errors[0]
