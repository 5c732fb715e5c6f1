"""Which device a policy's model runs on, from its config's ``device``."""

from __future__ import annotations

import torch

from mas.errors import ModelLoadError


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
