"""Facts about a Program's shared buffers and regions that the cuda schedule decides from (none of them a decision):
which buffer a value is a stage of, what a pipeline stages and writes, whether an operand is published to wgmma,
which mma runs as wgmma, and where a compute region splits into a head and a tail one step late (Overlap)."""
from __future__ import annotations

from dataclasses import dataclass

from ...interface import opcodes
from ...interface.ir import GlobalType, Op, TileType, Value
from .tma import REDUCE_OK, REDUCE_T_OK, STORES_OK

MMA_STANDALONE, MMA_STAGED, MMA_ASYNC = 0, 1, 2     # how an mma inside a pipeline is issued (schedule.py)
MMA_DEFERRED = 3        # staged, left in flight, waited for where the compute region first reads it (deferred.py)
TMA_SWIZZLE_BYTES = 128          # the box's inner extent: one 128-byte column block of the st layout


@dataclass(frozen=True)
class Overlap:
    """A compute region split for software pipelining (module docstring): `head` is issued first in every
    step; `tail` (program order, `mma` last) runs one step late and produces carry number `carry`;
    `crossing` are the values the tail reads from its own step (snapshotted when that step ends); `late` the
    ops that make only crossing values (P's cast to bf16): they run after the tail's product retired, so P's
    new registers can reuse those of the P it read (FA3 converts P there too)."""
    head: Op
    tail: tuple[Op, ...]
    mma: Op
    carry: int
    crossing: tuple[Value, ...]
    late: tuple[Op, ...] = ()


def quiet(op: Op) -> bool:
    """An op that touches no memory and holds no regions (scalars, register tiles): it may run while a ring's
    copies are in flight, and a load's publication may wait past it."""
    spec = opcodes.spec(op.opcode)
    return spec is not None and spec.effects == opcodes.NO_EFFECTS and not op.regions


def free_values(reg, producers: dict) -> list[Value]:
    """Values a region reads that it does not define (its arguments and its ops' results are its own)."""
    own = {a.id for a in reg.args} | {r.id for o in reg.walk() for r in o.results} | {
        a.id for o in reg.walk() for r in o.regions for a in r.args}
    return [v for o in reg.walk() for v in o.operands if v.id not in own]


# What an overlapped tail may hold: its product, its stage view, and register-tile arithmetic that touches no memory
# (the accumulator's rescale, P's cast). Not reduce or compare (nor masks): the tail was made for FA3's rescale,
# which needs none, and they are not tried in it.
TAIL_OPS = (opcodes.CONTRACTION_OPS | {"shared_stage"} | opcodes.UNIFORM_OPS | opcodes.ELEMENTWISE_OPS
            | opcodes.ALONG_AXIS_OPS) - {"reduce", "compare"}


def overlap_split(creg, mma_modes: dict, num_warps: int) -> Overlap | None:
    """The split of a compute region into head and tail (module docstring), or None. Taken when the
    region's top level holds exactly two products, both staged wgmma, the second's result is only a
    yielded carry, and that carry is read by nothing but the second product's accumulator chain: the
    tail is that product plus the pure ops that feed only it (its accumulator's rescale, its stage view)."""
    ops = creg.ops
    mmas = [o for o in ops if o.opcode == "mma"]
    if (len(mmas) != 2 or any(o.regions for o in ops)
            or any(mma_modes.get(id(m)) != MMA_STAGED or not wgmma_eligible(m, num_warps) for m in mmas)):
        return None
    head, mma = mmas
    ks = [k for k, y in enumerate(creg.yields) if y is mma.result]
    users: dict[int, list[Op]] = {}
    for o in ops:
        for v in o.operands:
            users.setdefault(v.id, []).append(o)
    if len(ks) != 1 or users.get(mma.result.id):
        return None
    defined = {r.id: o for o in ops for r in o.results}
    yielded = {y.id for y in creg.yields}
    tail = {id(mma): mma}

    def pull(v: Value) -> None:
        o = defined.get(v.id)
        if (o is None or id(o) in tail or o is head or o.opcode not in TAIL_OPS
                or any(r.id in yielded or any(id(u) not in tail for u in users.get(r.id, [])) for r in o.results)):
            return
        tail[id(o)] = o
        for w in o.operands:
            pull(w)

    pull(mma.operands[2])
    pull(mma.operands[1])
    acc = creg.args[2 + ks[0]]
    if any(id(u) not in tail for u in users.get(acc.id, [])):
        return None
    ordered = [o for o in ops if id(o) in tail]
    inside = {r.id for o in ordered for r in o.results}
    stage, outer = creg.args[1], {v.id for v in creg.args} | set(defined)
    crossing: dict[int, Value] = {}
    for o in ordered:
        for v in o.operands:
            if v.id not in inside and v is not acc and v is not stage and v.id in outer:
                crossing.setdefault(v.id, v)
    late = [o for o in ops if id(o) not in tail and o is not head and o.results and all(
        r.id not in yielded and users.get(r.id) and all(id(u) in tail for u in users[r.id]) for r in o.results)]
    return Overlap(head, tuple(ordered), mma, ks[0], tuple(crossing.values()), tuple(late))


