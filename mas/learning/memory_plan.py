"""The memory plan: what a config will hold, per policy and device, before anything loads.

``plan_run(cfg, device=None, devices=None)`` reads each policy's model config only (the
architecture is instantiated on the meta device: no weights are read or allocated) and adds up,
per policy (a LoRA family shares one base, counted once):

    weights        parameters x the weights' bytes (a LoRA family: its base, plus every adapter,
                   adapters in float32)
    gradients      trainable parameters x their bytes, during an update (a family's largest)
    optimizer      AdamW's two moments per trainable parameter, in the parameter's dtype
    activations    one learner pass of ``optim.micro_batch_tokens`` positions: the learner's own
                   estimate (``plan_memory_savers`` below, which the learner runs: activations kept
                   for backward, and the output head's logits), without any saver and with the savers
                   ``auto`` (or the config) would choose on this device
    generation     the hf backend's largest generate call (``generate_bytes``): of a step's rollout
                   (trainer.batch_size x trainer.group_size episodes asking at once, sampled), of a
                   held-out evaluation's greedy pass (eval_size episodes) and of its sampled pass
                   (eval_size x eval_sampled_k episodes, where the team trains by sampling); each
                   episode asks once per agent of the policy that speaks at the same time (a debate's
                   debaters), and a call holds as many rows as the backend puts in one (``call_rows``:
                   its memory within 1 GiB on CPU or an eighth of a GPU, its kept logits within 2 GiB,
                   rows x prompt within rollout_batch_tokens).  One call holds the KV cache of
                   its prompts and replies, the float32 logits generate keeps of every step (rows x
                   max_new_tokens x vocabulary: the largest part for a small model's long vocabulary),
                   or, while it reads the prompts, one layer's prefill activations.  The prompt is the
                   longest an agent of the policy gets (``longest_prompts``: the context check's bound
                   less the agent's own reply) unless ``prompt_tokens`` is given.  Or a vLLM engine's
                   own copy of the weights and its KV cache (on GPU a share of the device, as mas gives
                   it; on CPU 1 GiB)
    serving copy   ``trainer.max_staleness: 1`` samples from a copy of each trained model

With ``sharding: fsdp`` over ``workers: N``, weights, gradients and optimizer state are divided
by N on every worker, and rank 0 keeps a full serving copy of the weights for the rollout.

A device's peak is what stays (weights, optimizer, serving copies) plus the larger of an
update's transients (gradients and one pass) and a rollout's (the generation cache): the two
never run at once.  On the host CPU the process's own baseline (Python, torch, transformers;
measured in this process) is added; what the team's own code needs that the plan cannot size (its kind's
``side_processes``: ``kind: openai``'s worker processes, or its framework's imports as it first runs)
is named after the devices, not added.  Where the peak passes the device's memory, the plan says
what to change, in order: a LoRA adapter instead of full weights, sharding over more devices,
smaller passes, activation checkpointing, a smaller vLLM share.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mas.models.devices import resolve_dtype
from mas.process.memory import rss_mb
from mas.rollout.backends.hf import HFBackend, call_rows, default_call_budget, generate_bytes
from mas.topologies import kind_of

GiB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROMPT_TOKENS = None  # a rollout prompt's length when given (--prompt-tokens); None: ``longest_prompts`` estimates it
GUESSED_PROMPT_TOKENS = 512  # ... and where that cannot (the env or a tokenizer is not readable offline)


# --------------------------------------------------------------------------------------------
# the learner's memory savers: one pass's estimate, and which savers "auto" turns on
# --------------------------------------------------------------------------------------------


ACTIVATION_ELEMENTS = 32  # kept for backward per token, layer and hidden unit (measured on SmolLM2: 28-34)
LOGIT_COPIES = 3  # float32 [tokens, V] tensors alive at once for the head: logits, log-softmax, their gradient
AUTO_CHUNK = 1024  # completion tokens per head chunk when "auto" chunks
MEMORY_SHARE = 0.5  # of the free device memory, what one pass's activations and logits may take under "auto"
# ... and on the CPU never more than this: the host's memory also holds the rollouts, the evaluations
# and every other process, and a real model's whole run is held to 4 GB (a SmolLM2 pass of 1024
# tokens, estimated at 1.7 GiB, still runs without a saver; one of 2048 or 4096 does not)
CPU_PASS_BUDGET = 2 * 2**30


def activation_bytes(model: nn.Module, tokens: int) -> int | None:
    """Estimated activation memory of a forward/backward pass over ``tokens`` positions (None
    when the model's config does not say its depth and width)."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(hf, "config", None)
    layers, hidden = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "hidden_size", None)
    if not layers or not hidden:
        return None
    size = next(hf.parameters()).element_size()
    return tokens * layers * hidden * ACTIVATION_ELEMENTS * size


