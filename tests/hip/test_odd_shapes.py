"""Tile shapes the conformance suite does not use: sizes that are not multiples of 16 (pad rows and
columns inside the library's 16x16 blocks), tiles smaller than one block per wave (replicas), shared
tiles whose rows are not whole 16-byte chunks, and mma with K not a multiple of the MFMA's K. Each
runs on the emulator (both archs) and is compared with the reference backend."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.backends.hip import HipBackend
from hk_portable.backends.hip.archs import make_target
from hk_portable.backends.reference import ReferenceBackend
from hk_portable.interface import GL, RT, RV, ST, f32


@hk.kernel(name="odd_reduce")
def odd_reduce(x: GL[2], y: GL[2], rs: GL[1], cm: GL[2], *, R: hk.const = 24, C: hk.const = 40):
    m, n = hk.block_idx(0), hk.block_idx(1)
    s = hk.shared(ST[x.dtype, R, C])
    hk.load(s, x, (m, n), fill=-1.5)
    t = hk.load(RT[x.dtype, R, C], s).to(f32)
    hk.store(y, t * 2.0 + hk.row_max(t)[:, None], (m, n))
    hk.atomic_add(rs, hk.row_sum(t), (m,))
    hk.store(cm, hk.col_max(t), (m, n))              # one row of cm per row block


@hk.kernel(name="odd_mma")
def odd_mma(a: GL[2], b: GL[2], c: GL[2], *, M: hk.const = 24, K: hk.const = 40, N: hk.const = 8,
            TA: hk.const = False, SRC_B: hk.const = "st"):
    a_t = hk.load(RT[a.dtype, K, M] if TA else RT[a.dtype, M, K], a, (0, 0))
    if SRC_B == "st":
        b_s = hk.shared(ST[b.dtype, K, N])
        hk.load(b_s, b, (0, 0))
        bb = b_s
    else:
        bb = hk.load(RT[b.dtype, K, N], b, (0, 0))
    acc = hk.mma(a_t, bb, hk.zeros(RT[f32, M, N]), trans_a=TA)
    hk.store(c, acc, (0, 0))


@hk.kernel(name="odd_rv")
def odd_rv(x: GL[1], y: GL[1], *, N: hk.const = 10):
    v = hk.load(RV[x.dtype, N], x, (hk.block_idx(0),), fill=3.0)
    hk.store(y, hk.exp2(v) + v, (hk.block_idx(0),))


def _targets():
    from hk_portable.backends.hip import emulator
    if not emulator.available()[0]:
        pytest.skip(emulator.available()[1])
    return ["gfx942", "gfx950"]


class Pinned(HipBackend):
    def __init__(self, arch):
        self._t = make_target(arch, runs=True, emulated=True)

    def default_target(self):
        return self._t


def _run_both(kern, make, grid, arch, **consts):
    outs = []
    for be in (ReferenceBackend(), Pinned(arch)):
        torch.manual_seed(0)
        args = make()
        kern(*args, grid=grid, backend=be, **consts)
        outs.append(args)
    return outs


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("dtype,R,C", [(torch.float32, 24, 40), (torch.bfloat16, 8, 12), (torch.float16, 40, 20)])
def test_odd_reduce(arch, dtype, R, C):
    _targets()
    M, N = 53, 61

    def make():
        return [torch.randn(M, N).to(dtype), torch.full((M, N), float("nan")), torch.zeros(-(-M // R) * R),
                torch.full((-(-M // R), -(-N // C) * C), float("nan"))]
    grid = (-(-M // R), -(-N // C))
    ref, hip = _run_both(odd_reduce, make, grid, arch, R=R, C=C)
    assert torch.equal(ref[1].nan_to_num(7.0), hip[1].nan_to_num(7.0))      # exact: max, *2, +
    assert torch.equal(ref[3], hip[3])
    torch.testing.assert_close(ref[2], hip[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("ta,src_b", [(False, "st"), (True, "st"), (False, "rt"), (True, "rt")])
@pytest.mark.parametrize("M,K,N", [(24, 40, 8), (16, 48, 32), (8, 20, 24)])
def test_odd_mma(arch, ta, src_b, M, K, N):
    _targets()

    def make():
        a = torch.randn(K, M) if ta else torch.randn(M, K)
        return [a.to(torch.bfloat16), torch.randn(K, N).to(torch.bfloat16), torch.full((M, N), float("nan"))]
    ref, hip = _run_both(odd_mma, make, (1,), arch, M=M, K=K, N=N, TA=ta, SRC_B=src_b)
    torch.testing.assert_close(ref[2], hip[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_odd_vector(arch):
    _targets()
    ref, hip = _run_both(odd_rv, lambda: [torch.randn(23), torch.full((23,), float("nan"))], (3,), arch, N=10)
    torch.testing.assert_close(ref[1], hip[1], rtol=2e-6, atol=0)