def stage_buffer(v: Value, producers: dict) -> int | None:
    """The alloc_shared op id whose stage `v` is, if it is one."""
    op = producers.get(v.id)
    if op is None or op.opcode != "shared_stage":
        return None
    buf = producers.get(op.operands[0].id)
    return id(buf) if buf is not None else None


def buffer_of(v: Value, producers: dict) -> int | None:
    """The alloc_shared op id behind a shared tile value (a stage of it, or the buffer itself)."""
    op = producers.get(v.id)
    if op is not None and op.opcode == "alloc_shared":
        return id(op)
    return stage_buffer(v, producers)


def written_buffers(pipe: Op, producers: dict) -> set[int]:
    """Buffers some op inside the pipeline writes (loads into stages, register stores)."""
    return {b for reg in pipe.regions for o in reg.walk() if opcodes.writes_shared(o.opcode)
            for b in [buffer_of(o.operands[0], producers)] if b is not None}


def published(v: Value, producers: dict, staged: set[int], written: set[int]) -> bool:
    """Whether the pipeline has made operand `v` visible to wgmma by the time compute reads it: a register
    tile, a stage its loads fill (published each step), or a buffer written only before the pipeline
    (published by the pipeline's first barrier)."""
    if isinstance(v.type, TileType) and v.type.space == "rt":
        return True
    b = buffer_of(v, producers)
    return b is not None and (b in staged or b not in written)


def staged_buffers(lreg, producers: dict) -> set[int]:
    """Buffers the load region fills (global_to_shared destinations)."""
    out = set()
    for o in lreg.walk():
        if o.opcode == "global_to_shared":
            b = stage_buffer(o.operands[0], producers)
            if b is not None:
                out.add(b)
    return out


def is_accumulator_chain(creg, producers: dict) -> bool:
    """The compute region is stage views + one mma whose accumulator is the carry and whose result is
    the only yield, so nothing reads the accumulator before the next step's mma."""
    kinds = [o.opcode for o in creg.ops]
    if kinds.count("mma") != 1 or kinds.count("shared_stage") != len(kinds) - 1:
        return False
    (mma,) = [o for o in creg.ops if o.opcode == "mma"]
    carry = creg.args[2:]
    return (len(carry) == 1 and mma.operands[2] is carry[0] and list(creg.yields) == [mma.result])


def blocked(t) -> bool:
    """Whether shared tile type `t` gets the library's 128-byte-swizzled block layout (st::BLOCKED)."""
    return (t.cols * t.dtype.itemsize) % TMA_SWIZZLE_BYTES == 0 and t.rows % 8 == 0


def wgmma_eligible(op: Op, num_warps: int) -> bool:
    """Whether the library runs this mma as wgmma on sm_90a: the mirror of `wgmma_fits` in
    hk_cuda/wgmma.cuh (tests/cuda/test_cuda_hopper.py checks the two agree on compiled PTX). A from shared or
    (not transposed) from registers; B from shared."""
    a, b, acc = (v.type for v in op.operands)
    if a.dtype.name.startswith("fp8"):          # fp8: both K-major in shared (A as M x K, B as N x K)
        a_ok = a.space == "st" and blocked(a) and not op.attrs["trans_a"] and op.attrs["trans_b"]
    else:
        a_ok = blocked(a) if a.space == "st" else (a.space == "rt" and not op.attrs["trans_a"])
    return (a_ok and b.space == "st" and blocked(b) and num_warps % 4 == 0
            and acc.rows % 64 == 0 and acc.cols % 8 == 0 and acc.cols <= 256)


