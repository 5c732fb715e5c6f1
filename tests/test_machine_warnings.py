"""Half-precision weights on a CPU without the instructions for them: said at validate and train.

The CPU's flags are injected (``mas.models.devices.cpu_flags``), so the tests read the same on
any machine."""

from __future__ import annotations

from pathlib import Path

import torch

from mas.config import checks
from mas.config.schema import load_config
from mas.models import devices

REPO = Path(__file__).resolve().parents[1]
SMOL = REPO / "configs" / "smol_orchestrator.yaml"  # three LoRA policies, dtype auto, device auto
BF16 = [f"policies.{p}.dtype=bfloat16" for p in ("planner", "adder", "subtractor")]


def _cpu(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset({"avx2", "avx512f"} | ({"avx512_bf16"} if native else set())))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


def test_bfloat16_on_a_cpu_without_bfloat16_instructions_is_warned_per_policy(monkeypatch):
    _cpu(monkeypatch, native=False)
    warns = checks.machine_warnings(load_config(SMOL, BF16))
    assert [(path, value) for path, value, _ in warns] == [(("policies", p, "dtype"), "bfloat16")
                                                          for p in ("planner", "adder", "subtractor")]
    assert "no avx512_bf16/amx_bf16" in warns[0][2] and "dtype: auto (or float32)" in warns[0][2]


def test_no_warning_with_the_instructions_in_float32_with_auto_or_on_a_gpu(monkeypatch):
    _cpu(monkeypatch, native=True)
    assert checks.machine_warnings(load_config(SMOL, BF16)) == []
    _cpu(monkeypatch, native=False)
    f32 = [f"policies.{p}.dtype=float32" for p in ("planner", "adder", "subtractor")]
    assert checks.machine_warnings(load_config(SMOL, f32)) == []
    assert checks.machine_warnings(load_config(SMOL)) == []  # the shipped auto resolves to float32 here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device auto picks the GPU
    monkeypatch.setattr(devices, "cuda_bf16", lambda device: True)
    assert checks.machine_warnings(load_config(SMOL, BF16)) == []


def test_unreadable_flags_warn_of_nothing(monkeypatch):
    _cpu(monkeypatch, native=False)
    monkeypatch.setattr(devices, "cpu_flags", lambda: None)  # not Linux: cannot tell
    assert checks.machine_warnings(load_config(SMOL, BF16)) == []


def test_validate_prints_it_as_a_machine_warning(monkeypatch, capsys):
    from mas.cli import main

    _cpu(monkeypatch, native=False)
    assert main(["validate", "-q", str(SMOL), *BF16]) == 0
    err = capsys.readouterr().err
    assert "policies.planner.dtype: this CPU has no bfloat16 instructions" in err and "[on this machine]" in err
