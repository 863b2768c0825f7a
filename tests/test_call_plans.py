"""The per-signature plans of the library wrappers (hk.CallPlans) and the ops' Autograd kernel: a repeat call that
takes the plan gives the results of the checked path on fresh inputs, values a plan's key does not hold are still
checked on every call, and the Autograd kernel's shortcut (the implementation called directly where nothing lies
between it and the device) gives way to the dispatcher under fake tensors and modes. CPU, reference backend."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hk_portable import ArgumentError, torch_ops  # noqa: F401  (torch_ops defines the hk:: ops)
from hk_portable.kernels import attention_kvcache as kvcache_kernel
from hk_portable.kernels import gemm as gemm_kernel
from hk_portable.kernels import layernorm as norm_kernel
from hk_portable.kernels import rotary as rotary_kernel

bf16 = torch.bfloat16


def _close(ours, ref, rtol=2e-2, atol=2e-2):
    torch.testing.assert_close(ours.double(), ref.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape, w_t", [((5, 64), True), ((2, 3, 64), True), ((64,), False), ((2, 3, 64), False)])
def test_a_planned_gemm_gives_the_product_of_fresh_operands(shape, w_t):
    w = torch.randn(32, 64, dtype=bf16)
    b = w.t() if w_t else w.t().contiguous()
    for _ in range(3):                      # the first call plans, the next take the plan
        a = torch.randn(shape, dtype=bf16)
        out = torch.ops.hk.gemm(a, b)
        assert out.shape == (*shape[:-1], 32) and out._base is None
        _close(out, a.double() @ b.double())


def test_a_gemm_whose_rows_need_a_copy_is_not_planned_as_a_view():
    a = torch.randn(4, 6, 64, dtype=bf16).transpose(0, 1)    # [6, 4, 64]: rows not viewable as [24, 64]
    b = torch.randn(64, 16, dtype=bf16)
    for _ in range(2):
        _close(torch.ops.hk.gemm(a, b), a.double() @ b.double())
    key_parts = (a.shape, a.stride())
    assert not any(k[1:3] == key_parts for k in gemm_kernel._PLANS._plans if k and k[0] is gemm_kernel.matmul)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_3d_gemm_is_planned_in_inference_mode_too(mode):
    """inference mode records no view base: the plan must not rely on one (a 3-D Linear input, every decode step)."""
    gemm_kernel._PLANS._plans.clear()
    b = torch.randn(64, 16, dtype=bf16)
    with mode():
        a = torch.randn(2, 3, 64, dtype=bf16)
        for _ in range(2):
            _close(torch.ops.hk.gemm(a, b), a.double() @ b.double())
    assert any(k[1:3] == (a.shape, a.stride()) for k in gemm_kernel._PLANS._plans if k and k[0] is gemm_kernel.matmul)


def test_a_planned_rotary_takes_each_calls_offset_and_still_checks_it():
    cos, sin = rotary_kernel.tables(16, 64)
    x = torch.randn(1, 1, 4, 64, dtype=bf16)
    outs = [torch.ops.hk.rotary(x, cos, sin, "neox", pos) for pos in range(4)]
    for pos, out in enumerate(outs):
        ref = rotary_kernel.rotary(x, cos, sin, offset=pos, HEADS=False)     # a config: the checked path
        assert torch.equal(out, ref)
    assert not torch.equal(outs[0], outs[1])
    with pytest.raises(ArgumentError, match="offset"):
        torch.ops.hk.rotary(x, cos, sin, "neox", 16)         # past the tables, on a planned signature
    with pytest.raises(ArgumentError, match="offset"):
        rotary_kernel.rotary(x, cos, sin, offset=-1)
    with pytest.raises(ArgumentError, match="'cos' must be a float32 table"):     # not a tensor: no plan key
        rotary_kernel.rotary(x, [1.0], sin)


def test_a_planned_norm_still_checks_p_and_eps_and_the_seed():
    x, w = torch.randn(8, 96, dtype=bf16), torch.randn(96)
    y, _ = torch.ops.hk.rms_norm(x, None, w)
    y2, _ = torch.ops.hk.rms_norm(x, None, w)
    assert torch.equal(y, y2)
    ref, _ = norm_kernel.reference(x, None, w, None, eps=1e-6, rms=True)
    _close(y, ref)
    with pytest.raises(ArgumentError, match="eps"):
        norm_kernel.dropout_residual_rmsnorm(x, None, w, eps=0.0)
    with pytest.raises(ArgumentError, match="seed"):
        norm_kernel.dropout_residual_rmsnorm(x, None, w, seed=-1)


def test_a_planned_kvcache_call_reads_each_calls_lengths_and_checks_them_on_the_cpu():
    B, S, Hkv, Hq, D = 2, 64, 2, 4, 64
    k, v = torch.randn(B, S, Hkv, D, dtype=bf16), torch.randn(B, S, Hkv, D, dtype=bf16)
    q = torch.randn(B, 1, Hq, D, dtype=bf16)
    for lens in ([5, 64], [64, 1], [17, 33]):
        seqlens = torch.tensor(lens, dtype=torch.int32)
        o, lse = torch.ops.hk.attention_kvcache(q, k, v, seqlens)
        ro, rlse = kvcache_kernel.kvcache_reference(q, k, v, seqlens)
        _close(o, ro)
        _close(lse, rlse, rtol=1e-3, atol=1e-3)
    with pytest.raises(ArgumentError, match="capacity"):
        torch.ops.hk.attention_kvcache(q, k, v, torch.tensor([65, 3], dtype=torch.int32))


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_autograd_kernel_leaves_calls_under_a_mode_to_the_dispatcher():
    a, b = torch.randn(8, 64, dtype=bf16), torch.randn(64, 16, dtype=bf16).requires_grad_()
    with torch.no_grad():                   # no gradient needed: the shortcut, unless a mode is active
        plain = torch.ops.hk.gemm(a, b)
        with _Seen() as seen:
            moded = torch.ops.hk.gemm(a, b)
    assert "hk.gemm.default" in seen.ops    # the mode saw the op itself, not the implementation's pieces
    assert torch.equal(plain, moded)
    out = torch.ops.hk.gemm(a, b)           # a gradient needed: the autograd function
    assert out.requires_grad and out.grad_fn is not None
    (gb,) = torch.autograd.grad(out.float().sum(), [b])
    _close(gb, a.double().t() @ torch.ones(8, 16, dtype=torch.float64))


def test_a_growing_cache_keeps_one_plan_and_reads_each_steps_length():
    B, Hkv, Hq, D = 1, 2, 4, 64
    full_k, full_v = torch.randn(B, Hkv, 40, D, dtype=bf16), torch.randn(B, Hkv, 40, D, dtype=bf16)
    q = torch.randn(B, 1, Hq, D, dtype=bf16)
    plans = len(kvcache_kernel._PLANS._plans)
    for n in (20, 21, 33):              # transformers' DynamicCache: [B, Hkv, n, D], viewed as [B, n, Hkv, D]
        k, v = full_k[:, :, :n].contiguous().transpose(1, 2), full_v[:, :, :n].contiguous().transpose(1, 2)
        seqlens = torch.full((B,), n, dtype=torch.int32)
        o, _ = torch.ops.hk.attention_kvcache(q, k, v, seqlens)
        _close(o, kvcache_kernel.kvcache_reference(q, k, v, seqlens)[0])
    assert len(kvcache_kernel._PLANS._plans) == plans + 1
    with pytest.raises(ArgumentError, match="one shape"):       # k and v of two lengths: checked, not planned
        torch.ops.hk.attention_kvcache(q, k, v[:, :-1], seqlens - 1)
