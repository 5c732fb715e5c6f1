"""The grouped CPU LoRA ops (``mas.rollout.backends.vllm_cpu_lora``) against a loop written from the
formula, token by token: shrink ``out[t, :r] = s * x[t] @ A[slot_t].T``, expand
``out[t, :n] (+)= x[t] @ B[slot_t].T``, and no contribution where ``slot_t = -1``; and, where
vLLM is installed, against vLLM's own torch ops on the slots those get right (>= 0)."""

from __future__ import annotations

import pytest
import torch

from mas.rollout.backends import vllm_cpu_lora as ops
from vllm_helpers import require_vllm


def reference(x, w, slots, dtype):
    w = w.squeeze(1) if w.dim() == 4 else w
    out = torch.zeros(x.shape[0], w.shape[1], dtype=dtype)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            out[t] = x[t].to(dtype) @ w[s].to(dtype).T
    return out


def case(seed, T=7, k=12, n=5, L=3, dtype=torch.float32, slots=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, k, generator=g).to(dtype)
    w = torch.randn(L, 1, n, k, generator=g).to(dtype)
    s = slots if slots is not None else torch.randint(-1, L, (T,), generator=g)
    return x, w, s


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slots", [None, torch.tensor([2] * 7), torch.tensor([-1] * 7), torch.tensor([0, -1, 1, 1, -1, 2, 0])])
def test_grouped_ops_equal_the_per_token_formula(seed, slots):
    x, a, s = case(seed, slots=slots)
    y = torch.full((7, 8), 99.0)  # r = 5 of 8 columns written, the rest untouched
    ops.bgmv_shrink(x, a, y, s, scaling=0.5)
    torch.testing.assert_close(y[:, :5], 0.5 * reference(x, a, s, torch.float32))
    assert (y[:, 5:] == 99.0).all()

    h, b, _ = case(seed + 10, k=5, n=12)
    base = torch.randn(7, 12)
    out = base.clone()
    ops.bgmv_expand(h, b, out, s, add_inputs=True)
    torch.testing.assert_close(out, base + reference(h, b, s, torch.float32))
    ops.bgmv_expand(h, b, out, s, add_inputs=False)
    torch.testing.assert_close(out, reference(h, b, s, torch.float32))

    wide = base.clone()
    ops.bgmv_expand_slice(h, b[:, :, :4], wide, s, slice_offset=3, slice_size=4, add_inputs=True)
    expected = base.clone()
    expected[:, 3:7] += reference(h, b[:, :, :4], s, torch.float32)
    torch.testing.assert_close(wide, expected)


def test_sequence_forms_expand_slots_per_token_and_rows_without_adapter_get_nothing():
    x, a, _ = case(0, T=6)
    seq_slots, seq_lens = torch.tensor([1, -1, 0]), torch.tensor([2, 3, 1])  # tokens: 1 1 -1 -1 -1 0
    y = torch.zeros(6, 5)
    ops.sgmv_shrink(x, a, y, None, seq_lens, seq_slots, 3, 3, 6, 1.0)
    token_slots = torch.tensor([1, 1, -1, -1, -1, 0])
    torch.testing.assert_close(y, reference(x, a, token_slots, torch.float32))
    assert (y[2:5] == 0).all()  # the plain-base rows: no adapter, not the last one


@pytest.mark.vllm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_ops_equal_vllms_own_on_adapter_rows(dtype):
    require_vllm()
    from vllm.lora.ops import torch_ops
    x, a, s = case(3, T=9, dtype=dtype, slots=torch.tensor([0, 2, 2, 1, 0, 0, 1, 2, 2]))
    mine, theirs = torch.zeros(9, 5), torch.zeros(9, 5)
    ops.bgmv_shrink(x, a, mine, s, 0.25)
    torch_ops.bgmv_shrink(x, a, theirs, s, 0.25)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    h, b, _ = case(4, T=9, k=5, n=12, dtype=dtype)
    mine, theirs = torch.ones(9, 12, dtype=dtype), torch.ones(9, 12, dtype=dtype)
    ops.bgmv_expand(h, b, mine, s, True)
    torch_ops.bgmv_expand(h, b, theirs, s, True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol)
