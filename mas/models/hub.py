"""Hugging Face hub access that fails in seconds, with what to do, when there is no network.

Left alone, transformers retries an unreachable hub five times with back-off (about 50 s)
before it says it could not connect.  ``hub_access`` asks the hub once, with the hub
client's own metadata timeout (``HF_HUB_ETAG_TIMEOUT``, 10 s unless set), the same
request (``HEAD .../resolve/main/config.json``) that loading makes first:

- a local path or ``embedded``: nothing to ask;
- ``HF_HUB_OFFLINE=1``: the model must be in the local cache, else a ``ModelLoadError`` now;
- the hub answers (with any status): load as usual;
- the hub cannot be reached: load from the cached copy's folder if the model is in the cache,
  else a ``ModelLoadError`` that names the model and says what to do.

The answer is kept per URL, so a run that loads several policies asks once: an unreachable hub
for ``FAILURE_TTL_S`` (a notebook or a long study sees the network come back within a minute),
a reachable one for ``SUCCESS_TTL_S`` (a hub that goes away then fails at loading, as it would
without this check).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from mas.errors import ModelLoadError

FAILURE_TTL_S = 30.0  # how long "unreachable" is believed
SUCCESS_TTL_S = 600.0  # how long "it answered" is believed
WHAT_TO_DO = ("give a local path in policies.<name>.model, or download it where there is network "
              "(`hf download {model}`) and set HF_HUB_OFFLINE=1 to use that cache")


def is_local(model: str) -> bool:
    """A model string that names a directory (or looks like a path) rather than a hub id."""
    return model == "embedded" or model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def in_cache(model: str) -> bool:
    """True if the hub model's config.json is in the local cache (HF_HOME / HF_HUB_CACHE)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def cached_folder(model: str) -> str:
    """The local snapshot folder of a cached hub model (its files as from_pretrained reads them)."""
    from huggingface_hub import snapshot_download

    return snapshot_download(model, local_files_only=True)


def _head(url: str, timeout: float) -> str | None:
    """Why ``url`` cannot be reached (None if it answered with any HTTP status); one try."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(url, timeout=timeout)
    except Exception as e:  # connection refused, DNS, timeout, TLS: anything short of an answer
        return f"{type(e).__name__}: {e}"
    return None


class Reachability:
    """``check(url, timeout)``'s answers, each kept for a while: a failure for ``failure_ttl``
    seconds, an answer for ``success_ttl`` seconds, by ``clock`` (monotonic seconds)."""

    def __init__(self, check: Callable[[str, float], str | None] = _head, clock: Callable[[], float] = time.monotonic,
                 failure_ttl: float = FAILURE_TTL_S, success_ttl: float = SUCCESS_TTL_S):
        self.check, self.clock = check, clock
        self.failure_ttl, self.success_ttl = failure_ttl, success_ttl
        self._answers: dict[tuple[str, float], tuple[float, str | None]] = {}  # -> (expiry, why)
        self._lock = threading.Lock()  # policies may load on several threads

    def __call__(self, url: str, timeout: float) -> str | None:
        """Why ``url`` cannot be reached (None if it answered), asked again once the kept answer expired."""
        key = (url, timeout)
        with self._lock:
            kept = self._answers.get(key)
            if kept is not None and self.clock() < kept[0]:
                return kept[1]
            why = self.check(url, timeout)
            self._answers[key] = (self.clock() + (self.success_ttl if why is None else self.failure_ttl), why)
            return why


_unreachable = Reachability()


def hub_access(model: str, local_only: bool = False) -> str:
    """What to load ``model`` from now: ``model`` itself, or the folder of its cached copy when
    the hub must not or cannot be asked (so no library downstream tries the network).

    Raises ``ModelLoadError`` at once when a hub model can be neither downloaded nor found in
    the cache.  ``local_only``: the caller never downloads (``mas validate``).
    """
    from huggingface_hub import constants

    if is_local(model):
        return model
    offline = constants.is_offline_mode()
    if offline or local_only:
        if in_cache(model):
            return cached_folder(model)
        why = "HF_HUB_OFFLINE is set" if offline else "only the local cache was searched"
        raise ModelLoadError(f"model {model!r} is not in the local Hugging Face cache ({why}; cache: "
                             f"{constants.HF_HUB_CACHE}): " + WHAT_TO_DO.format(model=model))
    url = f"{constants.ENDPOINT}/{model}/resolve/main/config.json"
    why = _unreachable(url, float(constants.HF_HUB_ETAG_TIMEOUT))
    if why is None:
        return model
    if in_cache(model):
        return cached_folder(model)
    raise ModelLoadError(
        f"model {model!r}: the Hugging Face hub ({constants.ENDPOINT}) cannot be reached ({why}) and the model is "
        f"not in the local cache ({constants.HF_HUB_CACHE}): " + WHAT_TO_DO.format(model=model)
    )


class HubUnreachable(OSError):
    """The hub cannot be reached for an upload; the message says why and what to do."""


def require_hub(what: str) -> None:
    """Fail at once, saying why, if ``what`` (an upload) cannot reach the hub."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise HubUnreachable(f"{what}: HF_HUB_OFFLINE is set; unset it (and TRANSFORMERS_OFFLINE) to upload")
    why = _unreachable(constants.ENDPOINT, float(constants.HF_HUB_ETAG_TIMEOUT))
    if why is not None:
        raise HubUnreachable(f"{what}: the Hugging Face hub ({constants.ENDPOINT}) cannot be reached ({why})")