def checkpointed_bytes(model: nn.Module, tokens: int) -> int | None:
    """Estimated activation memory of a pass with the decoder layers checkpointed: each layer's
    input is kept (one tensor of ``ACTIVATION_ELEMENTS`` a layer), and backward recomputes one layer
    at a time, holding that layer's whole activations while it does (None: shape unknown)."""
    act = activation_bytes(model, tokens)
    if act is None:
        return None
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    return act // ACTIVATION_ELEMENTS + act // hf.config.num_hidden_layers


def logits_bytes(model: nn.Module, tokens: int) -> int | None:
    """Estimated memory of the output head over ``tokens`` completion positions at once:
    ``LOGIT_COPIES`` float32 [tokens, V] tensors (None when the vocabulary size is unknown)."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    vocab = getattr(getattr(hf, "config", None), "vocab_size", None)
    return tokens * vocab * 4 * LOGIT_COPIES if vocab else None


def free_memory_bytes(device: torch.device | str) -> int | None:
    """Free memory of ``device`` now: CUDA's free bytes, or the host's available memory
    (``MemAvailable`` of /proc/meminfo) for the CPU; None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def pass_budget_cap(device: torch.device | str) -> int | None:
    """The most one pass may take under ``"auto"`` whatever is free: ``CPU_PASS_BUDGET`` on the
    CPU (the host's memory also holds the rollouts and every other process), None on a GPU
    (its memory is the learner's)."""
    return CPU_PASS_BUDGET if torch.device(device).type == "cpu" else None


@dataclass(frozen=True)
class MemoryPlan:
    """Which memory savers a learner uses, and the estimate they were chosen from (bytes)."""

    checkpointing: bool  # decoder layers recomputed in backward
    logprob_chunk: int | None  # completion tokens per head chunk (None: all at once)
    activations: int | None  # one pass's activations, kept for backward, without checkpointing
    logits: int | None  # the head over one pass's tokens at once
    budget: int | None  # MEMORY_SHARE of the free device memory (None: unknown)
    reason: str


def plan_memory_savers(model: nn.Module, tokens: int, checkpointing: Any, logprob_chunk: Any,
                       free_bytes: int | None, cap: int | None = None) -> MemoryPlan:
    """Gradient checkpointing and chunked log-probabilities for passes of ``tokens`` positions.

    Each saver costs time (checkpointing recomputes the decoder layers in backward, about half a
    forward-backward more; chunking recomputes the head per chunk), so ``"auto"`` turns one on
    only where the memory it saves is needed: the estimated activations and logits of one pass
    (``activation_bytes``, ``logits_bytes``) against ``MEMORY_SHARE`` of ``free_bytes``, and at
    most ``cap`` (``learner_savers`` gives ``pass_budget_cap(device)``).  The
    cheaper saver comes first: chunked logits alone when that fits, then checkpointing too.
    Without an estimate (unknown model shape or free memory) ``"auto"`` keeps both on, the safe
    side.  Explicit settings (True/False, a chunk size or None) are kept as given."""
    act, logits = activation_bytes(model, tokens), logits_bytes(model, tokens)
    budget = int(free_bytes * MEMORY_SHARE) if free_bytes is not None else None
    if budget is not None and cap is not None:
        budget = min(budget, cap)
    auto_ckpt, auto_chunk = checkpointing == "auto", logprob_chunk == "auto"
    ckpt = True if auto_ckpt else bool(checkpointing)
    chunk = AUTO_CHUNK if auto_chunk else logprob_chunk
    if not (auto_ckpt or auto_chunk):
        return MemoryPlan(ckpt, chunk, act, logits, budget, "as configured")
    if act is None or logits is None or budget is None:
        return MemoryPlan(ckpt, chunk, act, logits, budget, "no estimate (model shape or free memory unknown): savers on")

    def head(c: int | None) -> int:  # the output head's memory with chunk size c
        return logits if c is None else logits_bytes(model, min(tokens, c))

    kept = checkpointed_bytes(model, tokens)  # each layer's input, and one layer recomputed in backward
    if auto_ckpt and auto_chunk:  # the cheaper saver first
        if act + logits <= budget:
            ckpt, chunk = False, None
        elif act + head(AUTO_CHUNK) <= budget:
            ckpt = False
    elif auto_chunk:
        chunk = None if (kept if ckpt else act) + logits <= budget else AUTO_CHUNK
    else:
        ckpt = act + head(chunk) > budget
    need = (kept if ckpt else act) + head(chunk)
    return MemoryPlan(ckpt, chunk, act, logits, budget,
                      f"activations {act / 2**30:.2f} GiB, logits {logits / 2**30:.2f} GiB; with these savers "
                      f"{need / 2**30:.2f} GiB against a budget of {budget / 2**30:.2f} GiB")


