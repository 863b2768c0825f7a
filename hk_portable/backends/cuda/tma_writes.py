"""Which register tiles leave a specialised sm_90a kernel through shared memory and TMA (schedule.py's tma_stores and
tma_reduces decisions), and the plan's list of tensor maps they add to: the epilogue's stores of whole 16-bit tiles
(hk::store_tma) and the atomic adds of whole f32 tiles (hk::reduce_tma, TMA reduce-add).
"""
from __future__ import annotations

from ...interface import opcodes
from ...interface.ir import Program, TileType
from .dataflow import TMA_SWIZZLE_BYTES, TmaLoad


def _read_tensors(program: Program) -> set:
    """Ids of the tensors the kernel reads (a write by TMA lands after the kernel moved on: never into these)."""
    return {o.operands[1].id for o in program.body.walk() if o.opcode == "global_to_shared"} | {
        o.operands[0].id for o in program.body.walk() if o.opcode in opcodes.moves("global", ("register", "scalar"))}


def map_index(maps: list[TmaLoad], spec: TmaLoad) -> int:
    """The index of the tensor map `spec` among the plan's, added where new."""
    if spec not in maps:
        maps.append(spec)
    return maps.index(spec)


def stores(program: Program, params: dict, strips: frozenset, maps: list[TmaLoad]) -> dict:
    """A specialised kernel's stores of a whole register tile after its pipelines (the epilogue) go through shared
    memory and TMA (hk::store_tma): each consumer warpgroup writes its 64 rows to shared memory a 64-column chunk
    at a time and one thread copies each chunk out, so the warpgroup leaves the tile after a few shared stores
    instead of many global ones.
    Taken for a 16-bit tile of the tensor's dtype in the fragment layout (not a strip, `strips`: the ids of
    values the layout pass made strips), one 16-row block per warp (the wgmma accumulator's rows), whole 128-byte
    column blocks, at tile indices, into a tensor the kernel never reads (the copy lands after the kernel moved on)."""
    stores = {}
    read = _read_tensors(program)
    for op in (o for o in program.body.ops if o.opcode == "register_to_global"):
        gl, src = op.operands[:2]
        t = src.type
        if (not isinstance(t, TileType) or t.space != "rt" or src.id in strips or t.dtype.itemsize != 2
                or t.dtype != gl.type.dtype or gl.id not in params or gl.id in read or gl.type.rank < 2
                or len(op.operands) - 2 != gl.type.rank or t.rows != 16 * program.num_warps
                or (t.cols * 2) % TMA_SWIZZLE_BYTES):
            continue
        stores[id(op)] = map_index(maps, TmaLoad(params[gl.id], gl.type.rank, gl.type.dtype.name, 64,
                                                  TMA_SWIZZLE_BYTES // 2, store=True))
    return stores


def reduces(program: Program, params: dict, strips: frozenset, maps: list[TmaLoad]) -> dict:
    """A specialised kernel's atomic adds of a whole f32 register tile (in or after its pipelines) go through shared
    memory and TMA reduce-add (hk::reduce_tma): {op id: (map as the parameter views the tensor, map of the tensor a
    transposed view views, -1 where the tile cannot take that form)}. The launch encodes whichever its argument
    allows (tma.py: bits 2 and 3 of the flag); neither: the as-viewed chunks added from shared memory by every thread
    (hk::reduce_viewed without a map). The build search gives the adds up where their build spills (backend._build). Taken for a fragment-layout tile (not
    a strip) of one 16-row block per warp (the wgmma accumulator's rows), 32-column chunks as viewed, 64 columns for
    the transposed form (its chunk is 64 of the view's columns by 32 of its rows), into a tensor the kernel never
    reads (the adds land after the kernel moved on)."""
    out = {}
    read = _read_tensors(program)
    for op in (o for o in program.body.walk() if o.opcode == "atomic_add"):
        gl, src = op.operands[:2]
        t = src.type
        if (not isinstance(t, TileType) or t.space != "rt" or src.id in strips or t.dtype.name != "f32"
                or gl.type.dtype.name != "f32" or gl.id not in params or gl.id in read or gl.type.rank < 2
                or len(op.operands) - 2 != gl.type.rank or t.rows != 16 * program.num_warps or t.cols % 32):
            continue
        spec = dict(param=params[gl.id], rank=gl.type.rank, dtype="f32", box_rows=64, box_cols=TMA_SWIZZLE_BYTES // 4,
                    store=True, reduce=True)
        viewed = map_index(maps, TmaLoad(**spec))
        out[id(op)] = (viewed, map_index(maps, TmaLoad(**spec, transpose=True)) if t.cols == 64 else -1)
    return out
