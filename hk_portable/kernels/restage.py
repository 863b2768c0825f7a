"""A 2-D tensor copied into rows at a target's alignment (`Target.row_alignment`): what a wrapper hands a kernel
whose operand rows sit where the target's bulk loads cannot read them. A bf16 GEMM with K = 6788 has 13,576-byte
rows: no bulk tensor copies, no 16-byte copies anywhere, so every tile loads element by element (0.02-0.5x the
vendor's GEMM, docs/perf-notes.md 2026-12-07); one pass over the operand buys the fast pipeline back."""
from __future__ import annotations

from dataclasses import dataclass

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
    return torch.empty(rows, padded(cols, dtype, alignment), dtype=dtype, device=device)[:, :cols]


def padded(cols: int, dtype, alignment: int) -> int:
    per = max(1, alignment // dtype.itemsize)
    return -(-cols // per) * per


@dataclass(frozen=True)
class Restage:
    """How a wrapper restages one operand, decided once per call signature: the row length it pads to, and the
    copy's configuration and grid."""
    cols: int
    config: dict
    grid: tuple

    def __call__(self, t: torch.Tensor, backend=None) -> torch.Tensor:
        dst = torch.empty(t.shape[0], self.cols, dtype=t.dtype, device=t.device)[:, :t.shape[1]]
        restage_kernel(t, dst, grid=self.grid, backend=backend, **self.config)
        return dst


def restage_plan(t: torch.Tensor, alignment: int, backend=None) -> Restage | None:
    """None where t's rows are at `alignment` bytes (rows_aligned), else how to copy it into rows that are."""
    if rows_aligned(t, alignment):
        return None
    dst = aligned_empty(t.shape[0], t.shape[1], t.dtype, alignment, t.device)
    cfg = {**DEFAULT_CONFIG, **restage_kernel.choose_config([DEFAULT_CONFIG], t, dst, backend=backend, key="restage")}
    return Restage(padded(t.shape[1], t.dtype, alignment), cfg,
                   (hk.cdiv(t.shape[0], cfg["BR"]), hk.cdiv(t.shape[1], cfg["BC"])))


def restaged(t: torch.Tensor, alignment: int, backend=None) -> torch.Tensor:
    """t itself where its rows are at `alignment` bytes, else a copy whose rows are."""
    how = restage_plan(t, alignment, backend)
    return t if how is None else how(t, backend)