def enable_checkpointing(model: nn.Module) -> bool:
    """Switch on transformers' activation (gradient) checkpointing of the decoder layers,
    non-reentrant (so a frozen LoRA base needs no input gradient); False if the model has none.

    It stays on: transformers' layers checkpoint only in train mode, which the learner sets
    for its passes, so sampling (eval mode) is untouched.  A LoRA family shares one base model,
    so one of its learners asking is enough for all of them.
    """
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(hf, "supports_gradient_checkpointing", False):
        return False
    on = getattr(hf, "is_activation_checkpointing", None)
    if on is None:
        on = getattr(hf, "is_gradient_checkpointing", False)
    if not on:
        enable = getattr(hf, "activation_checkpointing_enable", None)  # transformers >= 5.x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return True


def learner_savers(model: nn.Module, tokens: int, checkpointing: Any, logprob_chunk: Any,
                   device: torch.device | str) -> MemoryPlan:
    """The savers a learner on ``device`` uses for passes of ``tokens`` positions: ``plan_memory_savers``
    against what is free on it now (``free_memory_bytes``), within ``pass_budget_cap(device)``."""
    return plan_memory_savers(model, tokens, checkpointing, logprob_chunk, free_memory_bytes(device),
                              cap=pass_budget_cap(device))


# --------------------------------------------------------------------------------------------
# conversation lengths: the context check's bound (mas.training.context_plan), and the prompts
# the memory plan sizes generate calls with
# --------------------------------------------------------------------------------------------


TASK_SAMPLE = 16  # training tasks whose questions are measured (and searched)
CHAT_OVERHEAD = 32  # tokens of chat template around the messages (role markers, separators)


def longest_tool_response(env: Any, env_cfg: Any, tasks: list) -> str:
    """The longest response that the env's tools gave on ``tasks`` ("" without tools)."""
    tools = getattr(env, "tools", None) or {}
    longest = ""

    def run(name: str, **args: Any) -> str:
        try:
            return str(tools[name].fn(**args))
        except Exception as e:  # a refused call is answered with its error text, which is short
            return str(e)

    titles: set[str] = set()
    for name, spec in tools.items():
        if name == "search":
            k = getattr(env_cfg, "max_k", None) or getattr(env_cfg, "search_k", None)
            for task in tasks:
                out = run("search", query=task.prompt, **({"k": k} if k else {}))
                longest = max(longest, out, key=len)
                titles |= {m.group(1) for m in re.finditer(r"^\d+\. (.+?): ", out, re.M)}
        elif name != "read":
            longest = max(longest, run(name, **{p.name: p.example for p in spec.params if p.example is not None}), key=len)
    if "read" in tools:
        for title in sorted(titles):
            longest = max(longest, run("read", title=title), key=len)
    return longest


def transcript_order(cfg: Any) -> list[str] | None:
    """The agents in the order they speak where each reads every earlier reply (a chain, as its
    kind says); None for other topologies, where no agent is counted as hearing another's reply."""
    return kind_of(cfg.topology).transcript_order(cfg.topology)


def context_bounds(cfg: Any, tokenizer_of: Callable[[str], Any], positions_of: Callable[[str], int | None],
                   env: Any) -> list[dict[str, Any]]:
    """Per agent whose model's positions are known: its bound (module docstring) and the
    positions.  ``tokenizer_of(policy)`` / ``positions_of(policy)`` read the policy's model;
    either may give None to skip it."""
    tasks = env.sample_tasks(TASK_SAMPLE)
    response_text = longest_tool_response(env, cfg.env, tasks) if any(a.tools for a in cfg.agents) else ""
    block = f"<tool_response>\n{response_text}\n</tool_response>"
    order = transcript_order(cfg)
    chain = order is not None
    heard_tokens, heard_results = 0, 0  # in a chain: what the agents before this one wrote, and their tool results
    rows = []
    for name in order or [a.name for a in cfg.agents]:
        agent = cfg.agent(name)
        tok, positions = tokenizer_of(agent.policy), positions_of(agent.policy)
        reply = agent.sampling.max_new_tokens
        rounds = agent.max_tool_calls if agent.tools else 0
        if tok is not None and positions:
            count = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731
            tools = getattr(env, "tools", None) or {}
            calls = {t: count(tools[t].example()) for t in (agent.tools or []) if t in tools}
            task = max(count(t.prompt) for t in tasks) if tasks else 0
            response = count(block) if response_text else 0
            heard = heard_tokens + heard_results * response
            bound = CHAT_OVERHEAD + count(agent.role) + task + heard + rounds * (reply + response) + reply
            rows.append({"agent": name, "policy": agent.policy, "bound": bound, "positions": positions,
                         "tool_calls": rounds, "tool_response_tokens": response if rounds else 0,
                         "max_new_tokens": reply, "call_tokens": calls})
        if chain:  # a chain's transcript shows each earlier reply and tool turn, with its results
            heard_tokens += reply + rounds * reply
            heard_results += rounds
    return rows


