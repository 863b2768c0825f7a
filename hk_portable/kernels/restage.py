"""A 2-D tensor copied into rows at a target's alignment (`Target.row_alignment`): what a wrapper hands a kernel
whose operand rows sit where the target's bulk loads cannot read them. A bf16 GEMM with K = 6788 has 13,576-byte
rows: no bulk tensor copies, no 16-byte copies anywhere, so every tile loads element by element (0.02-0.5x the
vendor's GEMM, docs/perf-notes.md 2026-12-07); one pass over the operand buys the fast pipeline back."""
from __future__ import annotations

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT

# legal: whole 16-row, 16-column blocks; no roles, so no backend proposes its GEMM tiles for a copy
TUNABLE = dict(BR=hk.tunable(range(16, 257, 16)), BC=hk.tunable(range(16, 513, 16)), num_warps=hk.tunable(1, 2, 4, 8))
DEFAULT_CONFIG = dict(BR=32, BC=128)


@hk.kernel(num_warps=4, tunable=TUNABLE)
def restage_kernel(src: GL[2], dst: GL[2], *, BR: hk.const = 32, BC: hk.const = 128):
    """dst = src, tile by tile (dst: a view of the same shape, in rows of another stride)."""
    r, c = hk.block_idx(0), hk.block_idx(1)
    hk.store(dst, hk.load(RT[src.dtype, BR, BC], src, (r, c)), (r, c))


def example_args(device="cpu", R=100, C=333, dtype=torch.bfloat16):
    src = torch.randn(R, C, device=device, dtype=dtype)
    return (src, aligned_empty(R, C, dtype, 16, device)), dict(DEFAULT_CONFIG)


def rows_aligned(t: torch.Tensor, alignment: int) -> bool:
    """Whether t [R, C] is unit-stride along its rows with its base and row stride at `alignment` bytes (a row of
    one element, or one row, needs no stride rule)."""
    if alignment <= 1:
        return True
    size = t.element_size()
    unit = t.stride(1) == 1 or t.shape[1] <= 1
    return unit and t.data_ptr() % alignment == 0 and (t.shape[0] <= 1 or t.stride(0) * size % alignment == 0)


def aligned_empty(rows: int, cols: int, dtype, alignment: int, device) -> torch.Tensor:
    """An uninitialised [rows, cols] view whose row stride is `cols` rounded up to `alignment` bytes."""
    per = max(1, alignment // torch.empty((), dtype=dtype).element_size())
    return torch.empty(rows, -(-cols // per) * per, dtype=dtype, device=device)[:, :cols]


def restaged(t: torch.Tensor, alignment: int, backend=None) -> torch.Tensor:
    """t itself where its rows are at `alignment` bytes (rows_aligned), else a copy whose rows are."""
    if rows_aligned(t, alignment):
        return t
    dst = aligned_empty(t.shape[0], t.shape[1], t.dtype, alignment, t.device)
    cfg = {**DEFAULT_CONFIG, **restage_kernel.choose_config([DEFAULT_CONFIG], t, dst, backend=backend, key="restage")}
    restage_kernel(t, dst, grid=(hk.cdiv(t.shape[0], cfg["BR"]), hk.cdiv(t.shape[1], cfg["BC"])),
                   backend=backend, **cfg)
    return dst
