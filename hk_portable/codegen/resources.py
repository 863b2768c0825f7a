"""Shared-memory sizing on the host, once for every backend: the arena that holds a kernel's shared
buffers, the scratch area the device libraries use after it, and the rounding both use.

A block's dynamic shared memory is [arena | scratch]:
  * the arena: each shared buffer at a SMEM_ALIGN-aligned offset, in program order (the emitter hands
    each buffer its offset, so the numbers here and in the generated source cannot drift);
  * the scratch: what the device library needs for exchanges between warps/waves (column reductions,
    mma register operands it cannot read in place), at the arena's end rounded to SMEM_ALIGN.
How much scratch one op needs is the device library's formula: the mma operand part is the same in both
libraries (`mma_scratch_bytes`), the column-reduction part is each backend's own.
"""
from __future__ import annotations

from typing import Callable, Iterable

SMEM_ALIGN = 128            # each shared buffer, and the scratch area, starts on a 128-byte boundary


def round_up(x: int, align: int) -> int:
    """x rounded up to a multiple of align."""
    return -(-x // align) * align


def arena_layout(buffers: Iterable, align: int = SMEM_ALIGN) -> tuple[list[int], int]:
    """(offset of each buffer, arena bytes) for shared buffers of the given types (each has .nbytes):
    every buffer starts at an `align`-aligned offset (a backend may need more than SMEM_ALIGN, e.g. the
    1024 bytes of a 128-byte swizzle atom); the total is not rounded."""
    offsets, total = [], 0
    for t in buffers:
        total = round_up(total, align)
        offsets.append(total)
        total += t.nbytes
    return offsets, total


def arena_bytes(program, align: int = SMEM_ALIGN) -> int:
    """The bytes of a Program's shared buffers, laid out as the emitter lays them out."""
    return arena_layout((op.result.type for op in program.shared_buffers()), align)[1]


def scratch_offset(arena: int) -> int:
    """Where the library's scratch area starts: after the arena, on a SMEM_ALIGN boundary."""
    return round_up(arena, SMEM_ALIGN)


def shared_bytes(arena: int, scratch: int) -> int:
    """A block's dynamic shared memory: the arena, then the scratch area."""
    return scratch_offset(arena) + scratch


def mma_scratch_bytes(a, b, trans_a: bool, align: int) -> int:
    """Scratch one mma needs for operands the fragments cannot read in place, as both device libraries
    compute it: a transposed register A, or any fp8 one (its bytes rounded to `align`, the library's
    alignment of the B part that follows), then any register B."""
    fp8_a = a.dtype.name.startswith("fp8")
    a_bytes = round_up(a.rows * a.cols * a.dtype.bits // 8, align) if a.space == "rt" and (trans_a or fp8_a) else 0
    b_bytes = b.rows * b.cols * b.dtype.bits // 8 if b.space == "rt" else 0
    return a_bytes + b_bytes


def scratch_bytes(ops: Iterable, op_scratch: Callable[[object], int], align: int) -> int:
    """The scratch area: the largest need of any op (ops share it one at a time), rounded to `align`;
    0 when no op needs any."""
    need = max((op_scratch(op) for op in ops), default=0)
    return round_up(need, align) if need else 0
