"""What a cuda kernel occupies in a block, read by the schedule (which decides what fits) and the emitter (which lays
it out): the block's warps, the layout pass's choice, the library's shared scratch (column reductions, register mma
operands the fragments cannot read in place) and the arena of shared buffers with the schedule's own uses of it.
"""
from __future__ import annotations

from types import SimpleNamespace

from ...codegen import resources
from ...codegen.layouts import Strip, assign_layouts, strip_reduce_scratch
from ...codegen.resources import SMEM_ALIGN, mma_scratch_bytes
from ...interface.backend import Target
from ...interface.ir import Program
from . import archs

MAX_WARPS = 16
BUFFER_ALIGN = 1024     # shared buffers start on a 128-byte-swizzle atom: wgmma/TMA read the block layout there
TMA_STORE_CHUNK_BYTES = 64 * 64 * 2      # one chunk of a warpgroup's rows: 64 rows of one 128-byte column block


def base_slack(target: Target) -> int:
    """Dynamic shared bytes reserved so smem_base() can round the window up to BUFFER_ALIGN (the async path)."""
    return BUFFER_ALIGN if archs.of(target).async_tensor_core else 0


def num_warps(program: Program, target: Target) -> int:
    """The kernel's hint, within what one block can run (the same on sm_80 and sm_90a for now)."""
    return max(1, min(int(program.num_warps), MAX_WARPS))


def layouts(program: Program, warps: int) -> dict:
    """The layout pass's choice for this backend (its library implements strips, narrow ones included)."""
    return assign_layouts(program, warps, strips=True, narrow=True)


def _op_scratch(op, warps: int, lay: dict) -> int:
    """Scratch bytes one op needs, as hk_cuda's reductions and mma compute them."""
    if op.opcode == "reduce":
        rows, cols = op.operands[0].type.shape
        layout = lay.get(op.operands[0])
        if isinstance(layout, Strip):
            return strip_reduce_scratch(op, layout, warps)
        if op.attrs["axis"] == "col":
            return warps * cols * 4 if min(rows // 16, warps) > 1 else 0
    if op.opcode == "mma":
        return mma_scratch_bytes(op.operands[0].type, op.operands[1].type, op.attrs["trans_a"], SMEM_ALIGN)
    return 0


def scratch_bytes(program: Program, warps: int, lay: dict | None = None) -> int:
    """Scratch shared memory the library uses (128-byte granules); `lay`: the layouts, where already assigned."""
    lay = layouts(program, warps) if lay is None else lay
    return resources.scratch_bytes(program.body.walk(), lambda op: _op_scratch(op, warps, lay), SMEM_ALIGN)


def tma_store_buffers(program: Program, plan) -> int:
    """Chunk buffers each consumer warpgroup stages its TMA stores and reduce-adds through (hk::store_tma's and
    hk::reduce_tma's BUFS): two, so one is written while the other's copy reads it, or one where every stored tile
    is a single chunk wide (a reduce-add always takes two: f32 chunks are 32 columns)."""
    stores, reduces = plan.tma_stores, getattr(plan, "tma_reduces", None) or {}
    chunks = max((o.operands[1].type.cols * 2 // 128 for o in program.body.ops if id(o) in stores), default=0)
    return 2 if reduces else min(chunks, 2)


def tma_store_bytes(program: Program, plan) -> int:
    """Shared bytes the TMA stores and reduce-adds stage through: each consumer warpgroup's chunk buffers (they
    share them)."""
    return program.num_warps // 4 * tma_store_buffers(program, plan) * TMA_STORE_CHUNK_BYTES


def prologue_stride(buf) -> int:
    """Bytes from one copy of a prologue buffer to the next (each on a swizzle atom)."""
    return resources.round_up(buf.type.nbytes, BUFFER_ALIGN)


def slots(program: Program, plan, buffers) -> list:
    """What the arena holds: each buffer (a prologue buffer's Plan.prologue_stages copies, one after another),
    then the area the TMA stores and reduce-adds stage through (Plan.tma_stores, Plan.tma_reduces)."""
    producers = {r: o for o in program.body.walk() for r in o.results}
    extra = plan.prologue_stages - 1
    out = [SimpleNamespace(nbytes=b.type.nbytes + extra * prologue_stride(b))
           if extra and id(producers[b]) in plan.prologue_buffers else b.type for b in buffers]
    staged = tma_store_bytes(program, plan)
    return out + [SimpleNamespace(nbytes=staged)] if staged else out


def fits(program: Program, plan, target: Target) -> bool:
    """Whether the block's shared memory (the arena with the plan's uses of it, the scratch, the slack) fits."""
    arena = resources.arena_layout(slots(program, plan, [op.result for op in program.shared_buffers()]),
                                   BUFFER_ALIGN)[1]
    scratch = scratch_bytes(program, num_warps(program, target), plan.layouts)
    return resources.shared_bytes(arena, scratch) + base_slack(target) <= target.max_shared_bytes
