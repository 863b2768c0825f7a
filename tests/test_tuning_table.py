"""Tuning as data (issue 38): kernels offer legal candidates, a backend's tuning table ranks them per target and
shape (Backend.preferred; cuda: backends/cuda/preferences.py), its choose_config takes the first ranked on a fast
path. The choices below are the ones the kernels' own band-filtered candidate lists gave before the table existed
(every D, mask and band on cuda sm_90a / sm_80 and hip gfx942 / gfx950 were compared: none changed)."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.kernels import attention
from hk_portable.interface.backend import ranked

W8, W12 = dict(BM=128, BN=128, num_warps=8), dict(BM=192, BN=128, num_warps=12)


def test_ranking_keeps_the_preferred_in_order_then_the_baseline():
    ok = [({"BM": 192, "num_warps": 12}, "p192"), ({"BM": 128, "num_warps": 8}, "p128"), ({"BM": 64}, "base")]
    def rank(prefs):
        return [p for _, p in ranked(ok, prefs, config=lambda pair: pair[0])]
    assert rank([{"BM": 128}, {"BM": 192}]) == ["p128", "p192", "base"]
    assert rank([]) == rank([{"BM": 64}]) == rank([{"BM": 256}]) == ["base"]


def _choice(spec, D, masked, N):
    q = torch.empty(2, 4, N, D, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(2, 4, N, dtype=torch.float32, device="meta")
    args = (q, q, q, torch.empty_like(q), lse, 0.1, 0, 0, 0)
    consts = {"D": D, "MASKED": masked, "LEFT_BOUND": False}
    cfg = attention.attention_fwd_kernel.choose_config(attention.candidates(consts, args), *args, backend=spec,
                                                       bucket=hk.shape_bucket(8, N, N, D))
    return {k: cfg[k] for k in ("BM", "BN", "num_warps") if k in cfg}


@pytest.mark.parametrize("D, masked, N, want", [
    (64, False, 1024, W8), (64, False, 2048, W12), (64, False, 16384, W12),
    (64, True, 1024, dict(BM=64, BN=64)), (64, True, 4096, W8), (64, True, 16384, W12),
    (128, False, 1024, W8), (128, True, 16384, W8),
])
def test_the_cuda_table_ranks_attention_on_the_async_path(D, masked, N, want):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy (with NVRTC) is not installed")
    assert _choice("cuda:sm_90a", D, masked, N) == want
    base = attention.config_for(D)
    assert _choice("cuda:sm_80", D, masked, N) == dict(BM=base["BM"], BN=base["BN"])     # no rule: the baseline


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_the_table_leaves_hip_its_own_choice(arch):
    """No hip rule: hip's choose_config over the kernel's whole list takes what it took over the band-filtered one:
    the 256x64 block of 8 waves at both D (D=64 since 2026-12-07, issue 37 item 3: 64x64 on 4 waves before)."""
    for N in (1024, 16384):
        assert _choice(f"hip:{arch}", 64, True, N) == dict(BM=256, BN=64, num_warps=8)
        assert _choice(f"hip:{arch}", 128, False, N) == dict(BM=256, BN=64, num_warps=8)


# ------------------------------------------------------------------------------------- hip: gemm (issue 37, item 2)
def _gemm_choice(spec, M, layout="nn", N=512, K=512):
    from hk_portable.kernels import gemm
    a = torch.empty(K, M, dtype=torch.bfloat16, device="meta").t() if layout[0] == "t" else \
        torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    b = torch.empty(N, K, dtype=torch.bfloat16, device="meta").t() if layout[1] == "t" else \
        torch.empty(K, N, dtype=torch.bfloat16, device="meta")
    out = torch.empty(M, N, dtype=torch.float32, device="meta")
    a_in, b_in, a_km, b_nk = gemm.layout_of(a, b)
    cfg = gemm.gemm_kernel.choose_config(gemm.candidates({"A_KM": a_km, "B_NK": b_nk}, (a_in, b_in, out)),
                                         a_in, b_in, out, backend=spec, bucket=hk.shape_bucket(M, N, K))
    return {k: cfg[k] for k in ("BM", "BN", "BK", "STAGES", "num_warps") if k in cfg}


DEEP = {"BM": 256, "BN": 256, "BK": 32, "STAGES": 3, "num_warps": 8}
SHALLOW = {"BM": 256, "BN": 256, "BK": 16, "STAGES": 3, "num_warps": 8}
SKINNY = {"BM": 64, "BN": 64, "BK": 64, "STAGES": 4, "num_warps": 4}


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_the_hip_table_puts_gfx950_gemm_on_the_full_rate_mfma(layout):
    """gfx950's 16-bit MFMA of K=32 runs at full rate (Arch.mfma_16bit_k32): its gemm takes the 256x256 block with
    K steps of 32 in every operand layout; a product of at most 64 rows keeps the kernel's 64x64 tiles. gfx942 (no
    such form; its LDS holds no 3 stages of the deep block either) keeps 256x256x16."""
    assert _gemm_choice("hip:gfx950", 4096, layout) == _gemm_choice("hip:gfx950", 65, layout) == DEEP
    assert _gemm_choice("hip:gfx950", 64, layout) == SKINNY
    assert _gemm_choice("hip:gfx942", 4096, layout) == SHALLOW and _gemm_choice("hip:gfx942", 64, layout) == SKINNY


def test_the_hip_table_follows_the_arch_rows():
    """The rule's capability is the cycle table's fact (the x32 form in the 16x16x16 form's cycles), and its skinny
    threshold is the kernel's."""
    from hk_portable.backends.hip import archs, preferences
    from hk_portable.kernels import gemm
    for row in archs.ARCHS.values():
        c = row.mfma_cycles
        assert row.mfma_16bit_k32 == ((16, 16, 32, "f16") in c and c[16, 16, 32, "f16"] <= c[16, 16, 16, "f16"])
        # mma.h's f8f6f4 fp8 form: 4x the 16x16x32 fp8 form's work in fewer than 4x its cycles
        assert row.mfma_f8f6f4 == ((16, 16, 128, "f8f6f4") in c and c[16, 16, 128, "f8f6f4"] < 4 * c[16, 16, 32, "f8"])
    assert preferences.SKINNY_ROWS == gemm.SKINNY_ROWS
    assert preferences.GEMM_DEEP_K in gemm.CONFIGS
