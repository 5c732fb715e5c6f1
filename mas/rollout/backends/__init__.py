"""Rollout backends.  ``build_backend`` picks one per policy from its config's ``backend`` field.

``hf`` (``mas.rollout.backends.hf``) is always available; ``vllm`` (``mas.rollout.backends.vllm``) is imported
only when a policy asks for it, so environments without vLLM never touch it; ``openai``
(``mas.rollout.backends.openai_compat``) sends a frozen policy's requests to a remote
OpenAI-compatible chat endpoint.
"""

from __future__ import annotations

from mas.rollout.backends.base import Backend, GenRequest, GenResult, RoutedBackend, ServedPolicy

__all__ = ["Backend", "GenRequest", "GenResult", "RoutedBackend", "build_backend"]

BACKENDS = ("hf", "vllm", "openai")


def build_backend(policies: dict[str, ServedPolicy], batch_tokens: dict[str, int | None] | None = None) -> Backend:
    """One backend serving every policy: the policy's ``backend`` ('hf' or 'vllm') picks its engine.

    ``batch_tokens``: an hf policy's ``rollout_batch_tokens`` (``mas.rollout.backends.hf``), by name.

    If all policies use one engine that engine is returned; otherwise a ``RoutedBackend``
    sends each request to the engine serving its policy.
    """
    by_backend: dict[str, dict[str, ServedPolicy]] = {}
    for name, h in policies.items():
        if h.backend not in BACKENDS:
            raise ValueError(f"policy {name!r}: unknown backend {h.backend!r}; valid: {list(BACKENDS)}")
        by_backend.setdefault(h.backend, {})[name] = h

    engines: dict[str, Backend] = {}
    if "hf" in by_backend:
        from mas.rollout.backends.hf import HFBackend

        engines["hf"] = HFBackend(by_backend["hf"], batch_tokens=batch_tokens)
    if "vllm" in by_backend:
        try:
            from mas.rollout.backends.vllm import VLLMBackend
        except ImportError as e:
            raise ImportError(
                f"policies {sorted(by_backend['vllm'])} use backend 'vllm', but mas.rollout.backends.vllm could not be "
                f"imported ({e}). Install the vLLM tier with `VLLM=1 bash scripts/setup.sh` and run "
                f"`.venv-vllm/bin/mas` (docs/vllm.md), or set backend: hf for these policies."
            ) from e
        engines["vllm"] = VLLMBackend(by_backend["vllm"])

    routes = {name: engines[kind] for kind, hs in by_backend.items() if kind in engines for name in hs}
    if "openai" in by_backend:  # one client per remote policy (each names its own server and model)
        from mas.rollout.backends.openai_compat import OpenAICompatBackend

        for name, h in by_backend["openai"].items():
            routes[name] = OpenAICompatBackend(model=h.remote_model, **h.endpoint.model_dump())
    distinct = {id(b): b for b in routes.values()}
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    return RoutedBackend(routes)
