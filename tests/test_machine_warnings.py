"""Half-precision weights on a CPU without the instructions for them: said at validate and train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mas.config import checks
from mas.config.schema import load_config

REPO = Path(__file__).resolve().parents[1]
SMOL = REPO / "configs" / "smol_orchestrator.yaml"  # three bfloat16 LoRA policies, device auto


def _cpu(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(checks, "_cpu_has_native", lambda dtype: native)


def test_bfloat16_on_a_cpu_without_bfloat16_instructions_is_warned_per_policy(monkeypatch):
    _cpu(monkeypatch, native=False)
    warns = checks.machine_warnings(load_config(SMOL))
    assert [(path, value) for path, value, _ in warns] == [(("policies", p, "dtype"), "bfloat16")
                                                          for p in ("planner", "adder", "subtractor")]
    assert "dtype: float32" in warns[0][2]


def test_no_warning_with_the_instructions_in_float32_or_on_a_gpu(monkeypatch):
    _cpu(monkeypatch, native=True)
    assert checks.machine_warnings(load_config(SMOL)) == []
    _cpu(monkeypatch, native=False)
    f32 = [f"policies.{p}.dtype=float32" for p in ("planner", "adder", "subtractor")]
    assert checks.machine_warnings(load_config(SMOL, f32)) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device auto picks the GPU
    assert checks.machine_warnings(load_config(SMOL)) == []


@pytest.mark.parametrize("flags, native", [("fpu avx2 avx512f", False), ("fpu avx512f avx512_bf16", True),
                                           ("fpu amx_bf16 amx_tile", True)])
def test_without_torch_probes_the_cpu_flags_decide(monkeypatch, tmp_path, flags, native):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    real = checks.Path
    monkeypatch.setattr(checks, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo" else real(p))
    assert checks._cpu_has_native("bfloat16") is native


def test_validate_prints_it_as_a_machine_warning(monkeypatch, capsys):
    from mas.cli import main

    _cpu(monkeypatch, native=False)
    assert main(["validate", "-q", str(SMOL)]) == 0
    err = capsys.readouterr().err
    assert "policies.planner.dtype: this CPU has no bfloat16 instructions" in err and "[on this machine]" in err