def converted_gguf_folder(model: str):
    """A Hugging Face folder a GGUF model (a file or a short name) was converted into before, in any
    dtype (mas.models.sources.gguf_folder); None where there is none yet."""
    from mas.models.sources import _COMPLETE, cache_dir, file_sha256, gguf_file

    digest = file_sha256(gguf_file(model))
    done = sorted(p for p in (cache_dir() / "gguf").glob(f"{digest}-*") if (p / _COMPLETE).is_file())
    return done[0] if done else None


def longest_prompts(cfg: Any) -> dict[str, int]:
    """Per policy, the longest prompt in tokens one of its agents can get: ``context_bounds`` less
    the agent's own reply (the prompt of its last call).  Policies whose tokenizer cannot be read
    offline (or GGUF files) are left out, and so is everything where the env cannot be built."""
    from transformers import AutoTokenizer

    from mas.embedded.artifact import embedded_path
    from mas.envs import build_env
    from mas.models.sources import is_gguf_model

    tokenizers: dict[str, Any] = {}

    def tokenizer_of(policy: str) -> Any:
        if policy not in tokenizers:
            model = cfg.policies[policy].model
            try:
                if model == "embedded":
                    tokenizers[policy] = AutoTokenizer.from_pretrained(str(embedded_path()))
                elif cfg.policies[policy].backend == "openai":
                    tokenizers[policy] = None
                elif is_gguf_model(model):  # only from a folder converted before (reading the GGUF file takes long)
                    folder = converted_gguf_folder(model)
                    tokenizers[policy] = AutoTokenizer.from_pretrained(str(folder)) if folder else None
                else:
                    from mas.models.hub import hub_access

                    tokenizers[policy] = AutoTokenizer.from_pretrained(hub_access(model, local_only=True))
            except Exception:  # noqa: BLE001 - not readable offline: no estimate for this policy
                tokenizers[policy] = None
        return tokenizers[policy]

    try:
        env = build_env(cfg.env)
        rows = context_bounds(cfg, tokenizer_of, lambda policy: 1 << 30, env)
    except Exception:  # noqa: BLE001 - the env's data are not here, or its tools fail: the guess stands
        return {}
    heard = heard_tokens(cfg)
    out: dict[str, int] = {}
    for r in rows:
        out[r["policy"]] = max(out.get(r["policy"], 0), r["bound"] - r["max_new_tokens"] + heard.get(r["agent"], 0))
    return out


def heard_tokens(cfg: Any) -> dict[str, int]:
    """Tokens an agent's later turns add to its prompt beyond the context check's bound (the kind's
    optional ``heard_tokens``: a debate's other answers); {} where the kind says nothing."""
    hook = getattr(kind_of(cfg.topology), "heard_tokens", None)
    return hook(cfg) if hook is not None else {}


# --------------------------------------------------------------------------------------------
# the plan of a whole run
# --------------------------------------------------------------------------------------------


@dataclass
class PolicyPlan:
    """One policy (or LoRA family) on one device; every size in bytes (per worker where sharded)."""

    name: str  # the policy, or "a+b" for a LoRA family
    device: str
    kind: str
    parameters: int
    trainable: int
    weights: int
    gradients: int
    optimizer: int
    pass_plain: int | None  # one learner pass, no saver
    pass_saved: int | None  # one learner pass, with the savers chosen for this device
    savers: str  # which savers, and why
    generation: int
    serving: int
    workers: int = 1
    sharded: bool = False
    notes: list[str] = field(default_factory=list)
    dtype: str = "float32"  # the weights' dtype as loaded (``auto`` resolved)
    dtype_setting: str = "float32"  # the config's ``dtype``
    dtype_reason: str = "as configured"  # why (mas.models.devices.resolve_dtype)
    alternative: tuple[str, int, int] | None = None  # auto: the other dtype, and this policy's weights and peak in it

    @property
    def resident(self) -> int:
        return self.weights + self.optimizer + self.serving

    def peak(self, saved: bool = True) -> int:
        act = (self.pass_saved if saved else self.pass_plain) or 0
        return self.resident + max(self.gradients + act, self.generation)


