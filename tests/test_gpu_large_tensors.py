"""Every library kernel on tensors past 2^31 elements (issue 14, item 3), on the GPU: 64-bit offsets in the
loads and stores, TMA coordinates, block indices and the Philox counter. Each result is checked on its first
and last slices against float64 math (torch as the oracle). About 60 GB of GPU memory at the peak (attention
backward); a machine without a usable cuda backend skips with the backend's reason.

    python -m pytest tests/test_gpu_large_tensors.py     # on a GPU (benchmarks/h200_cuda_check.sh runs it)
"""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.kernels import layernorm as LN
from hk_portable.kernels import rotary as ROT
from hk_portable.kernels.attention import attention_fwd
from hk_portable.kernels.attention_bwd import attention_bwd
from hk_portable.kernels.gemm import gemm
from hk_portable.kernels.layernorm_bwd import dropout_residual_layernorm_bwd

pytestmark = pytest.mark.gpu
BIG = 2 ** 31


@pytest.fixture(scope="module", autouse=True)
def cuda():
    be = hk.get_backend("cuda")
    st = be.status()
    if not st.available:
        pytest.skip(f"cuda backend unusable here: {st.reason}")
    free, _ = torch.cuda.mem_get_info()
    if free < 70 * 2 ** 30:
        pytest.skip(f"needs ~70 GB of free GPU memory for tensors past 2^31 elements, {free / 2**30:.0f} GB free")
    yield
    torch.cuda.empty_cache()


def _close(actual, expected, tol):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


def test_gemm_with_an_operand_past_2_31_elements():
    M, K, N = 2 ** 20 + 33, 2048, 256
    assert M * K > BIG
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / 32
    c = gemm(a, b, out_dtype=torch.float32)
    for rows in (slice(0, 64), slice(M - 64, M)):
        _close(c[rows], a[rows].double() @ b.double(), 2e-3)


def test_layernorm_forward_and_backward_past_2_31_elements():
    rows, d, p = 2 ** 20 + 17, 2048, 0.1
    assert rows * d > BIG
    x, res = (torch.randn(rows, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, bias = torch.randn(d, device="cuda"), torch.randn(d, device="cuda")
    y, h = LN.dropout_residual_layernorm(x, res, w, bias, p=p, seed=1234, offset=77)
    for r0 in (0, rows - 8):
        sl = slice(r0, r0 + 8)
        # the Philox counter of element (r, c) is offset + r * d + c: a slice starting at row r0 shifts it
        y_ref, h_ref = LN.reference(x[sl].cpu(), res[sl].cpu(), w.cpu(), bias.cpu(), p=p, seed=1234,
                                    offset=77 + r0 * d)
        _close(h[sl].cpu(), h_ref, 2e-2)
        _close(y[sl].cpu(), y_ref, 5e-2)
    del x, res, y
    dy = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    dx, dres, _, _ = dropout_residual_layernorm_bwd(dy, h, w, bias)      # p = 0: dx = dres = dh
    for r0 in (0, rows - 8):
        sl = slice(r0, r0 + 8)
        hd = h[sl].double().requires_grad_()
        yd = torch.nn.functional.layer_norm(hd, (d,), w.double(), bias.double(), eps=1e-5)
        (grad,) = torch.autograd.grad(yd, hd, dy[sl].double())
        _close(dx[sl], grad, 5e-2)
        _close(dres[sl], grad, 5e-2)


def test_rotary_past_2_31_elements():
    B, H, N, D = 2, 8, 2 ** 20 + 8, 128
    assert B * H * N * D > BIG
    x = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    cos, sin = ROT.tables(N, D, device="cuda")
    y = ROT.rotary(x, cos, sin, heads_first=True)
    for b in (0, B - 1):
        tail = slice(N - 16, N)
        ref = ROT.reference(x[b:b + 1, :, tail].cpu(), cos.cpu(), sin.cpu(), offset=N - 16, heads_first=True)
        _close(y[b:b + 1, :, tail].cpu(), ref, 2e-2)


def test_attention_forward_and_backward_past_2_31_elements():
    B, H, N, D = 520, 16, 2048, 128
    assert B * H * N * D > BIG
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = attention_fwd(q, k, v, causal=True)
    do = torch.randn_like(q)
    dq, dk, dv = attention_bwd(q, k, v, o, lse, do, causal=True)
    for b in (0, B - 1):
        sl = slice(b, b + 1)
        qs, ks, vs = (t[sl].float().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        _close(o[sl], ref, 2e-2)
        grads = torch.autograd.grad(ref, (qs, ks, vs), do[sl].float())
        for got, want in zip((dq, dk, dv), grads):
            _close(got[sl], want, 5e-2)
