"""The ``openai`` rollout backend: a frozen policy (an agent or a critic) served by a remote
OpenAI-compatible chat endpoint (OpenAI, vLLM's ``vllm serve``, SGLang, llama.cpp, ...).

Each ``GenRequest`` becomes one ``POST {base_url}/chat/completions`` with the request's chat
``messages`` (``GenRequest.messages``; the engine always sets them), sent with ``httpx`` (one
client, shared by a thread pool: the requests of one ``generate_batch`` run concurrently and
come back in request order).  Body::

    {"model": model, "messages": [...], "max_tokens": max_new_tokens, "temperature": T,
     "top_p": top_p, "n": 1, **extra_body}

``top_k`` is not part of the OpenAI API and is not sent (pass it in ``extra_body`` for servers
that accept it, e.g. vLLM).  Temperature 0 asks the server for greedy decoding.  A request whose
reply has a forced start (``GenRequest.prefix``: a tool call its ``tool_choice`` asks for, the
``{`` of a JSON reply) sends it as a last assistant message to be continued, with vLLM's chat
extensions ``"continue_final_message": true, "add_generation_prompt": false`` (a server without
them refuses or ignores them); the reply's text is what follows it.

The reply's ``choices[0].message.content`` is the text; ``finish_reason`` "length" is kept,
every other value ("stop", "content_filter", "tool_calls", null) reads as "stop".
``completion_ids`` and ``logprobs`` are empty: a remote policy is never trained (the config
must declare it ``kind: frozen``; ``sync_weights`` refuses), so no token ids or sampling
logprobs are needed, and its turns count 0 completion tokens in reports.

Authentication: the API key is read from the environment variable ``api_key_env`` when the
backend is built (never from the config file, never logged); without it no Authorization
header is sent (a local server needs none).

Faults: each attempt has ``timeout_s`` for the whole reply (connect, send, and every byte of
the answer: a server that hangs or trickles is cut off), and a reply may be at most
``MAX_REPLY_BYTES``.  Transient failures are retried ``max_retries`` times with exponential
back-off (``tenacity``): connection errors, timeouts, HTTP 408/409/429/5xx, and 200 replies
that are not JSON or have no ``choices[0].message.content`` (a proxy or an overloaded server
answering garbage).  Any other HTTP status fails at once.  Either way the error is an
``EndpointError`` that names the endpoint, the cause and the attempts, which the engine
turns into a failed episode (agents) or an empty reply counted as a ``critic_error`` fault
(critiques); the run goes on.

``ChatOnlyTokenizer`` stands in for a tokenizer where the engine renders prompt ids for a
remote policy: the ids are the UTF-8 bytes of the plain-format prompt (never sent anywhere),
which keeps replay's "same prompt" check meaningful.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from mas.rollout.backends.base import BatchError, GenRequest, GenResult

_TRANSIENT_STATUS = {408, 409, 429, 500, 502, 503, 504}
MAX_REPLY_BYTES = 16 * 1024 * 1024  # a chat completion is kilobytes; a reply past this is refused
MAX_BACKOFF_S = 60.0


class EndpointError(RuntimeError):
    """A chat completion request failed; the message names the endpoint and the cause."""


class _Transient(Exception):
    """A failure worth retrying."""


class OpenAICompatBackend:
    """Serve requests from one OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the model name the server expects in the request body.
        api_key_env: environment variable holding the API key (unset: no Authorization header).
        timeout_s: limit of one attempt, for the whole reply, in seconds.
        max_concurrency: requests in flight at once (thread pool size).
        max_retries: extra attempts after a transient failure.
        retry_backoff_s: first back-off; doubles on each retry (at most 60 s).
        extra_body: extra JSON fields merged into every request body (e.g. ``{"top_k": 20}``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60,
        max_concurrency: int = 8,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        extra_body: dict[str, Any] | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0 or retry_backoff_s < 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0, timeout_s > 0 and retry_backoff_s >= 0 are required")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.extra_body = dict(extra_body or {})
        key = os.environ.get(api_key_env, "").strip() if api_key_env else ""
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s), follow_redirects=False,
                                    limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency))
        self.requests = 0  # completions requested (for tests and cost reports)

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatBackend(url={self.url!r}, model={self.model!r})"

    def close(self) -> None:
        self._client.close()

    # -- Backend protocol -----------------------------------------------------------------------

    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        """One chat completion per request, concurrently; results in request order (``seed`` is
        not sent: a remote server's sampling is its own).

        Requests fail one by one: if any of several did (after its retries), ``BatchError``
        carries the others' results and each failure, so the engine does not send them again;
        a single request raises its ``EndpointError``."""
        for r in requests:
            if not r.messages:
                raise ValueError(f"request of agent {r.agent!r} for policy {r.policy!r} has no chat messages; the openai backend sends messages, not token ids")
        self.requests += len(requests)
        if len(requests) <= 1 or self.max_concurrency == 1:
            outcomes = [self._outcome(r) for r in requests]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
                outcomes = list(pool.map(self._outcome, requests))
        if len(outcomes) == 1 and outcomes[0][1] is not None:
            raise outcomes[0][1]
        if any(err is not None for _, err in outcomes):
            raise BatchError([res for res, _ in outcomes], [err for _, err in outcomes])
        return [res for res, _ in outcomes]

    def _outcome(self, req: GenRequest) -> tuple[GenResult | None, EndpointError | None]:
        try:
            return self._complete(req), None
        except EndpointError as e:
            return None, e

    def sync_weights(self, policy: str) -> None:
        """A remote policy has no local weights to serve: it must be frozen."""
        raise RuntimeError(f"policy {policy!r} is served by the remote endpoint {self.url} and cannot be trained; declare it kind: frozen")

    # -- internals ------------------------------------------------------------------------------

    def body(self, req: GenRequest) -> dict[str, Any]:
        """The JSON body sent for ``req``."""
        messages = [{"role": m["role"], "content": m["content"]} for m in req.messages or []]
        forced = {"continue_final_message": True, "add_generation_prompt": False} if req.prefix else {}
        return {
            "model": self.model,
            "messages": messages + ([{"role": "assistant", "content": req.prefix}] if req.prefix else []),
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "n": 1,
            **forced,
            **self.extra_body,
        }

    def _complete(self, req: GenRequest) -> GenResult:
        data = json.dumps(self.body(req)).encode("utf-8")
        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential(multiplier=self.retry_backoff_s, max=MAX_BACKOFF_S),
            retry=retry_if_exception_type(_Transient),
            reraise=True,
        )
        attempts = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    return _result(self._post(data), self.url)
        except _Transient as e:
            raise EndpointError(f"{self.url}: {e} (after {attempts} attempts)") from None
        raise AssertionError("unreachable")  # pragma: no cover - tenacity either returns or raises

    def _post(self, data: bytes) -> Any:
        """One attempt: the decoded JSON reply, ``_Transient`` for what may pass, else EndpointError."""
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._client.stream("POST", self.url, content=data) as resp:
                raw = bytearray()
                for chunk in resp.iter_bytes():
                    raw += chunk
                    if len(raw) > MAX_REPLY_BYTES:
                        raise EndpointError(f"{self.url}: reply larger than {MAX_REPLY_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise _Transient(f"timeout: the reply took longer than {self.timeout_s:g}s")
                status = resp.status_code
        except httpx.TimeoutException as e:
            raise _Transient(f"timeout after {self.timeout_s:g}s ({type(e).__name__})") from None
        except httpx.TransportError as e:
            raise _Transient(f"{type(e).__name__}: {e}") from None
        if status >= 400:
            detail = bytes(raw[:300]).decode("utf-8", "replace")
            if status in _TRANSIENT_STATUS:
                raise _Transient(f"HTTP {status}: {detail}")
            raise EndpointError(f"{self.url}: HTTP {status}: {detail}")
        try:
            return json.loads(bytes(raw))
        except ValueError:
            raise _Transient(f"reply is not JSON: {bytes(raw[:200])!r}") from None


def _result(reply: Any, url: str) -> GenResult:
    try:
        choice = reply["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise _Transient(f"reply has no choices[0].message.content: {json.dumps(reply)[:200]}") from None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    usage = reply.get("usage") if isinstance(reply, dict) else None
    used = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return GenResult(completion_ids=[], logprobs=[], text=text if isinstance(text, str) else "",
                     finish_reason="length" if finish == "length" else "stop",
                     usage_tokens=used if isinstance(used, int) and not isinstance(used, bool) and used >= 0 else None)


class ChatOnlyTokenizer:
    """What the engine needs of a tokenizer for a remote policy: no chat template (the plain
    prompt format is used) and ``__call__`` giving the UTF-8 bytes of the text as ids."""

    chat_template = None
    padding_side = "left"
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}
