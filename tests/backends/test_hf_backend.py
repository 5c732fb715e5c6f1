"""The hf backend: one generate call per group, left padding, order, logprobs, stops, LoRA, sync."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mas.agents.policy import PolicyHandle
from mas.agents.prompts import render_prompt
from mas.rollout.backends import build_backend
from mas.rollout.backends.base import GenRequest, GenResult, RoutedBackend
from mas.rollout.backends.hf import HFBackend

MESSAGES = [
    [{"role": "user", "content": "3+4"}],
    [{"role": "system", "content": "You are a solver."}, {"role": "user", "content": "how many eggs? The answer is"}],
    [{"role": "user", "content": "debate round"}],
]


def prompts(tok):
    out = [render_prompt(tok, m) for m in MESSAGES]
    assert len({len(p) for p in out}) == len(out)  # distinct lengths, so padding matters
    return out


def spy_generate(model, monkeypatch):
    """Count generate calls on ``model`` and keep their inputs."""
    calls = []
    real = model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    return calls


def recompute(model, prompt, completion, temperature):
    """Slow reference: log_softmax(logits / T) of a plain unpadded forward over prompt + completion."""
    ids = torch.tensor([prompt + completion], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().cpu()  # [L, V]
    T = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / T, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1), logits


def req(policy, prompt, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=10):
    return GenRequest(policy, prompt, temperature, top_p, top_k, max_new_tokens)


def test_one_generate_call_left_padded_results_in_order(full_handle, monkeypatch):
    tok = full_handle.tokenizer
    backend = HFBackend({"solver": full_handle})
    calls = spy_generate(full_handle.model, monkeypatch)
    ps = prompts(tok)
    max_new = [3, 10, 6]
    torch.manual_seed(0)
    results = backend.generate_batch([req("solver", p, max_new_tokens=m) for p, m in zip(ps, max_new)])
    assert len(calls) == 1
    input_ids, mask = calls[0]["input_ids"], calls[0]["attention_mask"]
    assert calls[0]["max_new_tokens"] == 10  # the group's max
    P = max(len(p) for p in ps)
    for i, p in enumerate(ps):
        pad = P - len(p)
        assert input_ids[i, pad:].tolist() == p  # right-aligned prompt
        assert (input_ids[i, :pad] == tok.pad_token_id).all()
        assert mask[i, :pad].sum() == 0 and mask[i, pad:].all()
    for r, p, m in zip(results, ps, max_new):
        assert 1 <= len(r.completion_ids) <= m  # each row cut to its own limit
        assert len(r.logprobs) == len(r.completion_ids)
        # result i belongs to prompt i: its logprobs are those of prompt i's continuation
        torch.testing.assert_close(torch.tensor(r.logprobs), recompute(full_handle.model, p, r.completion_ids, 1.0)[0], atol=1e-4, rtol=0)
    assert backend.stats.generate_calls == 1 and backend.stats.requests == 3
    assert backend.stats.completion_tokens == sum(len(r.completion_ids) for r in results)


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.7, 0.9, 20)])
def test_logprobs_equal_forward_pass_recompute(full_handle, temperature, top_p, top_k):
    backend = HFBackend({"solver": full_handle})
    ps = prompts(full_handle.tokenizer)
    torch.manual_seed(1)
    results = backend.generate_batch([req("solver", p, temperature, top_p, top_k, 12) for p in ps * 2])
    for r, p in zip(results, ps * 2):
        expected, _ = recompute(full_handle.model, p, r.completion_ids, temperature)
        # temperature-scaled, untruncated: top-p/top-k are not reflected in the logprobs
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)


def test_temperature_changes_logprobs(full_handle):
    """Guards the test above: logprobs at T=0.7 are not the T=1 ones."""
    backend = HFBackend({"solver": full_handle})
    p = prompts(full_handle.tokenizer)[0]
    (r,) = backend.generate_batch([req("solver", p, 0.7, max_new_tokens=5)])
    at_t1, _ = recompute(full_handle.model, p, r.completion_ids, 1.0)
    assert not torch.allclose(torch.tensor(r.logprobs), at_t1, atol=1e-3)


def test_logits_budget_splits_a_group_into_chunks_in_request_order(full_handle, monkeypatch):
    """A group whose kept logits (rows x max_new_tokens x V x 4 bytes) exceed the budget is cut into
    consecutive chunks of rows, one generate call each; greedy results equal the unsplit call."""
    ps = prompts(full_handle.tokenizer)
    requests = [req("solver", p, 0.0, max_new_tokens=m) for p, m in zip(ps * 3, [12, 5, 9, 12, 3, 7, 10, 12, 1])]
    V = full_handle.model.get_output_embeddings().weight.shape[0]

    whole = HFBackend({"solver": full_handle})
    calls = spy_generate(full_handle.model, monkeypatch)
    expected = whole.generate_batch(requests)
    assert len(calls) == 1 and whole.stats.generate_calls == 1  # the default budget: one call per group
    assert whole.rows_per_call("solver", 12) >= len(requests)

    budget = 2 * 12 * V * 4 + 1  # two rows of the group's 12 new tokens fit, three do not
    split = HFBackend({"solver": full_handle}, logits_budget_bytes=budget)
    assert split.rows_per_call("solver", 12) == 2
    calls.clear()
    results = split.generate_batch(requests)
    assert len(calls) == 5 and split.stats.generate_calls == 5  # ceil(9 / 2)
    assert [c["input_ids"].shape[0] for c in calls] == [2, 2, 2, 2, 1]
    # consecutive chunks: call k sees requests 2k and 2k+1, right-aligned
    for k, c in enumerate(calls):
        for row, q in zip(c["input_ids"], requests[2 * k : 2 * k + 2]):
            assert row[row.shape[0] - len(q.prompt_ids) :].tolist() == q.prompt_ids
    for r, e, q in zip(results, expected, requests):
        assert r.completion_ids == e.completion_ids and r.finish_reason == e.finish_reason and r.text == e.text
        assert len(r.completion_ids) == q.max_new_tokens
        torch.testing.assert_close(torch.tensor(r.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0)
    assert split.stats.requests == whole.stats.requests == len(requests)
    assert split.stats.completion_tokens == whole.stats.completion_tokens

    # a budget below one row still runs, one request per call
    tiny = HFBackend({"solver": full_handle}, logits_budget_bytes=1)
    calls.clear()
    assert [r.completion_ids for r in tiny.generate_batch(requests[:3])] == [e.completion_ids for e in expected[:3]]
    assert len(calls) == 3
    with pytest.raises(ValueError, match="logits_budget_bytes"):
        HFBackend({"solver": full_handle}, logits_budget_bytes=0)


def test_batch_tokens_bound_rows_times_the_longest_prompt(full_handle, monkeypatch):
    """A policy's rollout_batch_tokens cuts a group so that rows x its longest prompt stays within
    it (the prefill's activations grow with both); greedy results equal the unsplit call's."""
    ps = prompts(full_handle.tokenizer)
    requests = [req("solver", p, 0.0, max_new_tokens=6) for p in ps * 3]
    P = max(len(q.prompt_ids) for q in requests)
    calls = spy_generate(full_handle.model, monkeypatch)
    expected = HFBackend({"solver": full_handle}).generate_batch(requests)
    assert len(calls) == 1

    bounded = HFBackend({"solver": full_handle}, batch_tokens={"solver": 4 * P + 1})  # 4 rows of P fit, 5 do not
    assert bounded.rows_per_call("solver", 6, P) == 4
    calls.clear()
    results = bounded.generate_batch(requests)
    n = len(requests)
    assert n > 4 and [c["input_ids"].shape[0] for c in calls] == [min(4, n - i) for i in range(0, n, 4)]
    for r, e in zip(results, expected):
        assert r.completion_ids == e.completion_ids
        torch.testing.assert_close(torch.tensor(r.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0)
    # a bound below one prompt still runs, one request per call; none leaves the logits budget alone
    assert HFBackend({"solver": full_handle}, batch_tokens={"solver": 1}).rows_per_call("solver", 6, P) == 1
    assert HFBackend({"solver": full_handle}, batch_tokens={"solver": None}).rows_per_call("solver", 6, P) >= len(requests)


def test_every_group_is_cut_so_that_one_calls_memory_stays_within_the_call_budget(full_handle, monkeypatch):
    """Without a rollout_batch_tokens, a group's calls are cut so that generate_bytes (the prefill's
    prompt tokens, or the decode's KV cache and kept logits) stays within the call budget, greedy
    and sampled groups alike; the cut changes no greedy token, and a sampled cut is reproducible."""
    from mas.rollout.backends.hf import default_call_budget, generate_bytes, kv_cache_bytes, prompt_token_bytes

    model = full_handle.model
    cfg = model.config
    kv = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    per_token = prompt_token_bytes(model)
    assert per_token == 4 * (2 * cfg.num_hidden_layers * kv + 8 * cfg.hidden_size + 6 * cfg.intermediate_size)  # float32
    assert kv_cache_bytes(model, 10) == 2 * cfg.num_hidden_layers * kv * 10 * 4
    V = model.get_output_embeddings().weight.shape[0]
    # by hand: 3 rows of 7 prompt tokens and 5 new ones, the larger of prefill and decode
    assert generate_bytes(model, 3, 7, 5) == max(3 * 7 * per_token, kv_cache_bytes(model, 3 * 12) + 3 * 5 * V * 4)
    default = HFBackend({"solver": full_handle})
    assert default.call_budgets == {"solver": default_call_budget(torch.device("cpu"))} and default_call_budget(torch.device("cpu")) == 1024**3

    ps = prompts(full_handle.tokenizer)
    greedy = [req("solver", p, 0.0, max_new_tokens=6) for p in ps * 3]
    P = max(len(q.prompt_ids) for q in greedy)
    calls = spy_generate(model, monkeypatch)
    expected = HFBackend({"solver": full_handle}, call_budget_bytes=10**15).generate_batch(greedy)
    assert len(calls) == 1

    row = generate_bytes(model, 1, P, 6)
    bounded = HFBackend({"solver": full_handle}, call_budget_bytes=4 * row + 1)  # 4 rows fit, 5 do not
    assert bounded.rows_per_call("solver", 6, P) == 4
    assert generate_bytes(model, 4, P, 6) <= 4 * row + 1 < generate_bytes(model, 5, P, 6)
    calls.clear()
    results = bounded.generate_batch(greedy)
    assert [c["input_ids"].shape[0] for c in calls] == [4, 4, 1]
    assert [r.completion_ids for r in results] == [e.completion_ids for e in expected]

    sampled = [req("solver", p, 1.0, max_new_tokens=6) for p in ps * 3]
    calls.clear()
    first = bounded.generate_batch(sampled, seed=0)
    assert [c["input_ids"].shape[0] for c in calls] == [4, 4, 1]  # sampled groups are cut too
    again = HFBackend({"solver": full_handle}, call_budget_bytes=4 * row + 1).generate_batch(sampled, seed=0)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in first]  # the same cut, the same draws
    # a policy's own rollout_batch_tokens cuts further, for greedy and sampled groups alike
    own = HFBackend({"solver": full_handle}, batch_tokens={"solver": 2 * P}, call_budget_bytes=4 * row + 1)
    assert own.rows_per_call("solver", 6, P) == 2
    assert HFBackend({"solver": full_handle}, call_budget_bytes=1).rows_per_call("solver", 6, P) == 1  # at least one row
    with pytest.raises(ValueError, match="call_budget_bytes"):
        HFBackend({"solver": full_handle}, call_budget_bytes=0)


def test_a_generate_batch_hands_the_heap_its_calls_freed_back(full_handle, monkeypatch):
    """After its calls, generate_batch returns the freed heap to the system (malloc_trim), so the
    update after a rollout does not grow on top of it."""
    import mas.rollout.backends.hf as hf

    trims = []
    monkeypatch.setattr(hf, "release_freed_memory", lambda: trims.append(1) or True)
    HFBackend({"solver": full_handle}).generate_batch([req("solver", p, 0.0, max_new_tokens=3) for p in prompts(full_handle.tokenizer)])
    assert trims == [1]


HEAD_MEMORY = """
import contextlib, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
import mas.rollout.backends.hf as hf
from mas.agents.policy import PolicyHandle
from mas.rollout.backends.base import GenRequest
from mas.process.memory import peak_rss_mb
from mas.models.tiny import train_tokenizer

torch.set_num_threads(1)
if sys.argv[1] == "without":
    hf._contiguous_head_input = lambda model, device: contextlib.nullcontext()
tok = train_tokenizer(["hello world 1 2 3"], vocab_size=300)
cfg = Qwen2Config(vocab_size=16384, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=4, tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval().requires_grad_(False)  # a frozen bfloat16 model
backend = hf.HFBackend({"p": PolicyHandle("p", "frozen", model, tok, "cpu")})
before = peak_rss_mb()
backend.generate_batch([GenRequest("p", [5 + i % 7] * 12, 0.0, 1.0, 0, 2) for i in range(64)])
print(peak_rss_mb() - before)
"""


def test_a_reduced_precision_head_is_not_expanded_once_per_row_on_cpu():
    """generate scores the prompt's last position through a [B, 1, H] view; torch's CPU linear on
    it with a bfloat16 weight that needs no gradient expands the weight per row (B x V x H x 2
    bytes: 512 MB here, 8 GB for 150 SmolLM2 rows).  Measured in fresh processes."""
    import subprocess
    import sys

    grown = {}
    for variant in ("with", "without"):
        done = subprocess.run([sys.executable, "-c", HEAD_MEMORY, variant], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        grown[variant] = float(done.stdout.split()[-1])
    # with: the KV cache, kept logits and temporaries, a few MB.  without (the control): where this
    # torch's CPU kernel expands the weight, up to 512 MB, of which the pages it touches count (236 to
    # 512 MB measured on Intel machines); on others (seen on an AMD EPYC: 1.8 MB) the kernel takes
    # another path and there is nothing to guard, so only the bound of the fixed path is asserted
    bound = 128
    assert grown["with"] < bound, grown
    if grown["without"] < bound:
        pytest.skip(f"this CPU's torch does not expand the weight per row (control grew {grown['without']:.1f} MB)")
    assert bound < grown["without"], grown


def test_the_contiguous_head_input_changes_no_bit_of_a_bfloat16_generation(monkeypatch):
    import contextlib

    import mas.rollout.backends.hf as hf
    from mas.models.tiny import tiny_causal_lm, train_tokenizer

    tok = train_tokenizer(["3+4 is 7, and 12-5 is 7; the answer is 7."], vocab_size=300)
    model = tiny_causal_lm(tok, seed=3).to(torch.bfloat16).eval().requires_grad_(False)
    handle = PolicyHandle("p", "frozen", model, tok, "cpu")
    requests = [req("p", p, 0.0, max_new_tokens=8) for p in prompts(tok) * 4] + [req("p", p, 1.0) for p in prompts(tok)]
    seen = []
    head = model.get_output_embeddings()
    head.register_forward_hook(lambda module, args, out: seen.append(args[0].is_contiguous()))  # what forward got
    got = HFBackend({"p": handle}).generate_batch(requests, seed=0)
    assert seen and all(seen)  # the prefill's last-position view reaches the head as a copy
    monkeypatch.setattr(hf, "_contiguous_head_input", lambda model, device: contextlib.nullcontext())
    seen.clear()
    plain = HFBackend({"p": handle}).generate_batch(requests, seed=0)
    assert not all(seen)  # the control: without it the view is not contiguous
    assert [(r.completion_ids, r.logprobs) for r in got] == [(r.completion_ids, r.logprobs) for r in plain]


def test_logprobs_are_read_step_by_step_without_stacking_the_logits(full_handle, monkeypatch):
    """No [B, S, V] tensor is built from generate's per-step logits (only [B, S] floats are kept)."""
    ps = prompts(full_handle.tokenizer)
    stacked = []
    real_stack = torch.stack

    def spy_stack(tensors, *args, **kwargs):
        out = real_stack(tensors, *args, **kwargs)
        stacked.append(tuple(out.shape))
        return out

    monkeypatch.setattr(torch, "stack", spy_stack)
    V = full_handle.model.get_output_embeddings().weight.shape[0]
    for temperature in (0.0, 0.7):
        results = HFBackend({"solver": full_handle}).generate_batch([req("solver", p, temperature, max_new_tokens=8) for p in ps])
        for r, p in zip(results, ps):
            torch.testing.assert_close(torch.tensor(r.logprobs), recompute(full_handle.model, p, r.completion_ids, temperature)[0], atol=1e-4, rtol=0)
    assert not [s for s in stacked if len(s) == 3 and s[-1] == V]


def test_greedy_is_argmax_and_ignores_checkpoint_sampling_defaults(full_handle):
    model = full_handle.model
    backend = HFBackend({"solver": full_handle})
    ps = prompts(full_handle.tokenizer)
    # a checkpoint's generation defaults must not leak into sampling (they would bias the logprobs)
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    results = backend.generate_batch([req("solver", p, temperature=0.0, max_new_tokens=15) for p in ps])
    assert model.generation_config.repetition_penalty == 5.0  # restored after the call
    repeats = 0
    for r, p in zip(results, ps):
        expected, logits = recompute(model, p, r.completion_ids, 0.0)
        assert r.completion_ids == logits.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)
        repeats += len(r.completion_ids) - len(set(r.completion_ids))
    assert repeats > 0  # the tiny model repeats tokens greedily; no_repeat_ngram_size=1 would forbid that


def first_new_token(ids):
    """A step k >= 2 whose token was not produced before (so making it a stop id stops there)."""
    return next((i for i in range(2, len(ids)) if ids[i] not in ids[:i]), None)


def test_completion_cut_at_first_stop_id(full_handle):
    model, tok = full_handle.model, full_handle.tokenizer
    ps = prompts(tok)
    free = HFBackend({"solver": full_handle}).generate_batch([req("solver", p, 0.0, max_new_tokens=20) for p in ps])
    assert all(r.finish_reason == "length" and len(r.completion_ids) == 20 for r in free)
    j = next(j for j, r in enumerate(free) if first_new_token(r.completion_ids) is not None)
    ids, k = free[j].completion_ids, first_new_token(free[j].completion_ids)
    others = [i for i in range(len(ps)) if ids[k] not in free[i].completion_ids]
    assert others  # a row that keeps going, so the batch runs past step k

    model.generation_config.eos_token_id = [tok.eos_token_id, ids[k]]  # make that token a stop id
    backend = HFBackend({"solver": full_handle})
    stop, short, other = backend.generate_batch(
        [req("solver", ps[j], 0.0, max_new_tokens=20), req("solver", ps[j], 0.0, max_new_tokens=k), req("solver", ps[others[0]], 0.0, max_new_tokens=20)]
    )
    assert stop.completion_ids == ids[: k + 1]  # cut after the stop id, which is kept
    assert stop.finish_reason == "stop"
    assert stop.logprobs == pytest.approx(free[j].logprobs[: k + 1], abs=1e-4)
    assert stop.text == tok.decode(ids[:k], skip_special_tokens=True)
    assert short.completion_ids == ids[:k] and short.finish_reason == "length"  # own limit hit before the stop
    assert len(other.completion_ids) == 20 and other.finish_reason == "length"


def test_groups_by_policy_and_sampling_params(full_handle, tiny_model_dir_b, monkeypatch):
    from mas.agents.policy import load_model_and_tokenizer

    model_b, tok_b = load_model_and_tokenizer(str(tiny_model_dir_b), "float32", "cpu", False)
    other = PolicyHandle("critic", "frozen", model_b, tok_b, "cpu")
    backend = build_backend({"solver": full_handle, "critic": other})
    assert isinstance(backend, HFBackend)
    calls_a = spy_generate(full_handle.model, monkeypatch)
    calls_b = spy_generate(model_b, monkeypatch)
    pa, pb = prompts(full_handle.tokenizer), prompts(tok_b)
    requests = [
        req("solver", pa[0], 0.0),
        req("critic", pb[0], 1.0),
        req("solver", pa[1], 1.0),
        req("solver", pa[2], 0.0),
        req("critic", pb[1], 1.0),
        req("solver", pa[0], 1.0, top_k=5),
    ]
    results = backend.generate_batch(requests)
    assert len(calls_a) == 3 and len(calls_b) == 1  # solver: greedy, T=1, T=1/top_k=5; critic: one group
    for r, q in zip(results, requests):
        model = full_handle.model if q.policy == "solver" else model_b
        expected, logits = recompute(model, q.prompt_ids, r.completion_ids, q.temperature)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)
        if q.temperature == 0:
            assert r.completion_ids == logits.argmax(-1)[: len(r.completion_ids)].tolist()


