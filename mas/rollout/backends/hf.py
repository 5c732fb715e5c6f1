"""The ``hf`` rollout backend: ``transformers`` generate on the learner's own modules, CPU or GPU.

Shapes: B requests in one generate call, P padded prompt length, S generated steps, V vocab.

Batching: requests are grouped by policy and by identical sampling parameters (temperature,
top_p, top_k); a policy's groups run one after another on its own RNG stream (seeded per
policy, ``mas.rollout.backends.base``); each group is ONE left-padded ``model.generate`` call with ``max_new_tokens``
the group's largest, unless a memory bound forces a split (below); each row is then cut to
its own ``max_new_tokens``.  Results are returned in request order either way.

Logprobs: ``logprobs[j] = log_softmax(raw_logits_j / T)[token_j]`` with ``T`` the request's
temperature (1.0 for greedy).  This is exactly what the learner recomputes from a forward pass,
so the PPO ratio is 1 on the first epoch.  Top-p/top-k truncation is NOT reflected (the sampled
distribution is the truncated one), as in verl.  ``generate`` keeps the raw float32 logits of
every step for this (``output_logits``): B * S * V * 4 bytes, about 20 GB for 128 rows x 256
tokens of Qwen2.5's 151,936-token vocabulary.  The bounds on a call:

* the call's memory (``call_budget_bytes``, default ``default_call_budget``: 1 GiB on CPU, an
  eighth of the device's memory on CUDA, where a large batch is what makes it fast): a group is
  cut into consecutive chunks of ``rows`` requests such that ``generate_bytes(rows, P, S)`` stays
  within it, P the group's longest prompt and S its largest ``max_new_tokens``.  That is what one
  call holds: while it reads the prompts, ``prompt_token_bytes`` a prompt token (its keys and
  values, one layer's prefill activations); as it decodes, the KV cache of prompts and replies
  and the float32 logits generate keeps of every step (S x V a row, the largest part for a small
  model's long vocabulary).  Greedy and sampled groups alike: a held-out evaluation sends every
  task at once, and its sampled pass ``eval_sampled_k`` times as many rows.  The cut depends only
  on the requests, so a run is as reproducible as before; a greedy row's tokens depend on nothing
  but its own prompt, so for greedy groups the cut changes no result.  On CPU smaller calls are
  no slower per row (docs/benchmarks/memory.md).
* ``logits_budget_bytes`` (default 2 GiB): the kept logits of one call, rows x S x V x 4 bytes,
  stay within it (the bound that matters on a GPU, whose call budget is larger).
* ``batch_tokens`` (a policy's ``rollout_batch_tokens``, default none): rows x P stays within it.
* every bound gives at least one row: a single row larger than the budget still runs, alone.
* after each ``generate_batch`` the heap its calls freed goes back to the system
  (``release_freed_memory``): glibc would keep it, fragmented, under the update that follows.
* the logprobs are read step by step (the sampled token's logit and a logsumexp of each [B, V]
  step, each step released once read): besides generate's own kept logits, only [B, S] floats
  and one step's [B, V] temporaries are allocated, never a stacked [B, S, V] tensor.

Sampling uses only the request's parameters: the model's own ``generation_config`` sampling
defaults (Qwen ships temperature 0.7, top_k 20, repetition_penalty 1.05) are neutralised for the
call, since any processor the logprobs do not account for would bias the ratio.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from mas.process.memory import release_freed_memory
from mas.rollout.backends.base import GenRequest, GenResult, ServedPolicy, completion_stop_ids, policy_seed

# generation_config fields that would reshape the sampling distribution, with their no-op value
_NEUTRAL_GENERATION = {
    "do_sample": False,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": None,  # greedy ignores it; sampling passes the request's (0 = off) explicitly
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": None,
    "max_length": None,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
    "guidance_scale": None,
    "watermarking_config": None,
    "stop_strings": None,
    "num_beams": 1,
    "num_return_sequences": 1,
}


@dataclass
class HFBackendStats:
    """Counters for benchmarks (``reset()`` between measurements)."""

    generate_calls: int = 0
    requests: int = 0
    prompt_tokens: int = 0  # unpadded prompt tokens of all requests
    completion_tokens: int = 0  # tokens returned (after cutting at stop / own max_new_tokens)
    generated_tokens: int = 0  # B * S over calls: includes rows that had already stopped
    seconds: float = 0.0  # wall time inside generate_batch

    def reset(self) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, type(getattr(self, k))())


@contextmanager
def _neutral_generation_config(model: torch.nn.Module) -> Iterator[None]:
    """Swap the HF model's generation_config for a copy with every sampling knob at its no-op.

    transformers fills each generate() argument left unset from ``model.generation_config``, so
    passing our parameters is not enough: a checkpoint's repetition_penalty or min_p would still
    apply.  The swap is undone on exit.
    """
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model  # PeftModel -> HF model
    saved = hf_model.generation_config
    clean = copy.deepcopy(saved)
    for k, v in _NEUTRAL_GENERATION.items():
        setattr(clean, k, v)
    hf_model.generation_config = clean
    try:
        yield
    finally:
        hf_model.generation_config = saved


@contextmanager
def _contiguous_head_input(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Hand the output head a contiguous input while generating on CPU with a bfloat16 or
    float16 head.

    generate scores only the prompt's last position (``logits_to_keep``): a [B, 1, H] view of
    the prefill's [B, P, H] hidden states.  torch's CPU ``linear`` on such a view, with a
    reduced-precision weight that needs no gradient (a LoRA base, a frozen policy), expands the
    weight once per row: B x V x H x 2 bytes, 8 GB for 150 SmolLM2 rows, where a contiguous
    copy of the view (B x H) gives the same logits bit for bit.  float32 takes another path
    without that cost, on which the copy would change the last bits, so it is left alone.
    """
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model  # PeftModel -> HF model
    head = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if device.type != "cpu" or weight is None or weight.dtype not in (torch.bfloat16, torch.float16):
        yield
        return
    hook = head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        hook.remove()