# ---- TMA: which copies a tensor map can make
@dataclass(frozen=True)
class TmaLoad:
    """One tensor map: kernel parameter `param` (index in Program order) read in boxes of
    box_rows x box_cols elements (box_cols * itemsize == 128 bytes); `store`: written (Plan.tma_stores), `reduce`:
    added into (Plan.tma_reduces); `transpose`: of the tensor the parameter is a transposed view of (its last two
    dimensions swapped back, so the inner one has unit stride)."""
    param: int
    rank: int
    dtype: str
    box_rows: int
    box_cols: int
    store: bool = False
    reduce: bool = False
    transpose: bool = False

    @property
    def flag_bit(self) -> int:
        """The bit of the kernel's hk_tma_ok this map sets when the launch encoded it (tma.py): 0 for a read map
        (any read map missing clears the whole flag), 2 for the stores, 4 / 8 for a reduce as viewed / transposed."""
        if not self.store:
            return 0
        return (REDUCE_T_OK if self.transpose else REDUCE_OK) if self.reduce else STORES_OK

    def to_json(self) -> dict:
        return {"param": self.param, "rank": self.rank, "dtype": self.dtype, "box_rows": self.box_rows,
                "box_cols": self.box_cols, "store": self.store, "reduce": self.reduce, "transpose": self.transpose,
                "bit": self.flag_bit}


TMA_MAX_BOX = 256                # cuTensorMapEncodeTiled: at most 256 elements per box dimension
# What a TMA load region may hold besides its copies (one thread issues it).
TMA_LOAD_REGION_OPS = opcodes.SCALAR_OPS | {"global_to_scalar", "shared_stage"}


def copy_bytes(g2s: Op) -> int:
    """The bytes a global_to_shared copy delivers: its destination tile's."""
    t = g2s.operands[0].type
    return t.rows * t.cols * t.dtype.itemsize


def tma_loads(lreg, producers: dict, params: dict) -> tuple[list[tuple[Op, TmaLoad]] | None, str]:
    """The TMA form of every load in the region, or None when one of them has none; and why."""
    loads = []
    for o in lreg.walk():
        if o.opcode == "global_to_shared":
            spec = tma_spec(o, producers, params)
            if spec is None:
                return None, (f"load %{o.operands[0].id} is not a whole-tile copy TMA can make (a fill, a source other "
                              "than a parameter, rank < 2, 32-bit elements, part of a 128-byte column block, or a "
                              f"box of more than {TMA_MAX_BOX} rows)")
            loads.append((o, spec))
        elif o.opcode not in TMA_LOAD_REGION_OPS:
            return None, f"the load region also runs '{o.opcode}', which one thread issuing copies cannot"
    if not loads:
        return None, "no load in the load region"
    return loads, ("every load a whole-tile copy into a 128-byte-swizzled tile: one thread issues TMA copies that "
                   "complete on an mbarrier a stage (the cp.async ring compiled in for tensors TMA cannot describe)")


def tma_spec(o: Op, producers: dict, params: dict) -> TmaLoad | None:
    """The tensor map a global_to_shared copy can go through, or None where TMA cannot make it."""
    st, gl = o.operands[:2]
    t = st.type
    item = t.dtype.itemsize
    if (o.attrs.get("fill", 0.0) != 0.0 or stage_buffer(st, producers) is None or gl.id not in params
            or not isinstance(gl.type, GlobalType) or gl.type.rank < 2 or item not in (1, 2)
            or (t.cols * item) % TMA_SWIZZLE_BYTES or t.rows % 8 or t.rows > TMA_MAX_BOX):
        return None
    return TmaLoad(params[gl.id], gl.type.rank, gl.type.dtype.name, t.rows, TMA_SWIZZLE_BYTES // item)
