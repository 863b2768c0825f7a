"""Kernels that are not in the library, written here against the public interface only, run on the
reference backend and match torch."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, f32


# ------------------------------------------------------------------------------------- row softmax
@hk.kernel
def row_softmax(x: GL[2], y: GL[2], *, BM: hk.const = 16, BN: hk.const = 64):
    """y = softmax(x, dim=-1) for rows of any length: an online max/sum pass, then a normalising pass."""
    m = hk.block_idx(0)
    n_tiles = hk.cdiv(x.shape[1], BN)

    def tile(j):
        return hk.load(RT[f32, BM, BN], x, (m, j), fill=float("-inf"))     # padding columns weigh exp(-inf) = 0

    def stats(j, row_max, row_sum):
        t = tile(j)
        new_max = hk.maximum(row_max, hk.row_max(t))
        row_sum = row_sum * hk.exp(row_max - new_max) + hk.row_sum(hk.exp(t - new_max[:, None]))
        return new_max, row_sum

    row_max, row_sum = hk.fori_loop(0, n_tiles, stats, (hk.neg_inf(RV[f32, BM]), hk.zeros(RV[f32, BM])))

    def write(j, unused):
        p = hk.exp(tile(j) - row_max[:, None]) / row_sum[:, None]
        hk.store(y, p.to(y.dtype), (m, j))
        return unused

    hk.fori_loop(0, n_tiles, write, 0)


@pytest.mark.parametrize("shape", [(37, 300), (1, 1), (16, 64), (5, 65)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_softmax_matches_torch(shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    y = torch.full(shape, float("nan"), dtype=dtype)
    row_softmax(x, y, grid=(hk.cdiv(shape[0], 16),))
    expected = torch.softmax(x.double(), dim=-1)
    # f32 exp and sums over at most a few hundred terms, then one rounding to the output dtype
    rel = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -18
    assert not y.isnan().any()
    torch.testing.assert_close(y.double(), expected, rtol=rel, atol=1e-30)


# ----------------------------------------------------------------------------- gemm + bias + relu
@hk.kernel
def gemm_bias_relu(a: GL[2], b: GL[2], bias: GL[1], c: GL[2], *, BM: hk.const = 32, BN: hk.const = 32,
                   BK: hk.const = 32):
    """c = relu(a @ b + bias[None, :]) with f32 accumulation, stored in c's dtype."""
    m, n = hk.block_idx(0), hk.block_idx(1)
    a_s = hk.shared(ST[a.dtype, BM, BK], stages=2)
    b_s = hk.shared(ST[b.dtype, BK, BN], stages=2)

    def load(k, s):
        hk.load(a_s[s], a, (m, k))
        hk.load(b_s[s], b, (k, n))

    def compute(k, s, acc):
        return hk.mma(a_s[s], b_s[s], acc)

    acc = hk.pipeline(hk.cdiv(a.shape[1], BK), load, compute, carry=hk.zeros(RT[f32, BM, BN]), stages=2)
    acc = hk.relu(acc + hk.load(RV[f32, BN], bias, (n,))[None, :])
    hk.store(c, acc.to(c.dtype), (m, n))


@pytest.mark.parametrize("M, N, K", [(100, 70, 130), (1, 1, 1), (64, 64, 64)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gemm_bias_relu_matches_torch(M, N, K, out_dtype):
    gen = torch.Generator().manual_seed(M * N * K)
    a = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    b = torch.randn(K, N, generator=gen).to(torch.bfloat16)
    bias = torch.randn(N, generator=gen)
    c = torch.full((M, N), float("nan"), dtype=out_dtype)
    gemm_bias_relu(a, b, bias, c, grid=(hk.cdiv(M, 32), hk.cdiv(N, 32)))
    expected = torch.relu(a.double() @ b.double() + bias.double())
    # f32 accumulation over K terms, then one rounding to the output dtype; relative to sum |a||b| + |bias|
    scale = a.double().abs() @ b.double().abs() + bias.double().abs()
    rel = (2.0 ** -7 if out_dtype == torch.bfloat16 else 0.0) + K * 2.0 ** -23
    err = (c.double() - expected).abs()
    assert not c.isnan().any()
    assert (err <= rel * scale).all(), f"max error {float((err / scale).max())} > {rel}"
    assert (c[expected == 0] == 0).all()                  # relu is exact