def prompt_token_bytes(model: torch.nn.Module) -> int | None:
    """Estimated bytes one prompt token holds in a generate call of ``model``: its keys and values
    in every layer's cache, and the prefill's activations of one layer at a time (hidden states and
    norms, the MLP's intermediate, float32 upcasts included), in the weights' dtype.  Measured on
    SmolLM2-135M in bfloat16 (50 KB here): 41-46 KB a prompt token for 16,000-40,000 tokens in
    one call (docs/benchmarks/memory.md).  None: the model's config does not say its shape."""
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(hf_model, "config", None)
    layers, hidden = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "hidden_size", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if not layers or not hidden or not heads:
        return None
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    kv_dim = (getattr(cfg, "num_key_value_heads", None) or heads) * head_dim
    intermediate = getattr(cfg, "intermediate_size", None) or 4 * hidden
    size = next(hf_model.parameters()).element_size()
    return size * (2 * layers * kv_dim + 8 * hidden + 6 * intermediate)


def default_call_budget(device: torch.device) -> int:
    """Bytes one generate call may hold by default (``generate_bytes``): 1 GiB of host memory on
    CPU, an eighth of the device's memory on CUDA (where a large batch is what makes it fast)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 8
    return 1024**3


def kv_cache_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Keys and values of every layer for ``tokens`` positions, in the model's dtype."""
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = hf_model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * heads * head_dim * tokens * next(hf_model.parameters()).element_size()


def generate_bytes(model: torch.nn.Module, rows: int, prompt: int, new: int) -> int:
    """Memory of one generate call of ``rows`` prompts of ``prompt`` tokens with ``new`` steps: while
    it reads the prompts, ``prompt_token_bytes`` a prompt token; then, as it decodes, the KV cache of
    prompts and replies and the float32 logits generate keeps of every step (``new`` x the
    vocabulary a row).  The larger of the two (module docstring)."""
    per_prompt = prompt_token_bytes(model) or kv_cache_bytes(model, 1)
    prefill = rows * prompt * per_prompt
    decode = kv_cache_bytes(model, rows * (prompt + new)) + rows * new * _vocab_size(model) * 4
    return max(prefill, decode)


