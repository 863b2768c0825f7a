"""GEMM on any shape (issue 39 item 4): operands whose rows are not at the target's alignment are restaged
(kernels/restage.py) so the fast pipeline reads them; a grid of few output tiles over a long K is split (split-K:
gemm_split_kernel's f32 partial products, summed in a fixed order by gemm_reduce_kernel). Checked against float64
on fresh random inputs with poisoned outputs, on the reference and both emulators; the sm_90a builds offline; the
GPU run under `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.kernels import gemm as G
from hk_portable.kernels.restage import aligned_empty, restage_kernel, restaged, rows_aligned

BACKENDS = ["reference", "cuda:sm_80:emulated", "hip:gfx942:emulated"]


def _rel(out, a, b) -> float:
    ref = a.double() @ b.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def _operands(M, N, K, layout, device="cpu", dtype=torch.bfloat16):
    a = torch.randn(K, M, device=device, dtype=dtype).t() if layout[0] == "t" else \
        torch.randn(M, K, device=device, dtype=dtype)
    b = torch.randn(N, K, device=device, dtype=dtype).t() if layout[1] == "t" else \
        torch.randn(K, N, device=device, dtype=dtype)
    return a, b


# ------------------------------------------------------------------------------------------------ restage
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("R,C", [(70, 333), (1, 9), (129, 17)])
def test_restage_copies_every_element_into_aligned_rows(backend, R, C):
    src = torch.randn(R, C, dtype=torch.bfloat16)
    dst = aligned_empty(R, C, torch.bfloat16, 16, "cpu")
    dst.fill_(float("nan"))
    cfg = dict(BR=32, BC=128)
    restage_kernel(src, dst, grid=(hk.cdiv(R, 32), hk.cdiv(C, 128)), backend=backend, **cfg)
    assert torch.equal(dst, src)
    assert rows_aligned(dst, 16) and dst.stride(0) % 8 == 0


def test_rows_aligned_reads_base_stride_and_unit_stride():
    x = torch.randn(8, 40, dtype=torch.bfloat16)
    assert rows_aligned(x, 16)                            # 80-byte rows
    assert not rows_aligned(x[:, :37].contiguous(), 16)   # 74-byte rows
    assert rows_aligned(x[:, :37], 16)                    # a view: the stride is 80 bytes
    assert not rows_aligned(x[:, 1:], 16)                 # base 2 bytes in
    assert not rows_aligned(x.t(), 16)                    # not unit-stride along its rows
    assert rows_aligned(x[:, :37].contiguous(), 1)        # no rule where the target has none
    y = torch.randn(5, 3, dtype=torch.bfloat16)
    assert restaged(y, 1) is y and restaged(x, 16) is x


# ------------------------------------------------------------------------------------------------ split-K
def test_split_count_fills_the_units_once_and_never_splits_a_full_grid():
    assert G.split_count(tiles=4, k_steps=107, units=132) == 26         # K steps bound it: 4 a run at least
    assert G.split_count(tiles=4, k_steps=1000, units=132) == 33        # the units bound it
    assert G.split_count(tiles=1, k_steps=10_000, units=132) == G.MAX_SPLITS
    assert G.split_count(tiles=67, k_steps=1000, units=132) == 1        # half the units are filled already
    assert G.split_count(tiles=4, k_steps=7, units=132) == 1            # too short to split
    assert G.split_count(tiles=40, k_steps=1000, units=132) == 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_split_k_gemm_matches_float64(backend, layout):
    torch.manual_seed(hash((backend, layout)) % 2**31)
    M, N, K = 100, 70, 1001                # ragged everywhere; 4 tiles at most, K splits
    a, b = _operands(M, N, K, layout)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    G._PLANS._plans.clear()
    G.gemm(a, b, out, backend=backend)
    plan = G._plan(a, b, out, backend)
    assert plan.splits > 1 and plan.reduce is not None
    restages = backend != "reference"     # rows of 2002, 140 or 200 bytes: restaged where the target asks for 16
    assert (plan.restage_a is not None, plan.restage_b is not None) == (restages, restages)
    assert _rel(out, a, b) < 8e-3
    ref = torch.full_like(out, float("nan"))
    G.gemm(a, b, ref, backend="reference")
    assert (out.float() - ref.float()).abs().max() <= 0.02 * ref.float().abs().max()


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_split_k_runs_are_bitwise_repeatable(backend):
    a, b = _operands(64, 48, 520, "nn")
    outs = []
    for _ in range(2):
        out = torch.full((64, 48), float("nan"), dtype=torch.float32)
        G.gemm(a, b, out, backend=backend)
        outs.append(out)
    assert G._plan(a, b, outs[0], backend).splits > 1
    assert torch.equal(outs[0], outs[1])


def test_a_full_grid_runs_one_kernel_and_a_short_k_none_split():
    a, b = _operands(64 * 12, 64 * 12, 4096, "nn")          # 144 tiles of 64 x 64 on the modelled 132 units
    out = torch.empty(64 * 12, 64 * 12, dtype=torch.bfloat16)
    assert G._plan(a, b, out, "reference").splits == 1
    a, b = _operands(100, 70, 64, "nn")
    assert G._plan(a, b, torch.empty(100, 70, dtype=torch.bfloat16), "reference").splits == 1


@pytest.mark.parametrize("backend", ["cuda:sm_80:emulated", "hip:gfx950:emulated"])
def test_misaligned_operands_without_split_match_float64(backend):
    torch.manual_seed(7)
    M, N, K = 1100, 1100, 75              # a full grid, short K: restaged, one kernel
    a, b = _operands(M, N, K, "nt")
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    G.gemm(a, b, out, backend=backend)
    plan = G._plan(a, b, out, backend)
    assert plan.splits == 1 and plan.restage_a is not None and plan.restage_b is not None
    assert _rel(out, a, b) < 8e-3


# ------------------------------------------------------------------------------------------------ sm_90a offline
def test_split_kernel_builds_on_tma_and_wgmma_for_sm90a_without_spills():
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")
    M, N, K = 171, 245, 6792
    a = torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    b = torch.empty(N, K, dtype=torch.bfloat16, device="meta")
    part = torch.empty(2, M, N, device="meta")
    flags = dict(A_KM=False, B_NK=True)
    cfg = G.gemm_split_kernel.choose_config([{**G.DEFAULT_CONFIG, **c, **flags} for c in G.SPLIT_CONFIGS],
                                            a, b, part, backend="cuda:sm_90a")
    assert (cfg["BM"], cfg["BN"]) == (128, 128)
    art = G.gemm_split_kernel.compile(a, b, part, backend="cuda:sm_90a", **{**G.DEFAULT_CONFIG, **cfg, **flags})
    assert art.resources["spill_stores"] == 0 and art.resources["spill_loads"] == 0
    assert "cp.async.bulk.tensor" in art.asm and "wgmma.mma_async" in art.asm


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(171, 245, 6788), (3236, 131, 1839), (2769, 6235, 1205), (354, 830, 189),
                                   (129, 139, 71)])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_ragged_shapes_on_the_gpu_match_float64(M, N, K, layout):
    be = hk.get_backend("cuda")
    if not be.status().available:
        pytest.skip(f"cuda backend unusable here: {be.status().reason}")
    torch.manual_seed(M * N + K)
    a, b = _operands(M, N, K, layout, device="cuda")
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.gemm(a, b, out, backend="cuda")
    torch.cuda.synchronize()
    assert _rel(out, a, b) < 8e-3
