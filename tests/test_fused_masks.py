"""Masks evaluated inside their select (codegen/patterns.fused_masks): a where whose mask is a tree of causal and
bounds masks is compiled into one per-element predicate on cuda (hk::where_at, thresholds clamped once per call).
Checked here bit for bit against int64 math at offsets up to the int32 limits, where a 32-bit comparison done
naively would overflow, on the reference backend, cuda's emulated target (the same device library) and hip's
wave64 emulator (whose masks still compare in 64 bits per element)."""
from __future__ import annotations

import pytest
import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, f32

R = C = 32
I32_MIN, I32_MAX = -2**31, 2**31 - 1


@hk.kernel(num_warps=4)
def masked_select(x: GL[2], y: GL[2], ro: int, co: int, ro2: int, co2: int, bro: int, bco: int, nr: int, nc: int):
    t = hk.load(RT[f32, R, C], x, (0, 0))
    keep = hk.bounds_mask(t, bro, bco, nr, nc) & hk.causal_mask(t, ro, co) & ~hk.causal_mask(t, ro2, co2)
    hk.store(y, hk.where(keep, t, -1.0), (0, 0))


def _expected(x, ro, co, ro2, co2, bro, bco, nr, nc):
    r = torch.arange(R, dtype=torch.int64).view(-1, 1)
    c = torch.arange(C, dtype=torch.int64).view(1, -1)
    keep = ((bro + r >= 0) & (bro + r < nr) & (bco + c >= 0) & (bco + c < nc)
            & (ro + r >= co + c) & ~(ro2 + r >= co2 + c))
    return torch.where(keep, x, torch.tensor(-1.0))


# (causal ro, co), (the negated causal's ro2, co2), (bounds ro, co, n_rows, n_cols): plain edges, and offsets whose
# differences overflow int32 (row_off - col_off up to 2**32 - 1) while the bounds keep some or all of the tile
CASES = [(0, 0, -5, 0, 0, 0, R, C), (5, -3, 2, 10, 3, -4, 20, 17),
         (I32_MAX, I32_MIN, I32_MIN, I32_MAX, 0, 0, R, C), (I32_MIN, I32_MAX, I32_MAX, I32_MIN, 0, 0, R, C),
         (I32_MAX - 40, I32_MIN + 3, I32_MIN + 9, I32_MAX - 2, I32_MAX - 40, I32_MIN, I32_MAX, 9),
         (I32_MAX - 10, I32_MAX - 20, 0, 12, -16, -16, 8, 8), (2**30, 2**30 + 9, 2**30 + 3, 2**30, 0, 5, R, C)]


@pytest.mark.parametrize("backend", ["reference", "cuda:sm_80:emulated", "hip:gfx942:emulated"])
@pytest.mark.parametrize("case", CASES)
def test_masks_in_a_select_match_int64_math(backend, case):
    x = torch.randn(R, C, generator=torch.Generator().manual_seed(sum(case) % 1000))
    y = torch.full((R, C), float("nan"))
    masked_select(x, y, *case, grid=(1,), backend=backend)
    assert torch.equal(y, _expected(x, *case))


def test_cuda_evaluates_the_mask_tree_in_the_select():
    meta = torch.empty(R, C, device="meta")
    src = masked_select.compile(meta, meta, 0, 0, 0, 0, 0, 0, R, C, backend="cuda:sm_80").source
    body = src[src.index("// ---- kernel"):]
    assert "hk::where_at(" in body and "hk::causal_at(" in body and "hk::bounds_at(" in body
    assert "rt<bool" not in body and "hk::causal_mask(" not in body     # no mask tile is built