def test_lora_generation_uses_the_requests_adapter(lora_handles, monkeypatch):
    alpha, beta = lora_handles["alpha"], lora_handles["beta"]
    with torch.no_grad():
        for p in alpha.trainable_parameters():
            p.normal_(0, 0.5)  # make alpha's adapter far from the base
    backend = build_backend(lora_handles)
    calls = spy_generate(alpha.model, monkeypatch)
    ps = prompts(alpha.tokenizer)
    requests = [req("alpha", p, 0.0) for p in ps] + [req("beta", p, 0.0) for p in ps]
    results = backend.generate_batch(requests)
    assert len(calls) == 2
    for r, q in zip(results, requests):
        h = lora_handles[q.policy]
        with h.activate():
            expected, logits = recompute(h.model, q.prompt_ids, r.completion_ids, 1.0)
        assert r.completion_ids == logits.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-4, rtol=0)
    assert [r.completion_ids for r in results[:3]] != [r.completion_ids for r in results[3:]]


def test_sync_weights_restores_eval_and_records_version(full_handle):
    backend = HFBackend({"solver": full_handle})
    p = prompts(full_handle.tokenizer)[0]
    full_handle.model.train()
    full_handle.mark_updated()
    with pytest.raises(RuntimeError, match="sync_weights"):
        backend.generate_batch([req("solver", p)])
    assert backend.served_versions["solver"] == 0
    backend.sync_weights("solver")
    assert not full_handle.model.training and backend.served_versions["solver"] == 1
    assert len(backend.generate_batch([req("solver", p)])) == 1


