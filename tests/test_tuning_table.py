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
    """No hip rule: hip's choose_config over the kernel's whole list takes what it took over the band-filtered one."""
    for N in (1024, 16384):
        assert _choice(f"hip:{arch}", 64, True, N) == dict(BM=64, BN=64)
        assert _choice(f"hip:{arch}", 128, False, N) == dict(BM=256, BN=64, num_warps=8)
