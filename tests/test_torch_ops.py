"""The hk:: torch custom ops on the CPU (reference backend): torch.library.opcheck for each (schema, autograd
registration, fake tensors, AOT dispatch with dynamic shapes), and their gradients against float64 math."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable import torch_ops
from hk_portable.kernels import attention as attention_kernel
from hk_portable.kernels import layernorm as norm_kernel
from hk_portable.kernels import rotary as rotary_kernel

bf16 = torch.bfloat16


def _leaf(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype).requires_grad_()


def _opcheck_cases():
    torch.manual_seed(0)
    cos, sin = rotary_kernel.tables(24, 64)
    q, k, v = _leaf(1, 4, 20, 64, dtype=bf16), _leaf(1, 2, 20, 64, dtype=bf16), _leaf(1, 2, 20, 64, dtype=bf16)
    x, r, w, b = _leaf(10, 96), _leaf(10, 96, dtype=bf16), _leaf(96), _leaf(96)
    return {
        "gemm": (torch.ops.hk.gemm.default, (_leaf(20, 64, dtype=bf16), _leaf(64, 24, dtype=bf16))),
        "gemm_f32_out_strided": (torch.ops.hk.gemm.default,
                                 (_leaf(64, 20, dtype=bf16).t(), _leaf(24, 64, dtype=bf16).t(), torch.float32)),
        "gemm_leading_dims": (torch.ops.hk.gemm.default, (_leaf(2, 5, 64, dtype=bf16), _leaf(64, 24, dtype=bf16))),
        "attention_causal_gqa": (torch.ops.hk.attention.default, (q, k, v, True)),
        "attention_window": (torch.ops.hk.attention.default, (q, k, v, False, [3, -1])),
        "rotary_gptj_offset": (torch.ops.hk.rotary.default, (_leaf(2, 20, 3, 64), cos, sin, "gptj", 2)),
        "layernorm_dropout": (torch.ops.hk.dropout_residual_layernorm.default, (x, r, w, b, 0.1, 7, 3)),
        "rms_norm": (torch.ops.hk.rms_norm.default, (x, r, w, None, 0.0)),
        "norm_backward_layernorm_dropout": (torch.ops.hk.norm_backward.default,
                                            (_leaf(10, 96).detach(), _leaf(10, 96, dtype=bf16).detach(),
                                             w.detach(), _leaf(10, 96).detach(), False, 0.1, 7, 3, 1e-5, torch.float32, bf16, torch.float32)),
        "norm_backward_rms_no_dh": (torch.ops.hk.norm_backward.default,
                                    (_leaf(10, 96).detach(), _leaf(10, 96).detach(), w.detach(), None, True, 0.0,
                                     0, 0, 1e-6, torch.float32, torch.float32)),
        "attention_backward_causal_gqa": (torch.ops.hk.attention_backward.default,
                                          (*(t.detach() for t in (q, k, v)), *_attention_outputs(q, k, v),
                                           _leaf(1, 4, 20, 64, dtype=bf16).detach(), None, True)),
    }


def _attention_outputs(q, k, v):
    with torch.no_grad():
        return torch.ops.hk.attention(q, k, v, True)


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_opcheck(case):
    op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)


def _rel_err(got, want):
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def test_gemm_gradients_are_hk_gemms_of_the_transposes():
    torch.manual_seed(1)
    a, b = _leaf(40, 96, dtype=bf16), _leaf(96, 72, dtype=bf16)
    w = torch.randn(40, 72).to(bf16)                         # the upstream gradient, exact in bf16
    (torch.ops.hk.gemm(a, b, torch.float32) * w.float()).sum().backward()
    ad, bd, wd = a.detach().double(), b.detach().double(), w.double()
    assert _rel_err(a.grad, wd @ bd.T) < 2 ** -7 and a.grad.dtype == bf16
    assert _rel_err(b.grad, ad.T @ wd) < 2 ** -7 and b.grad.dtype == bf16


def test_gemm_backward_takes_an_expanded_gradient():
    """out.sum() gives an upstream gradient with zero strides: the kernel reads it as it is."""
    a, b = _leaf(20, 64, dtype=bf16), _leaf(64, 24, dtype=bf16)
    torch.ops.hk.gemm(a, b).sum().backward()
    ones = torch.ones(20, 24, dtype=torch.float64)
    assert _rel_err(a.grad, ones @ b.detach().double().T) < 2 ** -7
    assert _rel_err(b.grad, a.detach().double().T @ ones) < 2 ** -7


@pytest.mark.parametrize("shape", [(3, 7, 96), (96,), (4, 1, 5, 96)])
def test_gemm_takes_leading_dims_and_returns_a_fresh_tensor(shape):
    """a [..., K] as matmul: the result is [..., N], not a view (FSDP2 warns on modules that return views);
    the gradient of b sums over every leading row."""
    torch.manual_seed(5)
    a, b = _leaf(*shape, dtype=bf16), _leaf(96, 40, dtype=bf16)
    w = torch.randn(*shape[:-1], 40).to(bf16)
    c = torch.ops.hk.gemm(a, b, torch.float32)
    assert c.shape == (*shape[:-1], 40) and c._base is None
    (c * w.float()).sum().backward()
    ad, bd, wd = a.detach().double(), b.detach().double(), w.double()
    assert _rel_err(c.detach(), ad @ bd) < 2 ** -7
    assert _rel_err(a.grad, wd @ bd.T) < 2 ** -7 and a.grad.shape == a.shape
    assert _rel_err(b.grad, ad.reshape(-1, 96).T @ wd.reshape(-1, 40)) < 2 ** -7


def test_gemm_names_the_argument_of_a_bad_rank():
    with pytest.raises(hk.ArgumentError, match="'a' must have 1 or more dims"):
        torch.ops.hk.gemm(torch.tensor(1.0, dtype=bf16), torch.ones(1, 4, dtype=bf16))
    with pytest.raises(hk.ArgumentError, match=r"'b' must be 2-D \(\[K, N\]\), got shape \(4,\)"):
        torch.ops.hk.gemm(torch.ones(3, 4, dtype=bf16), torch.ones(4, dtype=bf16))


@pytest.mark.parametrize("layout", ["neox", "gptj"])
def test_rotary_gradient_is_the_inverse_rotation(layout):
    torch.manual_seed(2)
    cos, sin = rotary_kernel.tables(40, 64)
    x, w = _leaf(2, 33, 3, 64), torch.randn(2, 33, 3, 64)
    (torch.ops.hk.rotary(x, cos, sin, layout, 5) * w).sum().backward()
    want = rotary_kernel.reference(w, cos, sin, layout=layout, offset=5, inverse=True)
    assert _rel_err(x.grad, want) < 1e-5


@pytest.mark.parametrize("causal, window, align, n_kv", [
    (False, None, None, 40), (True, None, None, 40), (True, None, "bottom_right", 70), (False, (8, 3), None, 40)])
def test_attention_gradients_against_float64(causal, window, align, n_kv):
    torch.manual_seed(3)
    q, k, v = _leaf(2, 4, 40, 64, dtype=bf16), _leaf(2, 2, n_kv, 64, dtype=bf16), _leaf(2, 2, n_kv, 64, dtype=bf16)
    wo, wl = torch.randn(2, 4, 40, 64), torch.randn(2, 4, 40)
    win = None if window is None else list(window)
    o, lse = torch.ops.hk.attention(q, k, v, causal, win, align)
    ((o.float() * wo).sum() + (lse * wl).sum()).backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, lse64 = attention_kernel.reference(q64, k64, v64, causal=causal, window=window, align=align)
    ((o64 * wo.double()).sum() + (lse64 * wl.double()).sum()).backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.dtype == bf16 and _rel_err(got, want) < 2e-2      # bf16 inputs, outputs and gradients


@pytest.mark.parametrize("rms, p, bias", [(False, 0.0, True), (False, 0.2, False), (True, 0.0, False),
                                          (True, 0.3, True)])
def test_norm_gradients_against_float64(rms, p, bias):
    torch.manual_seed(4)
    x, r, w = _leaf(33, 160), _leaf(33, 160), _leaf(160)
    b = _leaf(160) if bias else None
    gy, gh = torch.randn(33, 160), torch.randn(33, 160)
    op = torch.ops.hk.rms_norm if rms else torch.ops.hk.dropout_residual_layernorm
    y, h = op(x, r, w, b, p, 11, 5, 1e-5)
    ((y * gy).sum() + (h * gh).sum()).backward()
    leaves64 = [t.detach().double().requires_grad_() for t in (x, r, w) + ((b,) if bias else ())]
    y64, h64 = norm_kernel.reference(*leaves64[:3], leaves64[3] if bias else None, p=p, seed=11, offset=5,
                                     eps=1e-5, rms=rms)
    ((y64 * gy.double()).sum() + (h64 * gh.double()).sum()).backward()
    for got, want in zip((x, r, w, b), leaves64):
        assert _rel_err(got.grad, want.grad) < 1e-4


def test_norm_backward_keeps_no_dropout_mask():
    """Saved for backward: h and the weight only; the mask is regenerated from (p, seed, offset)."""
    x, r, w = _leaf(8, 64), _leaf(8, 64), _leaf(64)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.ops.hk.rms_norm(x, r, w, None, 0.5, 3, 0, 1e-6)
    assert [tuple(t.shape) for t in saved] == [(8, 64), (64,)] and not any(t.dtype == torch.bool for t in saved)


@pytest.mark.parametrize("rms", [False, True])
def test_norm_backward_runs_the_backward_kernel(rms, monkeypatch):
    """Every backward is hk kernels: the norms' runs layernorm_bwd's kernel and its reduction, no torch math."""
    from hk_portable.kernels import layernorm_bwd
    launched = []

    class Spy:                     # records launches; everything else (choose_config, ...) is the kernel's
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __call__(self, *a, **kw):
            launched.append(self.name)
            return self.kernel(*a, **kw)

        def __getattr__(self, attr):
            return getattr(self.kernel, attr)

    for name in ("layernorm_bwd_kernel", "norm_bwd_reduce_kernel"):
        monkeypatch.setattr(layernorm_bwd, name, Spy(getattr(layernorm_bwd, name), name))
    x, r, w, b = _leaf(8, 64), _leaf(8, 64), _leaf(64), _leaf(64)
    op = torch.ops.hk.rms_norm if rms else torch.ops.hk.dropout_residual_layernorm
    op(x, r, w, b, 0.25, 3, 0, 1e-6)[0].sum().backward()
    assert launched == ["layernorm_bwd_kernel", "norm_bwd_reduce_kernel", "norm_bwd_reduce_kernel"]
    assert not hasattr(torch_ops, "HK_TORCH_BACKWARD_FALLBACK") and not hasattr(torch_ops, "_norm_backward_fallback")


def test_ops_follow_the_runtime_selection():
    """No backend argument: the runtime chooses; an explicit spec and hk.use_backend are honoured."""
    a, b = torch.randn(16, 64).to(bf16), torch.randn(64, 16).to(bf16)
    want = torch.ops.hk.gemm(a, b)
    assert torch.equal(torch.ops.hk.gemm(a, b, None, "reference"), want)
    with hk.use_backend("reference"):
        assert torch.equal(torch.ops.hk.gemm(a, b), want)
    with pytest.raises(hk.BackendError):
        torch.ops.hk.gemm(a, b, None, "no_such_backend")


# ----------------------------------------------------------------------------- serving attention (forward)
def _serving_opcheck_cases():
    torch.manual_seed(2)
    cu_q = torch.tensor([0, 5, 25, 26], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 42, 70], dtype=torch.int32)
    q, k, v = torch.randn(26, 4, 64).to(bf16), torch.randn(70, 2, 64).to(bf16), torch.randn(70, 2, 64).to(bf16)
    kc, vc = torch.randn(9, 16, 2, 64).to(bf16), torch.randn(9, 16, 2, 64).to(bf16)
    table = torch.tensor([[3, 1, 8], [0, 2, 5]], dtype=torch.int32)
    lens = torch.tensor([40, 7], dtype=torch.int32)
    return {
        "varlen": (torch.ops.hk.attention_varlen.default, (q, k, v, cu_q, cu_k, 20, 30)),
        "varlen_causal_window": (torch.ops.hk.attention_varlen.default,
                                 (q, k, v, cu_q, cu_k, 20, 30, True, [8, -1], "bottom_right")),
        "varlen_requires_grad": (torch.ops.hk.attention_varlen.default,
                                 (q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_(),
                                  cu_q, cu_k, 20, 30, True, None, "top_left")),
        "varlen_backward": (torch.ops.hk.attention_varlen_backward.default,
                            (q, k, v, *torch.ops.hk.attention_varlen(q, k, v, cu_q, cu_k, 20, 30), q.clone(), cu_q,
                             cu_k, 20, 30)),
        "kvcache_paged_decode": (torch.ops.hk.attention_kvcache.default,
                                 (torch.randn(2, 1, 4, 64).to(bf16), kc, vc, lens, table, False, None, 3)),
        "kvcache_contiguous_causal": (torch.ops.hk.attention_kvcache.default,
                                      (torch.randn(2, 3, 4, 64).to(bf16), kc[:2], vc[:2], torch.tensor(
                                          [16, 9], dtype=torch.int32), None, True)),
    }


@pytest.mark.parametrize("case", list(_serving_opcheck_cases()))
def test_serving_opcheck(case):
    op, args = _serving_opcheck_cases()[case]
    torch.library.opcheck(op, args)


def test_serving_ops_give_the_wrappers_results():
    from hk_portable.kernels.attention_kvcache import attention_kvcache
    from hk_portable.kernels.attention_varlen import attention_varlen
    cases = _serving_opcheck_cases()
    op, args = cases["varlen_causal_window"]
    o, lse = op(*args)
    o2, lse2 = attention_varlen(*args[:7], causal=True, window=(8, None), align="bottom_right")
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    op, args = cases["kvcache_paged_decode"]
    o, lse = op(*args)
    o2, lse2 = attention_kvcache(*args[:5], num_splits=3)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_the_first_op_calls_import_no_dynamo(tmp_path):
    """A process that never compiles loads nothing of torch._dynamo: the ops are registered on the dispatcher
    directly (torch.library.custom_op's per-call wrapper imported it at an op's first call: 2.4 s and 542 modules
    on a CPU). Each op and its backward, in a fresh process, with the compile cache of this test."""
    import subprocess
    import sys
    code = """
import sys, torch
import hk_portable.nn as hnn
from hk_portable.nn import functional as F
from hk_portable.kernels.rotary import tables
bf16 = torch.bfloat16
x = torch.randn(2, 8, 64, dtype=bf16, requires_grad=True)
lin = hnn.Linear(64, 64, bias=False, dtype=bf16)
y = F.rms_norm(lin(x), (64,))
q = torch.randn(1, 2, 8, 64, dtype=bf16, requires_grad=True)
cos, sin = tables(16, 64)
o = F.attention(F.rotary(q, cos, sin, heads_first=True), q, q, causal=True)
(y.float().sum() + o.float().sum()).backward()
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "HK_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("no dynamo")