def test_unknown_policy_is_an_error(full_handle):
    with pytest.raises(KeyError, match="solver"):
        HFBackend({"solver": full_handle}).generate_batch([req("nope", [1, 2])])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm installed: the branch would build it")
def test_vllm_backend_import_error_is_clear(full_handle):
    full_handle.backend = "vllm"
    with pytest.raises(ImportError, match="vllm"):
        build_backend({"solver": full_handle})


class EchoBackend:
    """Answers each request with its own prompt, tagged with the backend's name."""

    def __init__(self, tag):
        self.tag, self.batches, self.synced = tag, [], []

    def generate_batch(self, requests, seed=None):
        self.batches.append([r.policy for r in requests])
        return [GenResult(r.prompt_ids, [0.0] * len(r.prompt_ids), f"{self.tag}:{r.policy}", "stop") for r in requests]

    def sync_weights(self, policy):
        self.synced.append(policy)


def test_routed_backend_keeps_request_order():
    hf, vllm = EchoBackend("hf"), EchoBackend("vllm")
    backend = RoutedBackend({"solver": vllm, "critic": hf, "judge": hf})
    requests = [req(p, [i]) for i, p in enumerate(["critic", "solver", "judge", "solver", "critic"])]
    results = backend.generate_batch(requests)
    assert [r.completion_ids for r in results] == [[0], [1], [2], [3], [4]]
    assert [r.text for r in results] == ["hf:critic", "vllm:solver", "hf:judge", "vllm:solver", "hf:critic"]
    assert hf.batches == [["critic", "judge", "critic"]] and vllm.batches == [["solver", "solver"]]
    backend.sync_weights("solver")
    assert vllm.synced == ["solver"] and hf.synced == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lora_generate_batch_on_cuda(tiny_model_dir):
    from mas.agents.policy import build_policies
    from mas.config.schema import LoraConfig, PolicyConfig

    cfg = PolicyConfig(kind="lora", model=str(tiny_model_dir), device="cuda", lora=LoraConfig(r=4, alpha=8))
    handles = build_policies({"alpha": cfg, "beta": cfg})
    with torch.no_grad():
        for p in handles["alpha"].trainable_parameters():
            p.normal_(0, 0.5)
    assert handles["alpha"].device.type == "cuda"
    backend = HFBackend(handles)
    ps = prompts(handles["alpha"].tokenizer)
    requests = [req(name, p, 0.7, max_new_tokens=12) for name in ("alpha", "beta") for p in ps]
    for r, q in zip(backend.generate_batch(requests), requests):
        with handles[q.policy].activate() as model:
            expected, _ = recompute(model, q.prompt_ids, r.completion_ids, q.temperature)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_batch_on_cuda(tiny_model, tiny_tokenizer):
    handle = PolicyHandle("solver", "full", tiny_model.to("cuda").eval(), tiny_tokenizer, "cuda")
    backend = HFBackend({"solver": handle})
    ps = prompts(tiny_tokenizer)
    for temperature in (1.0, 0.7, 0.0):
        results = backend.generate_batch([req("solver", p, temperature, max_new_tokens=16) for p in ps])
        for r, p in zip(results, ps):
            expected, logits = recompute(handle.model, p, r.completion_ids, temperature)
            torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-3, rtol=0)
            if temperature == 0:
                assert r.completion_ids == logits.argmax(-1).tolist()
