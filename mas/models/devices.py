"""Which device a policy's model runs on, from its config's ``device``, and in which dtype, from its
``dtype`` (``auto``: bfloat16 where that device computes it natively, float32 elsewhere).

``resolve_dtype`` is the one place ``dtype: auto`` is decided; the loader, the memory plan, the
machine warnings, ``run_info.json`` and ``mas show`` all ask it, so they agree on what loads."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from mas.errors import ModelLoadError

# CPU flags (as Linux's /proc/cpuinfo spells them) of instructions that multiply the dtype's
# matrices natively; without them torch's CPU kernels run bfloat16 products in a generic loop
# (a linear layer at SmolLM2's width: 0.29 s against 0.023 s in float32 on an AVX2 CPU,
# docs/scaling.md)
NATIVE_CPU_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("amx_fp16",)}
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) that still let torch use the CPU's bfloat16 instructions
_ONEDNN_BF16_ISAS = {"ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX",
                     "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
                     "AVX10_2_512_AMX_2"}


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda if available, else cpu; anything else is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ModelLoadError(f"device {device!r}: {e}; valid: auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r}: CUDA is not available on this machine; use 'auto' or 'cpu'")
    return dev


class ResolvedDtype(NamedTuple):
    """A policy's weights dtype as loaded ('float32', 'bfloat16', 'float16') and why."""

    dtype: str
    reason: str


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """This CPU's feature flags as Linux reports them (the ``flags`` line of /proc/cpuinfo);
    None where there is no such file (macOS, Windows) or it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        return None
    return None


def cuda_bf16(device: torch.device) -> bool | None:
    """Whether the CUDA GPU ``device`` computes bfloat16 natively (compute capability 8.0 and up,
    not torch's emulation on older GPUs); None where this machine has no CUDA to ask."""
    if not torch.cuda.is_available():
        return None
    with torch.cuda.device(device):  # the named GPU's own answer, not the current one's
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # a torch without the keyword counts only native support
            return bool(torch.cuda.is_bf16_supported())


def cpu_native(dtype: str) -> tuple[bool | None, str]:
    """Whether torch can use this CPU's instructions for ``dtype`` ('bfloat16', 'float16')
    matrix products, and the words for why: None where the flags cannot be read."""
    wanted = NATIVE_CPU_FLAGS[dtype]
    flags = cpu_flags()
    if flags is None:
        return None, "this CPU's instruction flags cannot be read here (/proc/cpuinfo is Linux's)"
    have = [f for f in wanted if f in flags]
    if not have:
        return False, f"this CPU has no {dtype} instructions (no {'/'.join(wanted)})"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if dtype == "bfloat16" and cap and cap not in _ONEDNN_BF16_ISAS:
        return False, f"this CPU has {have[0]}, but ONEDNN_MAX_CPU_ISA={cap} keeps torch from using it"
    return True, f"this CPU has {dtype} instructions ({', '.join(have)})"


def _device_of(device: str | torch.device) -> torch.device:
    """The device a ``device`` setting names, without asking whether it is present ('auto': here)."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return resolve_device(device)
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ModelLoadError(f"device {device!r}: {e}; valid: auto, cpu, cuda, cuda:N") from None


def resolve_dtype(dtype: str, device: str | torch.device, *, full: bool = False) -> ResolvedDtype:
    """The dtype a policy's weights load in, and why.

    An explicit dtype is kept.  ``auto`` is bfloat16 where ``device`` computes it natively (a CUDA
    GPU with bfloat16, ``cuda_bf16``; a CPU with AVX512_BF16 or AMX, ``cpu_native``) and float32
    elsewhere, including where that cannot be told (no /proc/cpuinfo, an MPS device): bfloat16
    without the instructions is several times slower than float32 (docs/benchmarks/real_models.md),
    float32 with them costs twice the weights' memory.  ``full``: a policy whose weights are
    trained directly stays float32 whatever the device, since bfloat16 weights without a float32
    master copy round small updates away (the schema refuses ``kind: full`` in bfloat16).
    ``device`` may name a GPU this machine does not have (a plan for another machine): its
    bfloat16 is then assumed.
    """
    if dtype != "auto":
        return ResolvedDtype(dtype, "as configured")
    dev = _device_of(device)
    if dev.type == "cuda":
        native = cuda_bf16(dev)
        why = {True: "this GPU computes bfloat16 natively",
               False: "this GPU has no native bfloat16 (compute capability below 8.0)",
               None: "planned for a CUDA GPU with bfloat16 (compute capability 8.0 and up; one without loads float32)"}[native]
        native = native is not False
    elif dev.type == "cpu":
        native, why = cpu_native("bfloat16")
        if native is None:
            why += ", so auto stays on float32"
    else:
        native, why = False, f"auto chooses bfloat16 only on CUDA GPUs and CPUs with bfloat16 instructions, not on {dev.type}"
    if native and full:
        return ResolvedDtype("float32", f"kind: full trains its weights directly, so they stay float32 ({why}: "
                             "kind: lora or mixed_precision: bf16 would use it)")
    return ResolvedDtype("bfloat16" if native else "float32", why)
