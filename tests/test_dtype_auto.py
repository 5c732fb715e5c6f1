"""``dtype: auto``: bfloat16 where the device computes it natively, float32 elsewhere, decided in
one place (``mas.models.devices.resolve_dtype``) and read the same by the loader, the memory plan,
``mas show`` and ``run_info.json``.

The machine is injected: the CPU's flags (``devices.cpu_flags``) and CUDA's answer
(``devices.cuda_bf16``, ``torch.cuda``), so every test reads the same on any machine."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import yaml
from team_helpers import team_config

from mas.agents.policy import build_policies, policy_dtype
from mas.config.schema import PolicyConfig, load_config, validate_config
from mas.learning.memory_plan import _gib, plan_run, render
from mas.models import devices
from mas.models.devices import cpu_flags, cuda_bf16, resolve_dtype

REPO = Path(__file__).resolve().parents[1]
NO_BF16 = frozenset({"fpu", "sse4_2", "avx2", "fma"})  # an AVX2 laptop
AVX512_BF16 = NO_BF16 | {"avx512f", "avx512_bf16"}
AMX = NO_BF16 | {"amx_tile", "amx_bf16"}


@pytest.fixture()
def cpu(monkeypatch):
    """Set this 'machine': its CPU flags (a frozenset, or None where they cannot be read), no CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    def set_flags(flags):
        monkeypatch.setattr(devices, "cpu_flags", lambda: flags)

    return set_flags


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize("flags, want", [
    (NO_BF16, "float32"),
    (NO_BF16 | {"avx512f", "avx512_vnni"}, "float32"),  # AVX-512 without its bfloat16 extension
    (AVX512_BF16, "bfloat16"),
    (AMX, "bfloat16"),
    (None, "float32"),  # not Linux, or unreadable: the safe side
])
def test_auto_on_a_cpu_follows_its_bfloat16_instructions(cpu, flags, want):
    cpu(flags)
    for device in ("cpu", "auto"):  # auto is the CPU here: no CUDA
        assert resolve_dtype("auto", device).dtype == want


def test_the_reason_says_what_was_found(cpu):
    cpu(NO_BF16)
    assert resolve_dtype("auto", "cpu") == ("float32", "this CPU has no bfloat16 instructions (no avx512_bf16/amx_bf16)")
    cpu(AMX)
    assert resolve_dtype("auto", "cpu") == ("bfloat16", "this CPU has bfloat16 instructions (amx_bf16)")
    cpu(None)
    assert "cannot be read" in resolve_dtype("auto", "cpu").reason and "float32" in resolve_dtype("auto", "cpu").reason


def test_a_onednn_isa_cap_below_bfloat16_counts_as_no_instructions(cpu, monkeypatch):
    cpu(AVX512_BF16)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert resolve_dtype("auto", "cpu") == ("float32", "this CPU has avx512_bf16, but ONEDNN_MAX_CPU_ISA=AVX2 keeps torch from using it")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert resolve_dtype("auto", "cpu").dtype == "bfloat16"


@pytest.mark.parametrize("native, want", [(True, "bfloat16"), (False, "float32")])
def test_auto_on_a_gpu_follows_cuda(cpu, monkeypatch, native, want):
    cpu(NO_BF16)  # the host CPU does not matter for a GPU policy
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "cuda_bf16", lambda device: native)
    for device in ("cuda", "cuda:1", "auto"):
        assert resolve_dtype("auto", device).dtype == want


def test_cuda_is_asked_for_native_bfloat16_not_emulation(monkeypatch):
    asked = []

    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # a pre-Ampere GPU: emulated only

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert cuda_bf16(torch.device("cuda", 0)) is False and asked == [False]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_bf16(torch.device("cuda", 0)) is None  # no CUDA here to ask


def test_a_gpu_this_machine_lacks_is_planned_in_bfloat16(cpu):
    cpu(NO_BF16)
    choice = resolve_dtype("auto", "cuda")
    assert choice.dtype == "bfloat16" and "planned for a CUDA GPU" in choice.reason


def test_other_devices_and_explicit_dtypes(cpu):
    cpu(AVX512_BF16)
    assert resolve_dtype("auto", "mps").dtype == "float32"
    for dtype in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(dtype, "cpu") == (dtype, "as configured")


def test_full_fine_tuning_stays_float32_where_bfloat16_is_native(cpu):
    cpu(AMX)
    choice = resolve_dtype("auto", "cpu", full=True)
    assert choice.dtype == "float32" and "kind: full" in choice.reason
    assert policy_dtype(PolicyConfig(kind="full", model="embedded", dtype="auto", device="cpu")) == "float32"
    assert policy_dtype(PolicyConfig(kind="lora", model="embedded", dtype="auto", device="cpu")) == "bfloat16"
    assert policy_dtype(PolicyConfig(kind="frozen", model="embedded", dtype="auto", device="cpu")) == "bfloat16"


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "absent")) is None


# ------------------------------------------------------------------ what loads


def _policies(model_dir, kind="lora"):
    return {"p": PolicyConfig(kind=kind, model=str(model_dir), dtype="auto", device="cpu")}


def test_a_config_with_auto_loads_float32_on_a_cpu_without_bfloat16(cpu, tiny_model_dir):
    cpu(NO_BF16)
    handle = build_policies(_policies(tiny_model_dir))["p"]
    base = [p for n, p in handle.model.named_parameters() if "lora_" not in n]
    assert base and {p.dtype for p in base} == {torch.float32}