@dataclass
class DevicePlan:
    device: str
    capacity: int | None  # bytes (None: unknown)
    policies: list[PolicyPlan]
    overhead: int = 0  # the process's own baseline (host CPU only)

    def peak(self, saved: bool = True) -> int:
        # policies update one after another in one process, and never while it samples: the
        # largest transient counts once, the resident parts add up
        resident = sum(p.resident for p in self.policies)
        transient = max((p.peak(saved) - p.resident for p in self.policies), default=0)
        return self.overhead + resident + transient

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.peak() <= self.capacity


def parse_device(spec: str) -> tuple[str, int | None]:
    """'cuda:80GB' -> ('cuda', 80 GiB); 'cpu:16GB' -> ('cpu', 16 GiB); 'cuda' -> ('cuda', None)."""
    m = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+(?:\.\d+)?)\s*([GM])i?B)?", spec.strip(), flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"--device {spec!r}: expected KIND or KIND:SIZE, e.g. cuda:80GB, cuda:24GB, cpu:16GB")
    kind, size, unit = m.group(1).lower(), m.group(2), (m.group(3) or "G").upper()
    return kind, None if size is None else int(float(size) * (GiB if unit == "G" else 2**20))


def model_config(model: str, trust_remote_code: bool = False):
    """The transformers config of a policy's ``model`` (embedded, a GGUF file or short name, a local
    folder, or a hub id from the local cache), without its weights."""
    from transformers import AutoConfig

    from mas.embedded.artifact import embedded_path
    from mas.models.hub import hub_access
    from mas.models.sources import gguf_file, is_gguf_model

    if model == "embedded":
        return AutoConfig.from_pretrained(str(embedded_path()))
    if is_gguf_model(model):
        file = gguf_file(model)
        return AutoConfig.from_pretrained(str(file.parent), gguf_file=file.name)
    return AutoConfig.from_pretrained(hub_access(model, local_only=True), trust_remote_code=trust_remote_code)


def meta_model(model: str, dtype: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """The policy's architecture on the meta device in its weights' dtype (no memory)."""
    from transformers import AutoModelForCausalLM

    config = model_config(model, trust_remote_code)
    torch_dtype = getattr(torch, dtype) if dtype in DTYPE_BYTES else (getattr(config, "torch_dtype", None) or torch.float32)
    if isinstance(torch_dtype, str):
        torch_dtype = getattr(torch, torch_dtype)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype, trust_remote_code=trust_remote_code)


def lora_parameters(model: torch.nn.Module, lora: Any) -> int:
    """Parameters of one LoRA adapter: r x (in + out) per targeted Linear (in the chosen layers)."""
    targets = set(lora.target_modules)
    layers = set(lora.layers) if lora.layers is not None else None
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.rsplit(".", 1)[-1] not in targets:
            continue
        m = re.search(r"\.layers\.(\d+)\.", name)
        if layers is not None and (m is None or int(m.group(1)) not in layers):
            continue
        total += lora.r * (module.in_features + module.out_features)
    return total


def rows_per_call(model: torch.nn.Module, rows: int, prompt: int, new: int, batch_tokens: int | None,
                  device: str, capacity: int | None) -> int:
    """Rows of one generate call, as the hf backend cuts ``rows`` requests (``call_rows``): its memory
    within the device's call budget (an eighth of a GPU's ``capacity``; 1 GiB on the CPU), the kept
    logits within the logits budget, rows x ``prompt`` within the policy's ``batch_tokens``."""
    logits_budget = inspect.signature(HFBackend).parameters["logits_budget_bytes"].default
    if device.startswith("cuda"):
        budget = capacity // 8 if capacity is not None else logits_budget  # default_call_budget on the device
    else:
        budget = default_call_budget(torch.device("cpu"))
    return min(rows, call_rows(model, prompt, new, budget, logits_budget, batch_tokens))


def calls_at_once(cfg, names: list[str]) -> int:
    """Requests one episode makes of the policies ``names`` at the same time: the most agents of
    these policies among those the kind says ask together (its optional ``simultaneous``: a
    debate's round); one where it says nothing."""
    hook = getattr(kind_of(cfg.topology), "simultaneous", None)
    groups = hook(cfg) if hook is not None else []
    return max([1] + [sum(1 for a in group if cfg.agent(a).policy in names) for group in groups])


