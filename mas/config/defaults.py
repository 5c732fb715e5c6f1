"""Learning-rate defaults: what ``optim.lr`` means when a policy leaves it unset.

The rate depends on the model, so the schema cannot hold a number: ``OptimConfig.lr`` is
``None`` there, and ``resolve_default_lrs`` fills it in when a team is built (before any
weights load), from the size the model's own config gives.  The resolved rate is what the
run uses and what ``config.yaml``, ``run_info.json`` and ``mas validate`` show.

Full fine-tuning with an RL objective (PPO-clip, GRPO-style) is usually run at about 1e-6
for models of 1B to 10B parameters (TRL's GRPO default and verl's GSM8K recipes use 1e-6),
with smaller models tolerating larger steps and larger models needing smaller ones.  LoRA
adapters train best at about ten times the full-fine-tuning rate (an empirical rule for
both supervised and RL fine-tuning), so a LoRA policy gets ``LORA_FACTOR`` times the row.
The bands are deliberately coarse: a default that learns, not a tuned value.

The embedded model (``model: embedded``) has its own rate, ``EMBEDDED_LR``: the rate the
shipped embedded teams give their worker policies (the quickstart's workers), at which its
policies change where 1e-6 changes nothing; it is also the first band's rate, where a
0.2M-parameter model falls.  It is not tuned per team: docs/benchmarks/embedded.md ("Default learning
rate") has what it does on the quickstart team.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mas.config.schema import RunConfig

# (parameters below this, full fine-tuning rate); the last row has no upper bound
LR_BANDS: tuple[tuple[float, float], ...] = (
    (10e6, 1e-4),
    (100e6, 1e-5),
    (1e9, 2e-6),
    (10e9, 1e-6),
    (100e9, 5e-7),
    (math.inf, 2e-7),
)
LORA_FACTOR = 10.0
EMBEDDED_LR = 1e-4  # the embedded model's rate (docs/benchmarks/embedded.md, "Default learning rate")


def default_lr(kind: str, parameters: int | None) -> float:
    """The default peak rate of a ``kind`` (full / lora) policy on a model of ``parameters``
    (None: the embedded model)."""
    if parameters is None:
        return EMBEDDED_LR * (LORA_FACTOR if kind == "lora" else 1.0)
    rate = next(lr for bound, lr in LR_BANDS if parameters < bound)
    return rate * (LORA_FACTOR if kind == "lora" else 1.0)


def lr_table_markdown() -> str:
    """The table in the README and docs (a test checks that they show this one)."""
    rows = ["| model parameters | `kind: full` | `kind: lora` |", "|---|---|---|"]
    low = 0.0
    for bound, lr in LR_BANDS:
        span = f"< {_size(bound)}" if low == 0 else (f"≥ {_size(low)}" if math.isinf(bound) else f"{_size(low)} – {_size(bound)}")
        rows.append(f"| {span} | {_rate(lr)} | {_rate(lr * LORA_FACTOR)} |")
        low = bound
    return "\n".join(rows)


def _rate(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")  # 2e-06 -> 2e-6


def _size(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def model_parameters(model: str, trust_remote_code: bool = False, local_only: bool = False) -> int:
    """Parameters of ``model`` (a hub id, a local path, a GGUF file or short name) from its
    config alone.

    The architecture is instantiated on the meta device, so no weights are read or
    allocated; a GGUF's header lists its tensors' shapes.  ``local_only``: never ask the hub
    (``mas validate``); a hub model that is not in the cache then raises ``OSError``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mas.models.hub import hub_access
    from mas.models.sources import gguf_parameters, is_gguf_model

    if is_gguf_model(model):
        return gguf_parameters(model)

    config = AutoConfig.from_pretrained(hub_access(model, local_only=local_only), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in lm.parameters())


def resolve_default_lrs(cfg: "RunConfig", local_only: bool = False) -> tuple["RunConfig", dict[str, str]]:
    """``cfg`` with every unset ``optim.lr`` filled in, and a note per filled YAML path.

    ``local_only`` (``mas validate``): a hub model not in the local cache keeps ``lr: null``,
    with a note that the rate is chosen when the model's config is downloaded.
    """
    from mas.models.sources import ModelLoadError, is_gguf_model

    notes: dict[str, str] = {}
    policies: dict[str, Any] = {}
    sizes: dict[tuple, int | None] = {("embedded", False): None, ("embedded", True): None}
    for name, p in cfg.policies.items():
        if p.optim is None or p.optim.lr is not None:
            continue
        path = f"policies.{name}.optim.lr"
        key = (p.model, p.trust_remote_code)
        try:
            if key not in sizes:
                sizes[key] = model_parameters(p.model, p.trust_remote_code, local_only=local_only)
        except (OSError, ValueError) as e:
            if local_only:
                notes[path] = (f"unset: the GGUF file cannot be read ({e})" if is_gguf_model(p.model) else
                               "unset: chosen by the model's size when its config is downloaded (mas train)")
                continue
            raise ModelLoadError(f"policy {name!r}: model {p.model!r}: cannot read its config to choose "
                                 f"the default learning rate: {e}") from e
        lr = default_lr(p.kind, sizes[key])
        model = "the embedded model" if sizes[key] is None else f"a {_size(sizes[key])}-parameter model"
        notes[path] = f"{lr:g} (unset: the default for kind {p.kind} on {model})"
        policies[name] = p.model_copy(update={"optim": p.optim.model_copy(update={"lr": lr})})
    if not policies:
        return cfg, notes
    return cfg.model_copy(update={"policies": {**cfg.policies, **policies}}), notes