def test_a_config_with_auto_loads_bfloat16_where_the_cpu_has_it(cpu, tiny_model_dir):
    cpu(AVX512_BF16)
    handle = build_policies(_policies(tiny_model_dir))["p"]
    named = dict(handle.model.named_parameters())
    assert {p.dtype for n, p in named.items() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for n, p in named.items() if "lora_" in n} == {torch.float32}  # the adapter stays float32
    full = build_policies(_policies(tiny_model_dir, kind="full"))["p"]
    assert {p.dtype for p in full.model.parameters()} == {torch.float32}


def test_on_this_machine_the_loaded_dtype_is_the_resolved_one(tiny_model_dir):
    handle = build_policies(_policies(tiny_model_dir, kind="frozen"))["p"]
    assert next(handle.model.parameters()).dtype == getattr(torch, resolve_dtype("auto", "cpu").dtype)


# ------------------------------------------------------------------ the readers


def _auto_config(model_dir):
    data = team_config(model_dir, "chain")
    data["policies"] = {
        "main": {"kind": "lora", "model": str(model_dir), "dtype": "auto", "device": "cpu"},
        "judge": {"kind": "lora", "model": str(model_dir), "dtype": "auto", "device": "cpu"},
    }
    return validate_config(data)


def test_the_plan_prints_the_choice_why_and_its_memory(cpu, tiny_model_dir):
    cpu(NO_BF16)
    cfg = _auto_config(tiny_model_dir)
    (plan,) = plan_run(cfg)
    (family,) = plan.policies  # auto on both: one resolved dtype, one shared base
    assert family.dtype == "float32" and family.alternative[0] == "bfloat16"
    assert family.alternative[1] < family.weights  # bfloat16 weights would hold less
    text = render([plan], cfg)
    assert "dtype auto -> float32: this CPU has no bfloat16 instructions (no avx512_bf16/amx_bf16); weights " in text
    assert f"(bfloat16: weights {_gib(family.alternative[1])}, peak {_gib(family.alternative[2])})" in text
    cpu(AMX)
    (plan,) = plan_run(cfg)
    assert plan.policies[0].dtype == "bfloat16" and plan.policies[0].alternative[0] == "float32"
    assert "dtype auto -> bfloat16: this CPU has bfloat16 instructions (amx_bf16)" in render([plan], cfg)


def test_the_plan_weights_are_in_the_resolved_dtype(cpu, tiny_model_dir):
    cfg = _auto_config(tiny_model_dir)
    cpu(NO_BF16)
    f32 = plan_run(cfg)[0].policies[0]
    cpu(AVX512_BF16)
    bf16 = plan_run(cfg)[0].policies[0]
    base = f32.parameters - f32.trainable  # the adapters are the trainable parameters, in float32 on both
    assert f32.weights == 4 * base + 4 * f32.trainable and bf16.weights == 2 * base + 4 * bf16.trainable


def test_validate_plan_prints_the_dtype_line(cpu, tiny_model_dir, tmp_path, capsys):
    from mas.cli import main

    cpu(NO_BF16)
    path = tmp_path / "team.yaml"
    data = team_config(tiny_model_dir, "chain")
    data["policies"]["judge"]["dtype"] = "auto"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", str(path), "-q", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "dtype float32 (as configured)" in out  # main: float32 by default
    assert "dtype auto -> float32: this CPU has no bfloat16 instructions" in out and "(bfloat16: weights " in out


def test_show_names_the_resolved_dtype(cpu):
    from mas.show import team_text

    cpu(NO_BF16)
    text = team_text(load_config(REPO / "configs" / "smol_orchestrator.yaml"))
    assert "smollm2-135m-instruct  auto -> float32 on auto" in text


# ------------------------------------------------------------------ the shipped configs


def test_every_shipped_real_model_config_says_auto():
    """Every policy that loads a real model (not the embedded one, not a remote endpoint) in every
    shipped config takes dtype auto, so a CPU without bfloat16 instructions runs it in float32."""
    real = {}
    for path in sorted((REPO / "configs").glob("*.yaml")):
        for name, p in (yaml.safe_load(path.read_text()).get("policies") or {}).items():
            if p.get("model") != "embedded" and p.get("backend") != "openai":
                real[f"{path.name}:{name}"] = p.get("dtype")
    assert len({k.split(":")[0] for k in real}) >= 10  # the smol, gsm8k and hotpotqa configs
    assert {k: v for k, v in real.items() if v != "auto"} == {}


def test_run_info_records_the_dtype_that_loaded(cpu, tiny_model_dir):
    from mas.training.team import build_team, describe_team

    cpu(NO_BF16)
    data = team_config(tiny_model_dir, "chain")
    data["policies"]["judge"]["dtype"] = "auto"
    team = build_team(validate_config(data))
    try:
        policies = describe_team(team)["policies"]
    finally:
        team.close()
    assert policies["judge"]["dtype"] == "float32" and policies["main"]["dtype"] == "float32"


def test_old_logprobs_follow_the_resolved_dtype(cpu):
    from mas.runtime.base import old_logprobs_of

    policy = PolicyConfig(kind="lora", model="embedded", dtype="auto", device="cpu")
    cpu(NO_BF16)
    assert old_logprobs_of("auto", policy) == "rollout"  # float32 sampling is the learner's own
    cpu(AVX512_BF16)
    assert old_logprobs_of("auto", policy) == "learner"  # a bfloat16 rollout is not