def generation_passes(cfg, names: list[str]) -> list[tuple[str, int, bool]]:
    """The runs of episodes that ask the policies ``names`` at once: (what, episodes, greedy).  A step's
    rollout (sampled), and each held-out evaluation's greedy pass and, where the team trains by sampling,
    its sampled one (eval_size x eval_sampled_k episodes: mas.training.evaluation)."""
    t = cfg.trainer
    agents = [a for a in cfg.agents if a.policy in names]
    sampled = any(a.sampling.temperature > 0 for a in agents)
    out = [("a step's rollout", t.batch_size * t.group_size, not sampled)]
    if t.eval_size:
        out.append(("an evaluation, greedy", t.eval_size, True))
        trains_by_sampling = any(a.sampling.temperature > 0 for a in cfg.agents if cfg.policies[a.policy].kind != "frozen")
        k = t.eval_sampled_k if trains_by_sampling else 0
        if k and sampled:
            out.append((f"an evaluation, sampled ({k} a task)", t.eval_size * k, False))
    return out


def _families(cfg, named: str | None = None) -> list[list[str]]:
    """Policies that share weights: a LoRA family (one base, in one resolved dtype: agents/policy.py)
    is one entry; every other policy alone."""
    groups: dict[tuple, list[str]] = {}
    out = []
    used = {a.policy for a in cfg.agents} | ({cfg.credit.critic} if getattr(cfg.credit, "critic", None) else set())
    for name, p in cfg.policies.items():
        if name not in used or p.backend == "openai":
            continue
        if p.kind == "lora":
            key = (p.model, resolve_dtype(p.dtype, _device_of(p, named)).dtype, p.device, p.trust_remote_code)
            if key not in groups:
                groups[key] = []
                out.append(groups[key])
            groups[key].append(name)
        else:
            out.append([name])
    return out


def _device_of(policy, named: str | None) -> str:
    if named is not None:
        return named
    if policy.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return policy.device


def plan_policy(cfg, names: list[str], device: str, capacity: int | None, prompt_tokens: int | None = PROMPT_TOKENS,
                dtype: str | None = None) -> PolicyPlan:
    """The plan of one policy or LoRA family (module docstring) on ``device`` with ``capacity`` bytes,
    in the dtype its weights load in there (``dtype: auto`` resolved for ``device``; ``dtype`` forces one).
    For ``auto`` the plan also carries the peak the other choice would have, the memory the choice costs."""
    first = cfg.policies[names[0]]
    choice = resolve_dtype(dtype or first.dtype, device, full=first.kind == "full")
    model = meta_model(first.model, choice.dtype, first.trust_remote_code)
    elt = next(model.parameters()).element_size()
    base = sum(p.numel() for p in model.parameters())
    trainable_by = {}
    for n in names:
        p = cfg.policies[n]
        trainable_by[n] = 0 if p.kind == "frozen" else (lora_parameters(model, p.lora or _default_lora()) if p.kind == "lora" else base)
    kind = first.kind if len(names) == 1 else f"{len(names)} LoRA adapters on one base"
    adapters = sum(v for n, v in trainable_by.items() if cfg.policies[n].kind == "lora")
    trainable = sum(trainable_by.values())
    params = base + adapters
    # adapters stay float32 on a low-precision base (agents/policy.py); full weights train in their own dtype
    t_elt = {n: (4 if cfg.policies[n].kind == "lora" else elt) for n in names}
    weights = base * elt + adapters * 4
    optim = sum(2 * v * t_elt[n] for n, v in trainable_by.items())  # AdamW's two moments, in the parameters' dtype
    grads = max(v * t_elt[n] for n, v in trainable_by.items())  # policies of a family update one at a time
    workers = first.workers
    sharded = getattr(first, "sharding", "none") == "fsdp" and workers > 1
    notes = []
    serving = 0
    full = weights
    if sharded:  # every worker holds 1/N; rank 0 keeps a full copy to serve the rollout (hf)
        weights, grads, optim = math.ceil(weights / workers), math.ceil(grads / workers), math.ceil(optim / workers)
        if first.backend == "hf":
            serving += full
            notes.append(f"sharded over {workers} workers; rank 0 also holds a full serving copy of the weights")
    if cfg.trainer.max_staleness and trainable and first.backend == "hf":
        serving += full
        notes.append("trainer.max_staleness 1: a serving copy of the trained model")
    # one learner pass: the learner's own estimate and choice of savers on this device
    tokens = first.optim.micro_batch_tokens if first.optim else 4096
    free = max(0, capacity - (weights + optim + serving)) if capacity is not None else None
    cap = pass_budget_cap(device)
    if trainable:
        plain = plan_memory_savers(model, tokens, False, None, free, cap)
        chosen = plan_memory_savers(model, tokens, first.optim.gradient_checkpointing, first.optim.logprob_chunk, free, cap)
        pass_plain = (plain.activations or 0) + (plain.logits or 0)
        kept = (checkpointed_bytes(model, tokens) or 0) if chosen.checkpointing else (chosen.activations or 0)
        head = (chosen.logits or 0) if chosen.logprob_chunk is None else (logits_bytes(model, min(tokens, chosen.logprob_chunk)) or 0)
        pass_saved = kept + head
        savers = (f"checkpointing {'on' if chosen.checkpointing else 'off'}, logits "
                  + ("all at once" if chosen.logprob_chunk is None else f"in chunks of {chosen.logprob_chunk}")
                  + f" ({chosen.reason})")
    else:
        pass_plain = pass_saved = None
        savers = "frozen: no update"
    # the rollout's cache
    agents = [a for a in cfg.agents if a.policy in names]
    new_tokens = max((a.sampling.max_new_tokens for a in agents), default=0)
    if first.backend == "vllm":
        from mas.rollout.backends.vllm import CPU_KV_CACHE_BYTES, DEFAULT_GPU_MEMORY

        if device.startswith("cuda") and capacity is not None:
            generation = int(DEFAULT_GPU_MEMORY * capacity)
            notes.append(f"vLLM takes {DEFAULT_GPU_MEMORY:.0%} of the device (its weights and KV cache), shared by its engines")
        else:
            generation = full + CPU_KV_CACHE_BYTES
            notes.append("vLLM on CPU: its own copy of the weights and a 1 GiB KV cache")
    elif agents:
        at_once = calls_at_once(cfg, names)
        prompt = prompt_tokens if prompt_tokens is not None else GUESSED_PROMPT_TOKENS
        generation, largest = 0, ""
        for what, episodes, _ in generation_passes(cfg, names):
            rows = episodes * at_once
            per_call = rows_per_call(model, rows, prompt, new_tokens, first.rollout_batch_tokens, device, capacity)
            size = generate_bytes(model, per_call, prompt, new_tokens)
            if size > generation:
                generation = size
                largest = (f"generation: largest call in {what}: {per_call} of {rows} rows of up to {prompt} prompt tokens "
                           f"and {new_tokens} new ones")
        notes.append(largest)
    else:
        generation = 0
    plan = PolicyPlan("+".join(names), device, kind, params, trainable, weights, grads, optim, pass_plain, pass_saved, savers,
                      generation, serving, workers, sharded, notes, dtype=choice.dtype, dtype_setting=dtype or first.dtype,
                      dtype_reason=choice.reason)
    if dtype is None and first.dtype == "auto" and first.kind != "full":  # full stays float32: no other choice
        other = "float32" if choice.dtype == "bfloat16" else "bfloat16"
        alt = plan_policy(cfg, names, device, capacity, prompt_tokens, dtype=other)
        plan.alternative = (other, alt.weights, alt.peak())
    return plan


