"""A policy sharded over its workers with FSDP2 (``policies.<name>.sharding: fsdp``).

The N data-parallel workers of a policy (``mas.runtime.data_parallel``: one Ray actor each, a
torch.distributed group, gloo on CPU and NCCL on GPU) each build the whole model, then
``shard_model`` hands it to torch's ``fully_shard``: one FSDP unit per decoder layer and the
root (embeddings, final norm, head; a tied head stays with its embedding).  From then on every
parameter is a DTensor holding 1/N of it on each worker, gradients are reduce-scattered into
the same shards in backward, and the AdamW state made over those parameters is sharded too:
weights, gradients and optimizer state cost 1/N per worker.

What the rest of mas sees:

* **Scoring.**  The learner scores a pass by calling the decoder body and the output head apart
  (chunked logits, ``mas.learning.logprobs``), which would bypass the root unit's hooks; the
  sharded model therefore carries its scoring function as a method registered with
  ``register_fsdp_forward_method``, and ``token_logprobs_packed`` calls it.
* **Collectives in step.**  Every forward and backward all-gathers and reduce-scatters, so every
  worker must run the same passes: the learner pads a worker with fewer passes (a smaller
  shard of turns, or none) with passes over a two-token dummy sequence whose loss is 0.
* **Gradients are summed, not averaged.**  FSDP averages the reduce-scatter over the N workers;
  each worker's loss already divides by the whole batch's divisor, so the learner scales its
  backward by N, and the summed gradient is the one-worker gradient of the whole batch.
* **Serving.**  Rank 0 keeps a full copy of the policy for the rollout backend (made before
  sharding; the hf backend samples from it, a vLLM engine is pushed its weights); after every
  update each trained parameter is gathered, one at a time (``full_tensor``, a collective on
  every worker), into that copy.
* **Checkpoints.**  The weights are written from rank 0's full copy (Hugging Face format, as
  any run's); the optimizer state as one full, name-keyed state dict (``optimizer_full.pt``,
  torch.distributed.checkpoint's ``get_optimizer_state_dict``), which loads into any number of
  workers, sharded or not.  A checkpoint of an unsharded run loads into a sharded one too: its
  optimizer state is renamed by parameter.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from mas.learning.logprobs import SHARDED_SCORE, packed_logprobs

FULL_OPTIMIZER = "optimizer_full.pt"  # a sharded policy's optimizer state, whole and keyed by parameter name


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a transformers causal LM (or a peft model around one): the modules
    whose class the model names as not to be split (``_no_split_modules``), else the largest
    ``nn.ModuleList``."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(hf, "_no_split_modules", None) or ())
    layers = [m for m in hf.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists = [m for m in hf.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(hf).__name__}: no decoder layers found to shard (no _no_split_modules, no ModuleList)")
    return list(max(lists, key=len))


def shard_model(model: nn.Module) -> None:
    """FSDP2 over the current process group: one unit per decoder layer, then the root; the model
    scores through a registered forward method from then on (module docstring)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    setattr(model, SHARDED_SCORE, types.MethodType(_score, model))
    register_fsdp_forward_method(model, SHARDED_SCORE)


def _score(self: nn.Module, batch: Any, temperatures: torch.Tensor, chunk: int | None, heads: Any):
    return packed_logprobs(self, batch, temperatures, chunk, heads)


def is_sharded(model: nn.Module) -> bool:
    return hasattr(model, SHARDED_SCORE)


def full_value(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective), a plain tensor as it is."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


@torch.no_grad()
def gather_into(model: nn.Module, names: list[str], target: nn.Module | None) -> None:
    """Gather the named parameters of the sharded ``model``, one at a time (a collective: every
    worker calls it), into the same-named parameters of ``target`` (rank 0's full copy; None on the
    other workers, which only take part)."""
    params = dict(model.named_parameters())
    into = dict(target.named_parameters()) if target is not None else {}
    for name in names:
        full = full_value(params[name].data)
        if target is not None:
            into[name].copy_(full)
        del full


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state keyed by parameter name, on the CPU (a collective on a sharded model)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a whole, name-keyed optimizer state into ``optimizer`` over ``model``, sharded or not."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def parameter_names(model: nn.Module, params: list[torch.Tensor]) -> list[str]:
    """The names in ``model`` of ``params``, in their order (a learner's AdamW parameters)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for p in params]


def named_optimizer_state(names: list[str], state: dict[str, Any]) -> dict[str, Any]:
    """A plain optimizer state dict (its parameters numbered in the order of ``names``, the learner's
    AdamW parameters) renamed by parameter name, the form ``load_full_optimizer_state`` takes."""
    rename = dict(enumerate(names))
    groups = [{**g, "params": [rename[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {rename[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def load_full_weights(model: nn.Module, source: nn.Module | None, names: list[str]) -> None:
    """Copy the named parameters of rank 0's full ``source`` into the sharded ``model`` on every
    worker (a collective: rank 0 broadcasts, each worker keeps its shard); None on other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = {n: p.detach() for n, p in source.named_parameters() if n in set(names)} if source is not None else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False))