def call_rows(model: torch.nn.Module, prompt: int, new: int, call_budget: int, logits_budget: int,
              batch_tokens: int | None = None) -> int:
    """Most rows of one generate call of prompts up to ``prompt`` tokens and ``new`` steps:
    ``generate_bytes`` within ``call_budget``, the kept logits within ``logits_budget``, rows x
    ``prompt`` within ``batch_tokens`` where given; at least 1.  The backend cuts its calls by it,
    and the memory plan sizes them by it (mas.learning.memory_plan)."""
    prompt, new = max(1, prompt), max(1, new)
    rows = min(call_budget // max(1, generate_bytes(model, 1, prompt, new)),
               logits_budget // (new * _vocab_size(model) * 4))
    if batch_tokens:
        rows = min(rows, batch_tokens // prompt)
    return max(1, rows)


def _vocab_size(model: torch.nn.Module) -> int:
    """Width of the model's logits (the output embedding's rows; config.vocab_size otherwise)."""
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model  # PeftModel -> HF model
    head = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(hf_model.config.vocab_size)


class HFBackend:
    """Serves ``PolicyHandle``s with ``model.generate``; synchronous, one call per request group
    (several when a group's kept logits would exceed ``logits_budget_bytes``; see the module
    docstring)."""

    def __init__(self, policies: dict[str, ServedPolicy], logits_budget_bytes: int = 2 * 1024**3,
                 batch_tokens: dict[str, int | None] | None = None, call_budget_bytes: int | None = None):
        if logits_budget_bytes < 1:
            raise ValueError(f"logits_budget_bytes must be positive (found {logits_budget_bytes})")
        if call_budget_bytes is not None and call_budget_bytes < 1:
            raise ValueError(f"call_budget_bytes must be positive (found {call_budget_bytes})")
        self.policies = policies
        self.logits_budget_bytes = int(logits_budget_bytes)
        self.batch_tokens = {name: (batch_tokens or {}).get(name) for name in policies}
        self.call_budgets = {name: call_budget_bytes or default_call_budget(torch.device(h.device))
                             for name, h in policies.items()}
        self.vocab_sizes = {name: _vocab_size(h.model) for name, h in policies.items()}
        # read once: a completion ends at any of these (model generation_config EOS ids + tokenizer EOS)
        self.stop_ids = {name: completion_stop_ids(h.tokenizer, h.model) for name, h in policies.items()}
        self.served_versions = {name: h.version for name, h in policies.items()}
        self.stats = HFBackendStats()

    # ------------------------------------------------------------------ API

    def generate_batch(self, requests: list[GenRequest], seed: int | None = None) -> list[GenResult]:
        """Results in request order.  Each policy's groups run together, after seeding torch with
        ``policy_seed(seed, policy)`` when a seed is given (see ``mas.rollout.backends.base``)."""
        t0 = time.perf_counter()
        groups: dict[str, dict[tuple, list[int]]] = {}  # policy -> sampling params -> request indices
        for i, r in enumerate(requests):
            if r.policy not in self.policies:
                raise KeyError(f"unknown policy {r.policy!r}; valid: {sorted(self.policies)}")
            if not r.prompt_ids:
                raise ValueError(f"request {i} for policy {r.policy!r} has an empty prompt")
            groups.setdefault(r.policy, {}).setdefault((float(r.temperature), float(r.top_p), int(r.top_k)), []).append(i)
        out: list[GenResult | None] = [None] * len(requests)
        for policy, by_params in groups.items():
            if seed is not None:
                torch.manual_seed(policy_seed(seed, policy))
            for idx in by_params.values():
                rows = self.rows_per_call(policy, max(requests[i].max_new_tokens for i in idx),
                                          max(len(requests[i].prompt_ids) for i in idx))
                for start in range(0, len(idx), rows):  # consecutive chunks, in request order
                    chunk = idx[start : start + rows]
                    for i, res in zip(chunk, self._generate_group(self.policies[policy], [requests[i] for i in chunk])):
                        out[i] = res
        release_freed_memory()  # the calls' freed heap: back to the system, not kept under the next phase
        self.stats.requests += len(requests)
        self.stats.seconds += time.perf_counter() - t0
        return out  # type: ignore[return-value]

    def rows_per_call(self, policy: str, max_new_tokens: int, prompt_tokens: int = 1) -> int:
        """Most requests of ``policy`` in one generate call (``call_rows``): the call's memory within
        its call budget, its kept logits within ``logits_budget_bytes``, rows x ``prompt_tokens`` (the
        longest prompt) within the policy's ``batch_tokens`` where it has one; at least 1."""
        return call_rows(self.policies[policy].model, prompt_tokens, max_new_tokens, self.call_budgets[policy],
                         self.logits_budget_bytes, self.batch_tokens.get(policy))

    def sync_weights(self, policy: str) -> None:
        """Serve the learner's latest weights of ``policy``.

        This backend samples from the very module objects the learner updates, so there is
        nothing to copy: syncing puts the module back in eval mode (the learner may have left
        it in train mode; dropout must be off while sampling) and records the handle's version
        as the one served.
        """
        handle = self.policies[policy]
        handle.model.eval()
        self.served_versions[policy] = handle.version

    # ------------------------------------------------------------------ internals

    def _generate_group(self, handle: ServedPolicy, reqs: list[GenRequest]) -> list[GenResult]:
        """One generate call for requests sharing a policy and sampling parameters (the caller
        keeps them within the logits budget)."""
        if handle.model.training:
            raise RuntimeError(
                f"policy {handle.name!r}: model is in train mode while sampling; call sync_weights() after an update"
            )
        tok = handle.tokenizer
        stop_ids = self.stop_ids[handle.name]
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else stop_ids[0]
        r0 = reqs[0]
        B, P = len(reqs), max(len(r.prompt_ids) for r in reqs)
        max_new = max(r.max_new_tokens for r in reqs)

        input_ids = torch.full((B, P), pad_id, dtype=torch.long)  # [B, P] left padded
        attention_mask = torch.zeros((B, P), dtype=torch.long)  # [B, P]
        for i, r in enumerate(reqs):
            input_ids[i, P - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention_mask[i, P - len(r.prompt_ids) :] = 1
        input_ids, attention_mask = input_ids.to(handle.device), attention_mask.to(handle.device)

        sampling = r0.temperature > 0
        kwargs = dict(do_sample=True, temperature=r0.temperature, top_p=r0.top_p, top_k=r0.top_k) if sampling else {}
        with (torch.no_grad(), handle.activate(), _neutral_generation_config(handle.model),
              _contiguous_head_input(handle.model, torch.device(handle.device))):
            out = handle.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new,
                eos_token_id=stop_ids,
                pad_token_id=pad_id,
                return_dict_in_generate=True,
                output_logits=True,
                **kwargs,
            )
            seq = out.sequences[:, P:]  # [B, S]
            steps = list(out.logits)  # S x [B, V] float32 raw (before processors)
            del out  # the list now holds the only references: each step is freed once read
            S = seq.shape[1]
            T = r0.temperature if sampling else 1.0
            logprobs = torch.empty((B, S), dtype=torch.float32, device=seq.device)  # [B, S]
            for j in range(S):
                step = steps[j].float()  # [B, V]
                steps[j] = None
                if T != 1.0:
                    step = step / T
                logprobs[:, j] = step.gather(-1, seq[:, j : j + 1]).squeeze(-1) - torch.logsumexp(step, dim=-1)
                del step

            # cut each row at its first stop id (kept) or at its own max_new_tokens
            limit = torch.tensor([min(r.max_new_tokens, S) for r in reqs], device=seq.device)  # [B]
            within = torch.arange(S, device=seq.device).unsqueeze(0) < limit.unsqueeze(1)  # [B, S]
            is_stop = torch.isin(seq, torch.tensor(stop_ids, device=seq.device)) & within  # [B, S]
            stopped = is_stop.any(dim=1)  # [B]
            first_stop = is_stop.int().argmax(dim=1)  # [B]
            length = torch.where(stopped, first_stop + 1, limit)  # [B]

        seq_l, lp_l, len_l, stop_l = seq.tolist(), logprobs.tolist(), length.tolist(), stopped.tolist()
        results = []
        for i in range(B):
            ids = seq_l[i][: len_l[i]]
            body = ids[:-1] if stop_l[i] else ids
            results.append(
                GenResult(
                    completion_ids=ids,
                    logprobs=lp_l[i][: len_l[i]],
                    text=tok.decode(body, skip_special_tokens=True),
                    finish_reason="stop" if stop_l[i] else "length",
                    weight_version=self.served_versions[handle.name],
                )
            )
        self.stats.generate_calls += 1
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.stats.completion_tokens += sum(len_l)
        self.stats.generated_tokens += B * S
        return results