def _default_lora():
    from mas.config.schema import LoraConfig

    return LoraConfig()


def plan_run(cfg, device: str | None = None, devices: int | None = None,
             prompt_tokens: int | None = PROMPT_TOKENS) -> list[DevicePlan]:
    """Every device's plan: the config's own devices (each with what it has free now), or every
    policy on one named device (``'cuda:80GB'``).  ``prompt_tokens``: every rollout prompt's length;
    None: each policy's longest (``longest_prompts``), ``GUESSED_PROMPT_TOKENS`` where it cannot tell."""
    named, capacity = parse_device(device) if device else (None, None)
    longest = longest_prompts(cfg) if prompt_tokens is None else {}
    by_device: dict[str, list[PolicyPlan]] = {}
    for names in _families(cfg, named):
        where = _device_of(cfg.policies[names[0]], named)
        cap = capacity if named else _capacity(where)
        known = [longest[n] for n in names if n in longest]
        prompt = prompt_tokens if prompt_tokens is not None else (max(known) if known else None)
        by_device.setdefault(where, []).append(plan_policy(cfg, names, where, cap, prompt))
    out = []
    for where, policies in by_device.items():
        cap = capacity if named else _capacity(where)
        host = where.startswith("cpu")
        overhead = int((rss_mb() or 0) * 2**20) if host else 0
        out.append(DevicePlan(where, cap, policies, overhead))
    return out


def _capacity(device: str) -> int | None:
    """The memory a config's own device has: what is free on it now (CPU: available RAM)."""
    return free_memory_bytes(device)


def advice(plan: DevicePlan, cfg, devices: int | None = None) -> list[str]:
    """What to change when ``plan`` does not fit its device (module docstring), with the sizes each gives."""
    if plan.fits is not False:
        return []
    over = plan.peak() - plan.capacity
    out = [f"{plan.device}: planned peak {_gib(plan.peak())} is {_gib(over)} over its {_gib(plan.capacity)}; what would fit:"]
    for p in plan.policies:
        first, *rest = p.name.split("+")
        family = f" (and the same on {', '.join(rest)}: one LoRA family)" if rest else ""
        if p.kind == "full" and p.trainable:  # an adapter's gradients and moments are a few MB
            out.append(f"  - policies.{first}.kind: lora (an adapter instead of all {p.trainable / 1e6:,.0f}M weights): saves about "
                       f"{_gib(p.gradients + p.optimizer)} of gradients and AdamW state")
        n = devices or 0
        if p.trainable and not p.sharded and n >= 2:
            per = (p.weights + p.gradients + p.optimizer) * (n - 1) / n
            out.append(f"  - policies.{first}.workers: {n} with sharding: fsdp{family} (runtime.kind: ray): each of {n} devices "
                       f"holds a 1/{n} shard of weights, gradients and optimizer state (saves {_gib(per)} per device)")
        elif p.trainable and not p.sharded:
            out.append(f"  - policies.{first}.workers: N with sharding: fsdp{family} over N devices (--devices N shows the sizes)")
        if p.pass_saved:
            out.append(f"  - policies.{first}.optim.micro_batch_tokens{family}: half of it halves a learner pass "
                       f"({_gib(p.pass_saved)} now); gradient_checkpointing: true keeps one tensor per layer instead of about "
                       f"{ACTIVATION_ELEMENTS}, and logprob_chunk: {AUTO_CHUNK} bounds the head")
        if p.generation and cfg.policies[first].backend == "vllm":
            out.append(f"  - {p.name}: fewer vLLM engines, or a smaller gpu_memory_utilization (it takes {_gib(p.generation)} here)")
    return out


def _gib(n: int | None) -> str:
    """A size for people: GiB from 1 GiB up, MiB below."""
    if n is None:
        return "?"
    return f"{n / GiB:,.2f} GiB" if abs(n) >= GiB else f"{n / 2**20:,.1f} MiB"


def dtype_line(p: PolicyPlan) -> str:
    """The policy's dtype, why, and what it costs: with ``auto``, its weights and peak against the other
    choice's (a peak may fall with larger weights: the learner's savers answer the larger activations)."""
    if p.dtype_setting != "auto":
        return f"dtype {p.dtype} (as configured): weights {_gib(p.weights)}, peak {_gib(p.peak())}"
    line = f"dtype auto -> {p.dtype}: {p.dtype_reason}; weights {_gib(p.weights)}, peak {_gib(p.peak())}"
    if p.alternative is not None:
        other, weights, peak = p.alternative
        line += f" ({other}: weights {_gib(weights)}, peak {_gib(peak)})"
    return line


def render(plans: list[DevicePlan], cfg, devices: int | None = None) -> str:
    """The plan as text for the terminal: a table per device, its peak against its memory, and advice."""
    lines = []
    for d in plans:
        cap = "unknown" if d.capacity is None else _gib(d.capacity)
        lines.append(f"device {d.device} (memory {cap}{', free now' if d.capacity is not None and d.overhead else ''})")
        lines.append("  policy | kind | parameters (trainable) | weights | gradients | optimizer | one pass, no saver -> "
                     "with savers | generation cache | serving copy")
        for p in d.policies:
            shard = f", per worker of {p.workers}" if p.sharded else ""
            lines.append(f"  {p.name} | {p.kind}{shard} | {p.parameters / 1e6:,.1f}M ({p.trainable / 1e6:,.2f}M) | "
                         f"{_gib(p.weights)} | {_gib(p.gradients)} | {_gib(p.optimizer)} | "
                         f"{_gib(p.pass_plain)} -> {_gib(p.pass_saved)} | {_gib(p.generation)} | {_gib(p.serving)}")
            lines.append(f"    savers: {p.savers}")
            lines.append(f"    {dtype_line(p)}")
            for note in p.notes:
                lines.append(f"    note: {note}")
        if d.overhead:
            lines.append(f"  process baseline (Python, torch, transformers, measured here): {_gib(d.overhead)}")
        verdict = "" if d.fits is None else (" (fits)" if d.fits else " (does NOT fit)")
        lines.append(f"  planned peak: {_gib(d.peak(saved=False))} without memory savers, {_gib(d.peak())} with them{verdict}")
        lines += advice(d, cfg, devices)
    side = getattr(kind_of(cfg.topology), "side_processes", None)
    if side is not None and side(cfg):  # on the host, whatever device the policies are on
        lines.append(f"host, not in any peak above: {side(cfg)}")
    return "\n".join(lines)
