"""The cuda backend's schedule pass: which pipeline runs on which schedule, and how each mma is issued.

The kernel only says *what* a pipeline does (a load region filling shared stages, a compute region
consuming them); this pass decides *how* on each target, from the Program alone:

  * ``cp_async``: the ring every target runs (sm_80 and the fallback on sm_90a): all threads issue
    16-byte cp.async copies, S-1 stages ahead, one block barrier per step.
  * ``tma`` (sm_90a, two stages or more): every load of the pipeline is a whole-tile global -> shared
    copy into a tile of the 128-byte-swizzled block layout, so one thread issues TMA copies (cp.async.bulk.tensor) that complete
    on an mbarrier per stage; nobody else spends an instruction on loads. The host encodes one tensor map
    per (tensor, box) (tma.py). A launch whose tensors TMA cannot describe (an unaligned base or stride,
    a non-unit inner stride) runs the cp.async ring compiled into the same kernel.

and for each mma inside a pipeline's compute whose shared operands the pipeline has published (MMA_STAGED:
its stages, and buffers written only before it) the mma needs no barrier of its own; when the
compute region is a pure accumulator chain (the mma's result is only the carry of the next step), the
wgmma is left in flight (MMA_ASYNC) and the pipeline waits for it one step later, overlapping the
tensor cores with the next stage's wait. Everything else is MMA_STANDALONE.

A warp-specialised pipeline whose compute region is two products, the second accumulating into a carry
(attention: S = QKᵀ, the softmax, O = O·α + PV), is software-pipelined one step (`Overlap`, FlashAttention
3's intra-warpgroup overlap): step i issues its head product, then the tail of step i-1 (the accumulator's
rescale and its product), and runs the rest of step i, the softmax, while the tail's product is on the
tensor cores. The tail reads what step i-1 left (P, α) and step i-1's stage, which is released a step late.
Off unless asked for (CudaOptions(overlap=True)): on the H200 it lost (2026-12-03, perf-notes), because K and
V share a stage, so the stage held one step longer starves the producer; FA3 releases K after QKᵀ.

A warp-specialised kernel's ring is split (`RingGroup`; CudaOptions(split_ring=True), off by default: on the H200
it measured no faster, and the device's NVRTC spilled the split D64 192-row block, perf-notes 2026-12-03) when each staged buffer of every pipeline is read by exactly one wgmma of the compute region that retires
before it returns, and those readers are two or more: each reader's buffers get their own full and empty
barrier per stage, the consumers wait for them just before the reader and release them right after it, and
the producer refills them as soon as they are released. Attention's K is then refilled once QKᵀ retired, while
V is still being read by PV; on the shared ring a stage waited for both. With the overlap on, the waits and
releases sit where the head and the tail are issued and retired, and `pingpong` (CudaOptions(pingpong=True),
FA3's inter-warpgroup schedule) makes the consumer warpgroups take turns issuing a step's two products, so one
warpgroup's softmax runs while the next one's products occupy the tensor cores. `fa3_switches` turns all of them on,
with the persistent grid (FA3's schedule), for the programs where the H200 measured a gain: attention on two
consumer warpgroups, causal or not.

A warp-specialised kernel may run persistent (`Plan.persistent`): the launch
starts one block per SM (at most), each walking the logical grid's tiles in block_idx order, producer and
consumers alike; the ring of stages runs on across tiles, so the producer loads tile t+1's first stages
while the consumers finish tile t (its last steps, its epilogue): a block no longer pays the pipeline's
fill and its epilogue alone. Alone (CudaOptions(persistent=True)) it tied on GEMMs and lost on attention while Q
was loaded by the consumers after each epilogue (H200, 2026-12-03); with Q on the producer and the ping-pong it is
part of FA3's schedule (`fa3_switches`). The tiles are dealt statically, longest first where tiles differ in work
(`work_axis`; no dynamic tile counter).

`plan(program, target)` returns the decisions; `describe(plan)` prints them (`hk compile --emit lowered`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...codegen.patterns import use_counts
from ...interface import opcodes
from ...interface.backend import Target
from ...interface.ir import GlobalType, Op, Program, ScalarType, SharedBufType, TileType, Value
from . import archs

MMA_STANDALONE, MMA_STAGED, MMA_ASYNC = 0, 1, 2
TMA_SWIZZLE_BYTES = 128          # the box's inner extent: one 128-byte column block of the st layout
TMA_MAX_BOX = 256                # cuTensorMapEncodeTiled: at most 256 elements per box dimension
PRODUCER_WARPS = 4               # one warpgroup: setmaxnreg moves registers per warpgroup
PRODUCER_REGS = 24               # setmaxnreg's least: a loop, two barriers' addresses and TMA coordinates fit (no spill)
MAX_CONSUMER_REGS = 240          # below the ISA's 255 so ptxas keeps its reserved registers
# Tiles go longest first once the work axis has this many blocks (query blocks a head). Block order measured better
# with 8 and 32 (causal D128 N1024 / N4096 and GQA N4096 on the H200: 0.69 vs 0.60 in one A/B; 479 and 490 TFLOP/s
# in block order against 449 and 460 longest first, hk bench across calls), longest first with 128 (N16384: 0.97
# vs 0.66 of cuDNN). 64 lies between: a head's ramp then spans half the SMs' blocks, where dealing beats against it.
LONGEST_FIRST_MIN = 64
# Chained pipeline pairs at most, the last ones first (_chain_pipelines). None by default: on the H200 (2026-12-04,
# ninth session, attention_schedules, 7 rounds, spreads under 1 %) one pair (causal attention's unmasked blocks into
# the diagonal) tied at N1024 (D128 338 vs 339 TFLOP/s, D64 227 vs 226) and N4096 (493 vs 496) and lost 2.6 %
# unmasked at N1024 (468 vs 481). Two pairs (a window's leading masked blocks too) spill 312 bytes at D=128.
CHAIN_PAIRS = 0


@dataclass(frozen=True)
class TmaLoad:
    """One tensor map: kernel parameter `param` (index in Program order) read in boxes of
    box_rows x box_cols elements (box_cols * itemsize == 128 bytes); `store`: written (Plan.tma_stores)."""
    param: int
    rank: int
    dtype: str
    box_rows: int
    box_cols: int
    store: bool = False

    def to_json(self) -> dict:
        return {"param": self.param, "rank": self.rank, "dtype": self.dtype, "box_rows": self.box_rows,
                "box_cols": self.box_cols, "store": self.store}


@dataclass
class Overlap:
    """A compute region split for software pipelining (module docstring): `head` is issued first in every
    step; `tail` (program order, `mma` last) runs one step late and produces carry number `carry`;
    `crossing` are the values the tail reads from its own step (snapshotted when that step ends); `late` the
    ops that make only crossing values (P's cast to bf16): they run after the tail's product retired, so P's
    new registers can reuse those of the P it read (FA3 converts P there too)."""
    head: Op
    tail: list[Op]
    mma: Op
    carry: int
    crossing: list[Value]
    late: list[Op] = field(default_factory=list)


@dataclass(frozen=True)
class RingGroup:
    """Staged buffers of a pipeline with barriers of their own in a split ring (module docstring): `reader` is
    the one compute op that reads them (a wgmma), `loads` the global_to_shared op ids filling them, `tx_bytes`
    what those loads deliver per stage."""
    reader: Op
    loads: tuple[int, ...]
    tx_bytes: int


@dataclass
class PipelinePlan:
    schedule: str                                   # "cp_async" or "tma"
    tma_loads: dict[int, int] = field(default_factory=dict)   # global_to_shared op id -> tensor map index
    tx_bytes: int = 0                               # bytes one stage's TMA copies deliver
    async_mma: bool = False
    overlap: Overlap | None = None                  # software-pipelined compute (warp-specialised only)
    groups: list[RingGroup] = field(default_factory=list)      # split ring (Plan.ring_groups > 1) only


@dataclass
class Plan:
    pipelines: dict[int, PipelinePlan] = field(default_factory=dict)      # pipeline op id -> plan
    mma_modes: dict[int, int] = field(default_factory=dict)               # mma op id -> MMA_*
    tensor_maps: list[TmaLoad] = field(default_factory=list)
    grouped_blocks: bool = False        # block order: runs of GROUP x-rows sweep y (hk::block_idx, HK_BLOCK_GROUPED)
    dispatch_axis: int | None = None    # not persistent: the block_idx axis a block's trip count grows with, each run
                                        # of rows dispatched heaviest first (hk::heavy_first_idx, HK_DISPATCH_AXIS)
    producer_warps: int = 0             # > 0: warp-specialised, a producer warpgroup issues every pipeline's loads
    persistent: bool = False            # specialised only: one block per SM walks the logical grid's tiles
    work_axis: int | None = None        # persistent only: the block_idx axis a tile's trip count grows with, walked
                                        # slowest and from its last index (longest tiles first: `work_axis`)
    longest_first: int = 0              # ... once it has this many blocks (hk_cuda/tile_order.cuh); 0: never
    ring_groups: int = 1                # specialised only: > 1, each stage has that many barrier pairs (split ring)
    pingpong: bool = False              # split and overlapped only: consumer warpgroups take turns issuing wgmma
    free_turns: bool = False            # pingpong only: turns run on across pipelines and tiles (no meeting)
    prologue: dict[int, int] = field(default_factory=dict)   # specialised only: load op id -> tensor map, the producer's
    prologue_tx: int = 0                # bytes those loads deliver per tile
    tma_stores: dict[int, int] = field(default_factory=dict)  # specialised only: register_to_global op id -> tensor
                                        # map; each warpgroup stores its rows through shared memory (_tma_stores)
    prologue_buffers: set[int] = field(default_factory=set)  # alloc_shared op ids those loads fill
    prologue_stages: int = 1            # persistent only: copies of those buffers, tile t's in copy t % stages, so the
                                        # producer loads tile t+1's while the consumers still read tile t's; the
                                        # emitter takes it back to 1 where shared memory cannot hold the copy
    chained: dict[int, int] = field(default_factory=dict)   # pipeline op id -> the id of the pipeline just before it
                                        # whose last tail it issues in its first step (_chain_pipelines)
    load_ahead: bool = True             # not specialised: a step whose mma waits for itself frees its stage at once,
                                        # and the next step's copy is issued before it computes (hk_cuda/tma.cuh)
    ring_runs: list[tuple[int, ...]] = field(default_factory=list)   # not specialised: runs of consecutive TMA
                                        # pipelines (op ids) on one ring, each pipeline's first copies issued while
                                        # the one before runs (hk::ring_open / ring_steps / ring_close: _ring_runs)
    late_publish: set[int] = field(default_factory=set)   # loads before a run (attention's Q) published once the
                                        # run's first copies are issued, so both land together (_ring_runs)
    ring_hoist: list[int] = field(default_factory=list)   # quiet scalar ops inside a run that later pipelines' trip
                                        # counts or loads read: emitted when the run opens its ring

    @property
    def uses_tma(self) -> bool:
        return bool(self.tensor_maps)



def grouped_blocks(program: Program) -> bool:
    """A 2-D grid of output tiles whose pipelined mma reads operands along both axes (a GEMM) is ordered so
    that neighbouring blocks share operand tiles in L2: runs of 8 x-rows sweep y. Other grids keep the
    hardware order, in which consecutive x already share everything (attention's blocks of one head)."""
    axes = {op.attrs["axis"] for op in program.body.walk() if op.opcode == "block_idx"}
    pipelined_mma = any(op.opcode == "pipeline" and any(o.opcode == "mma" for o in op.regions[1].walk())
                        for op in program.body.walk())
    return axes == {0, 1} and pipelined_mma


def plan(program: Program, target: Target, overlap: bool = False, persistent: bool = False,
         split_ring: bool = False, pingpong: bool = False, producer_prologue: bool = False,
         longest_first: int = LONGEST_FIRST_MIN, free_turns: bool = True, prologue_stages: int = 2,
         tma_store: bool = True, chain: int = CHAIN_PAIRS, heavy_first: bool = True, load_ahead: bool = True,
         one_ring: bool = True, strips: frozenset = frozenset()) -> Plan:
    out = Plan(grouped_blocks=grouped_blocks(program), load_ahead=load_ahead)
    producers = {r.id: op for op in program.body.walk() for r in op.results}
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if heavy_first and not out.grouped_blocks:
        out.dispatch_axis = work_axis(pipes, producers)
    if not archs.of(target).async_tensor_core:
        return out
    params = {v.id: i for i, v in enumerate(program.body.args)}
    for op in pipes:
        out.pipelines[id(op)] = _plan_pipeline(op, producers, params, out)
    if not _specialisable(program, out, producers):
        if one_ring and load_ahead:
            _ring_runs(program, out, producers, params)
        return out
    out.producer_warps = PRODUCER_WARPS
    out.persistent = persistent
    if persistent:
        out.dispatch_axis = None          # a persistent block walks its tiles itself (work_axis below)
    out.work_axis = work_axis(pipes, producers) if persistent and longest_first else None
    out.longest_first = longest_first
    if split_ring:
        _split_ring(pipes, out, producers, program.num_warps)
    if producer_prologue:
        _producer_prologue(program, pipes, out, producers, params)
        out.prologue_stages = prologue_stages if persistent and out.prologue else 1
    for op in pipes if overlap else ():
        pp = out.pipelines[id(op)]
        pp.overlap = _overlap(op.regions[1], out.mma_modes, program.num_warps)
        if pp.overlap and pp.groups and [g.reader for g in pp.groups] != [pp.overlap.head, pp.overlap.mma]:
            pp.overlap = None           # the split ring's waits sit where the head and the tail read
    out.pingpong = (pingpong and out.ring_groups > 1 and program.num_warps >= 8
                    and all(out.pipelines[id(op)].overlap for op in pipes))
    out.free_turns = out.pingpong and free_turns
    if chain > 0 and out.free_turns:
        _chain_pipelines(program, out, chain)
    if tma_store:
        _tma_stores(program, out, producers, params, strips)
    return out


FA3 = {"split_ring": True, "producer_prologue": True, "overlap": True, "pingpong": True, "persistent": True}
FA3_WHY = ("FA3's schedule (split ring, Q on the producer, overlap, ping-pong, persistent grid): attention on two or "
           "three consumer warpgroups, built within FA3_SPILL_BYTES and with the register hand-over; on the H200 "
           "+20 % causal and +3-30 % unmasked against the shared ring on two (perf-notes 2026-12-03, fifth session), "
           "+8-15 % on D64's three (2026-12-04, tenth session)")
# FA3's schedule is taken on this many consumer warpgroups, kept where its build spills at most this many bytes:
# none on two (a spill there went with a slowdown, fifth session); on three, D64's 192-row block at 160 registers a
# consumer spills 16 bytes under NVRTC 13.0 (4 under 13.5) and still ran 8-15 % faster than without (tenth session)
FA3_SPILL_BYTES = {2: 0, 3: 16}


def fa3_switches(program: Program, target: Target, switches: dict) -> dict | None:
    """The switches of FA3's schedule for this program when the measurements say it pays, else None: attention on
    two consumer warpgroups, masked or not (perf-notes 2026-12-03, fifth session: with the persistent grid and the
    fused masks, 471 against the shared ring's 393 TFLOP/s causal at N4096 D128, 452 against 355 unmasked at N1024;
    without the persistent grid the causal kernel lost 20 %). On three warpgroups, D64's 192-row block, it lost in the
    fourth session and won in the tenth, once each tile stopped starting with five divisions (hk::tile_grid): 484
    against 420 TFLOP/s at N4096, 495 against 457 at N16384. Only where the caller asked for none of its switches
    itself; the backend keeps it only if the build keeps the register hand-over and spills no more than
    FA3_SPILL_BYTES."""
    if (any(switches.get(k) for k in FA3) or program.num_warps % PRODUCER_WARPS
            or program.num_warps // PRODUCER_WARPS not in FA3_SPILL_BYTES):
        return None
    p = plan(program, target, **{**switches, **FA3})
    return {**switches, **FA3} if p.pingpong and p.prologue else None


def work_axis(pipes: list[Op], producers: dict) -> int | None:
    """The one block_idx axis the pipelines' trip counts depend on (causal attention's query block), else None.
    A persistent grid deals its tiles statically, so where tiles differ in work it walks that axis slowest and from
    its last index: the longest tiles go first and dealt forwards and backwards in turn (hk::dealt_tile) every
    block's tiles add up to about the same (simulated: 0.65 -> 0.998 of balanced at N16384 causal, 132 SMs), once
    the axis has Plan.longest_first blocks (LONGEST_FIRST_MIN; decided in the kernel from the launch's grid). The
    order assumes the count grows with the index (a causal band's does); where it shrank, only balance is lost."""
    axes, seen, todo = set(), set(), [op.operands[0] for op in pipes]
    while todo:
        v = todo.pop()
        op = producers.get(v.id)
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        if op.opcode == "block_idx":
            axes.add(op.attrs["axis"])
        todo.extend(op.operands)
    return axes.pop() if len(axes) == 1 else None


def _split_ring(pipes: list[Op], out: Plan, producers: dict, num_warps: int) -> None:
    """Split the ring when every pipeline's staged buffers fall into the same number (two or more) of
    groups by their one reader: each group gets its own full/empty barriers per stage, so a stage's K is
    refilled once QKᵀ retired while its V is still being read (FA3 releases them apart)."""
    groups = [_ring_groups(op, producers, out, num_warps) for op in pipes]
    if all(groups) and len({len(g) for g in groups}) == 1 and len(groups[0]) > 1:
        for op, g in zip(pipes, groups):
            out.pipelines[id(op)].groups = g
        out.ring_groups = len(groups[0])


def _producer_prologue(program: Program, pipes: list[Op], out: Plan, producers: dict, params: dict) -> None:
    """Loads before the first pipeline that the producer issues by TMA on a barrier pair of their own (attention's
    Q): a whole-tile load into a buffer that nothing but the pipelines' wgmma read and nothing else writes. The
    consumers wait for it instead of loading it; a persistent block releases it after its last pipeline, so the
    producer loads the next tile's while the consumers run this tile's epilogue."""
    ops = program.body.ops
    first = next(k for k, o in enumerate(ops) if o.opcode == "pipeline")
    inside = {id(o) for op in pipes for r in op.regions for o in r.walk()}
    for g2s in (o for o in ops[:first] if o.opcode == "global_to_shared"):
        buf, spec = _buffer(g2s.operands[0], producers), _tma_spec(g2s, producers, params)
        users = [u for u in program.body.walk() if u is not g2s and u.opcode != "shared_stage"
                 and any(_buffer(v, producers) == buf for v in u.operands)]
        if (spec is None or not users
                or any(u.opcode != "mma" or id(u) not in inside or not wgmma_eligible(u, program.num_warps) for u in users)):
            continue
        if spec not in out.tensor_maps:
            out.tensor_maps.append(spec)
        out.prologue[id(g2s)] = out.tensor_maps.index(spec)
        out.prologue_buffers.add(buf)
        t = g2s.operands[0].type
        out.prologue_tx += t.rows * t.cols * t.dtype.itemsize


CHAIN_GAP_OPS = ("scalar_const", "scalar_binary", "scalar_cast", "global_dim")


def _chain_pipelines(program: Program, out: Plan, limit: int) -> None:
    """Overlapped pipelines that run one after another on one accumulator (causal attention: its unmasked key
    blocks, then the masked diagonal) are chained (the last `limit` such pairs): the first leaves its last tail (the last P·V) pending and the
    next one's first step issues it behind its own head (QKᵀ), as any step does, instead of each pipeline ramping
    down (the last P·V alone) and up (the first QKᵀ alone) in turn. Taken when B directly follows A at the top level
    (scalars between them), both are overlapped on the split ring, and B's accumulator starts from A's, which
    nothing else reads (it is final only after B's first step). FA3's mainloop runs its masked and unmasked key
    blocks as one software pipeline the same way."""
    ops = program.body.ops
    readers = use_counts(program)
    pipes = [k for k, o in enumerate(ops) if o.opcode == "pipeline"]
    for ka, kb in zip(pipes, pipes[1:]):
        a, b = ops[ka], ops[kb]
        pa, pb = out.pipelines[id(a)], out.pipelines[id(b)]
        if (not (pa.overlap and pb.overlap and pa.groups and pb.groups)
                or any(o.opcode not in CHAIN_GAP_OPS for o in ops[ka + 1:kb])):
            continue
        acc = a.results[pa.overlap.carry]
        if b.operands[1 + pb.overlap.carry] is acc and readers.get(acc) == 1:
            out.chained[id(b)] = id(a)
    pairs = list(out.chained)
    for b in pairs[:max(len(pairs) - limit, 0)]:
        del out.chained[b]


def _tma_stores(program: Program, out: Plan, producers: dict, params: dict, strips: frozenset) -> None:
    """A specialised kernel's stores of a whole register tile after its pipelines (the epilogue) go through shared
    memory and TMA (hk::store_tma): each consumer warpgroup writes its 64 rows to shared memory a 64-column chunk
    at a time and one thread copies each chunk out, so the warpgroup leaves the tile after a few shared stores
    instead of many global ones.
    Taken for a 16-bit tile of the tensor's dtype in the fragment layout (not a strip, `strips`: the ids of
    values the layout pass made strips), one 16-row block per warp (the wgmma accumulator's rows), whole 128-byte
    column blocks, at tile indices, into a tensor the kernel never reads (the copy lands after the kernel moved on)."""
    if not out.producer_warps:
        return
    read = {o.operands[1].id for o in program.body.walk() if o.opcode == "global_to_shared"} | {
        o.operands[0].id for o in program.body.walk() if o.opcode in ("global_to_register", "global_to_scalar")}
    for op in (o for o in program.body.ops if o.opcode == "register_to_global"):
        gl, src = op.operands[:2]
        t = src.type
        if (not isinstance(t, TileType) or t.space != "rt" or src.id in strips or t.dtype.itemsize != 2
                or t.dtype != gl.type.dtype or gl.id not in params or gl.id in read or gl.type.rank < 2
                or len(op.operands) - 2 != gl.type.rank or t.rows != 16 * program.num_warps
                or (t.cols * 2) % TMA_SWIZZLE_BYTES):
            continue
        spec = TmaLoad(params[gl.id], gl.type.rank, gl.type.dtype.name, 64, TMA_SWIZZLE_BYTES // 2, store=True)
        if spec not in out.tensor_maps:
            out.tensor_maps.append(spec)
        out.tma_stores[id(op)] = out.tensor_maps.index(spec)


TMA_STORE_CHUNK_BYTES = 64 * 64 * 2      # one chunk of a warpgroup's rows: 64 rows of one 128-byte column block


def tma_store_buffers(program: Program, p: Plan) -> int:
    """Chunk buffers each consumer warpgroup stages its TMA stores through (hk::store_tma's BUFS): two, so one is
    written while the other's copy reads it, or one where every stored tile is a single chunk wide."""
    chunks = max((o.operands[1].type.cols * 2 // TMA_SWIZZLE_BYTES for o in program.body.ops
                  if id(o) in p.tma_stores), default=0)
    return min(chunks, 2)


def tma_store_bytes(program: Program, p: Plan) -> int:
    """Shared bytes the TMA stores stage through: each consumer warpgroup's chunk buffers (the stores share them)."""
    return program.num_warps // 4 * tma_store_buffers(program, p) * TMA_STORE_CHUNK_BYTES


def _ring_groups(pipe: Op, producers: dict, out: Plan, num_warps: int) -> list[RingGroup]:
    """The pipeline's staged buffers grouped by the one top-level compute op reading each (a staged wgmma,
    which retires before it returns), in the order those readers run; [] when a buffer has no such reader."""
    lreg, creg = pipe.regions
    if any(o.regions for o in creg.ops):
        return []
    readers: dict[int, list[Op]] = {}
    for o in (o for o in creg.ops if o.opcode != "shared_stage"):
        for b in {_stage_buffer(v, producers) for v in o.operands} - {None}:
            readers.setdefault(b, []).append(o)
    by_reader: dict[int, list[Op]] = {}
    for g2s in (o for o in lreg.walk() if o.opcode == "global_to_shared"):
        rs = readers.get(_stage_buffer(g2s.operands[0], producers), [])
        if (len(rs) != 1 or rs[0].opcode != "mma" or out.mma_modes.get(id(rs[0])) != MMA_STAGED
                or not wgmma_eligible(rs[0], num_warps) or id(g2s) not in out.pipelines[id(pipe)].tma_loads):
            return []
        by_reader.setdefault(id(rs[0]), []).append(g2s)
    order = [o for o in creg.ops if id(o) in by_reader]
    return [RingGroup(r, tuple(id(g) for g in by_reader[id(r)]),
                      sum(g.operands[0].type.rows * g.operands[0].type.cols * g.operands[0].type.dtype.itemsize
                          for g in by_reader[id(r)])) for r in order]


# What the producer warpgroup runs of the Program: the scalars and shared addresses its loads need.
PRODUCER_OPS = ("scalar_const", "scalar_binary", "scalar_cast", "block_idx", "num_blocks", "global_dim",
                "global_to_scalar", "alloc_shared", "shared_stage")
MIN_SPECIALISED_WARPS = 8        # two consumer warpgroups: a smaller block would lose occupancy to the producer


def _specialisable(program: Program, p: Plan, producers: dict) -> bool:
    """Whether the kernel runs warp-specialised: a producer warpgroup (few registers) runs the Program's
    scalars and issues every pipeline's TMA loads into one ring of stages, then leaves; the Program's warps
    (more registers) run everything else, wait only on full barriers and release stages by mbarrier.
    Taken when every pipeline is at the top level, on TMA, with one stage count (they share the ring), the
    Program's warps are two or more whole warpgroups, and no other op touches a staged buffer (the
    producer fills them whenever the ring lets it)."""
    ops = program.body.ops
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if (not pipes or program.num_warps % 4 or program.num_warps < MIN_SPECIALISED_WARPS
            or any(op not in ops or p.pipelines[id(op)].schedule != "tma" for op in pipes)
            or len({op.attrs["stages"] for op in pipes}) != 1):
        return False
    staged = set().union(*(_staged_buffers(op.regions[0], producers) for op in pipes))
    others = [o for op in ops if op.opcode != "pipeline" for o in [op, *(n for r in op.regions for n in r.walk())]]
    return not any(_buffer(v, producers) in staged for o in others if o.opcode != "shared_stage"
                   for v in o.operands if isinstance(v.type, (TileType, SharedBufType)))


def _quiet(op: Op) -> bool:
    """An op that touches no memory and holds no regions (scalars, register tiles): it may run while a ring's
    copies are in flight, and a load's publication may wait past it."""
    spec = opcodes.spec(op.opcode)
    return spec is not None and spec.effects == opcodes.NO_EFFECTS and not op.regions


def _free_values(reg, producers: dict) -> list[Value]:
    """Values a region reads that it does not define (its arguments and its ops' results are its own)."""
    own = {a.id for a in reg.args} | {r.id for o in reg.walk() for r in o.results} | {
        a.id for o in reg.walk() for r in o.regions for a in r.args}
    return [v for o in reg.walk() for v in o.operands if v.id not in own]


def _ring_runs(program: Program, out: Plan, producers: dict, params: dict) -> None:
    """Runs of consecutive top-level TMA pipelines of a block that is not specialised (attention's leading edge,
    full blocks and diagonal) on one ring of stages: the ring's barriers are set up once, its step count runs
    across the pipelines and each pipeline's first copies are issued while the one before computes, where
    separate rings started each pipeline on a barrier, a fresh ring and a copy waited for at once. A run takes
    pipelines with one stage count and one stage size, only quiet ops between them (_quiet), and later pipelines
    whose trip counts and loads read only values defined before the run's first pipeline (their loads are issued
    early). A global_to_shared before the run with only quiet ops between (attention's Q) is published once the
    run's first copies are issued (late_publish): its copy and theirs are in flight together."""
    ops = program.body.ops
    index = {id(o): i for i, o in enumerate(ops)}

    def early(v: Value, first: int) -> bool:
        """Defined before ops[first] at the top level (or a param), or by a quiet scalar op after it from such
        values (a later pipeline's trip count): the run's ring_open emits those first (ring_hoist)."""
        o = producers.get(v.id)
        if v.id in params or (o is not None and index.get(id(o), first) < first):
            return True
        if o is None or id(o) not in index or not _quiet(o) or not all(isinstance(r.type, ScalarType) for r in o.results):
            return False
        if all(early(w, first) for w in o.operands):
            hoist.add(id(o))
            return True
        return False

    hoist: set[int] = set()

    runs, run = [], []                                  # run: the pipelines (op ids) of the run being built
    for op in ops:
        pp = out.pipelines.get(id(op)) if op.opcode == "pipeline" else None
        if pp is not None and pp.schedule == "tma":
            if run and _joins(op, pp, ops[index[run[0]]], out, early, index[run[0]], producers):
                run.append(id(op))
            else:
                runs.append(run)
                run = [id(op)]
        elif not _quiet(op):                            # anything else touching memory ends a run
            runs.append(run)
            run = []
    runs.append(run)
    out.ring_runs = [tuple(r) for r in runs if len(r) > 1]
    out.ring_hoist = [id(o) for i, o in enumerate(ops) if id(o) in hoist and any(
        index[r[0]] < i < index[r[-1]] for r in out.ring_runs)]
    for r in out.ring_runs:
        first = index[r[0]]
        staged = set().union(*(_staged_buffers(ops[index[p]].regions[0], producers) for p in r))
        for j in range(first - 1, -1, -1):
            o = ops[j]
            if o.opcode == "global_to_shared" and _buffer(o.operands[0], producers) not in staged:
                out.late_publish.add(id(o))
            elif not _quiet(o):
                break


def _joins(op: Op, pp: PipelinePlan, first_op: Op, out: Plan, early, first: int, producers: dict) -> bool:
    """Whether pipeline `op` may join the run that began with `first_op` (at top-level index `first`)."""
    head = out.pipelines[id(first_op)]
    return (op.attrs["stages"] == first_op.attrs["stages"] and pp.tx_bytes == head.tx_bytes and not pp.groups
            and early(op.operands[0], first) and all(early(v, first) for v in _free_values(op.regions[0], producers)))


def _plan_pipeline(op: Op, producers: dict, params: dict, out: Plan) -> PipelinePlan:
    lreg, creg = op.regions
    staged = _staged_buffers(lreg, producers)
    written = _written_buffers(op, producers) - staged
    pp = PipelinePlan("cp_async")
    for mma in (o for o in creg.walk() if o.opcode == "mma"):
        if all(_published(v, producers, staged, written) for v in mma.operands[:2]):
            out.mma_modes[id(mma)] = MMA_STAGED
    if _is_accumulator_chain(creg, producers):
        (mma,) = [o for o in creg.ops if o.opcode == "mma"]
        if out.mma_modes.get(id(mma)) == MMA_STAGED:
            out.mma_modes[id(mma)] = MMA_ASYNC
            pp.async_mma = True
    # one stage has nothing to prefetch: its copy would be waited on right after issue (the ring does that)
    loads = _tma_loads(lreg, producers, params) if op.attrs["stages"] >= 2 else None
    if loads is not None:
        pp.schedule = "tma"
        for g2s, spec in loads:
            if spec not in out.tensor_maps:
                out.tensor_maps.append(spec)
            pp.tma_loads[id(g2s)] = out.tensor_maps.index(spec)
            t = g2s.operands[0].type
            pp.tx_bytes += t.rows * t.cols * t.dtype.itemsize
    return pp


TAIL_OPS = ("mma", "binary", "unary", "broadcast", "fill", "splat", "cast", "where", "shared_stage")


def _overlap(creg, mma_modes: dict, num_warps: int) -> Overlap | None:
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
    return Overlap(head, ordered, mma, ks[0], list(crossing.values()), late)


def register_split(warps: int, producer_warps: int, arch: archs.Arch) -> tuple[int, int, int]:
    """(registers per thread the block compiles with, the producer's after setmaxnreg.dec, the consumers'
    after setmaxnreg.inc) for a specialised block of `warps` consumer and `producer_warps` producer warps,
    one block per SM (sharing out the arch's SM register file). The incs draw only on what the decs gave back,
    so both sums must balance against the block's own allocation (ptxas allocates the launch bounds' maximum when setmaxnreg is present)."""
    threads = 32 * (warps + producer_warps)
    block = min(255, arch.sm_registers // threads) // 8 * 8
    spare = (block - PRODUCER_REGS) * 32 * producer_warps
    consumer = min(MAX_CONSUMER_REGS, (block + spare // (32 * warps)) // 8 * 8)
    return block, PRODUCER_REGS, consumer


def _stage_buffer(v: Value, producers: dict) -> int | None:
    """The alloc_shared op id whose stage `v` is, if it is one."""
    op = producers.get(v.id)
    if op is None or op.opcode != "shared_stage":
        return None
    buf = producers.get(op.operands[0].id)
    return id(buf) if buf is not None else None


def _buffer(v: Value, producers: dict) -> int | None:
    """The alloc_shared op id behind a shared tile value (a stage of it, or the buffer itself)."""
    op = producers.get(v.id)
    if op is not None and op.opcode == "alloc_shared":
        return id(op)
    return _stage_buffer(v, producers)


def _written_buffers(pipe: Op, producers: dict) -> set[int]:
    """Buffers some op inside the pipeline writes (loads into stages, register stores)."""
    return {b for reg in pipe.regions for o in reg.walk() if o.opcode in ("global_to_shared", "register_to_shared")
            for b in [_buffer(o.operands[0], producers)] if b is not None}


def _published(v: Value, producers: dict, staged: set[int], written: set[int]) -> bool:
    """Whether the pipeline has made operand `v` visible to wgmma by the time compute reads it: a register
    tile, a stage its loads fill (published each step), or a buffer written only before the pipeline
    (published by the pipeline's first barrier)."""
    if isinstance(v.type, TileType) and v.type.space == "rt":
        return True
    b = _buffer(v, producers)
    return b is not None and (b in staged or b not in written)


def _staged_buffers(lreg, producers: dict) -> set[int]:
    """Buffers the load region fills (global_to_shared destinations)."""
    out = set()
    for o in lreg.walk():
        if o.opcode == "global_to_shared":
            b = _stage_buffer(o.operands[0], producers)
            if b is not None:
                out.add(b)
    return out


def _is_accumulator_chain(creg, producers: dict) -> bool:
    """The compute region is stage views + one mma whose accumulator is the carry and whose result is
    the only yield, so nothing reads the accumulator before the next step's mma."""
    kinds = [o.opcode for o in creg.ops]
    if kinds.count("mma") != 1 or any(k not in ("mma", "shared_stage") for k in kinds):
        return False
    (mma,) = [o for o in creg.ops if o.opcode == "mma"]
    carry = creg.args[2:]
    return (len(carry) == 1 and mma.operands[2] is carry[0] and list(creg.yields) == [mma.result])


def _tma_loads(lreg, producers: dict, params: dict) -> list[tuple[Op, TmaLoad]] | None:
    """The TMA form of every load in the region, or None when one of them has none."""
    loads = []
    for o in lreg.walk():
        if o.opcode in ("global_to_shared",):
            spec = _tma_spec(o, producers, params)
            if spec is None:
                return None
            loads.append((o, spec))
        elif o.opcode not in ("shared_stage", "scalar_const", "scalar_binary", "scalar_cast", "block_idx",
                              "num_blocks", "global_dim", "global_to_scalar"):
            return None                 # anything else in the load region keeps the all-threads ring
    return loads or None


def _tma_spec(o: Op, producers: dict, params: dict) -> TmaLoad | None:
    st, gl = o.operands[:2]
    t = st.type
    item = t.dtype.itemsize
    if (o.attrs.get("fill", 0.0) != 0.0 or _stage_buffer(st, producers) is None or gl.id not in params
            or not isinstance(gl.type, GlobalType) or gl.type.rank < 2 or item not in (1, 2)
            or (t.cols * item) % TMA_SWIZZLE_BYTES or t.rows % 8 or t.rows > TMA_MAX_BOX):
        return None
    return TmaLoad(params[gl.id], gl.type.rank, gl.type.dtype.name, t.rows, TMA_SWIZZLE_BYTES // item)


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


def fast_path(program: Program, target: Target) -> bool:
    """Whether every pipeline of the Program runs on TMA and every mma in them on wgmma (sm_90a): what
    the backend's configuration choice looks for among a kernel's candidates."""
    p = plan(program, target)
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if not pipes or any(p.pipelines[id(op)].schedule != "tma" for op in pipes):
        return False
    return all(wgmma_eligible(m, program.num_warps) for op in pipes for m in op.regions[1].walk()
               if m.opcode == "mma")


def describe(program: Program, p: Plan, target: Target) -> str:
    """The plan as text, after the Program (`hk compile --emit lowered`)."""
    lines = [str(program), "", f"// schedule (cuda backend, {target.spec})"]
    hopper = archs.of(target).async_tensor_core
    names = {id(op): f"%{op.results[0].id}" if op.results else op.opcode for op in program.body.walk()}
    mode = {MMA_STANDALONE: "standalone (barrier + fence, waits)", MMA_STAGED: "staged (no barrier, waits)",
            MMA_ASYNC: "async (left in flight; the pipeline waits a step later)"}
    for op in program.body.walk():
        if op.opcode == "pipeline":
            pp = p.pipelines.get(id(op), PipelinePlan("cp_async"))
            extra = f", {len(pp.tma_loads)} tile loads/stage ({pp.tx_bytes} bytes)" if pp.schedule == "tma" else ""
            if p.producer_warps:
                block, prod, cons = register_split(program.num_warps, p.producer_warps, archs.of(target))
                extra += (f", warp-specialised ({p.producer_warps} producer warps issue the loads; registers "
                          f"{block} -> producer {prod}, consumers {max(cons, block)})")
            if pp.overlap:
                extra += (f", software-pipelined (head {names[id(pp.overlap.head)]}; tail "
                          f"{', '.join(names[id(o)] for o in pp.overlap.tail)} one step late; crossing "
                          f"{', '.join(f'%{v.id}' for v in pp.overlap.crossing)})")
            lines.append(f"pipeline {names[id(op)]}: {pp.schedule}{extra}, stages={op.attrs['stages']}")
        elif op.opcode == "mma" and not (hopper and wgmma_eligible(op, program.num_warps)):
            k = 32 if op.operands[0].type.dtype.itemsize == 1 else 16
            lines.append(f"mma {names[id(op)]}: mma.sync m16n8k{k} (ldmatrix fragments)")
        elif op.opcode == "mma":
            k = 32 if op.operands[0].type.dtype.itemsize == 1 else 16
            lines.append(f"mma {names[id(op)]}: wgmma m64n{op.results[0].type.cols}k{k}, "
                         f"{mode[p.mma_modes.get(id(op), MMA_STANDALONE)]}")
    order = ("grouped (runs of 8 x-rows sweep y: operand tiles shared in L2)" if p.grouped_blocks
             else f"heaviest first along axis {p.dispatch_axis} in runs of rows (hk::heavy_first_idx; given up where "
                  "only the build without it fills the SM: backend._fill_sm)"
             if p.dispatch_axis is not None else "hardware (x fastest)")
    if p.persistent:
        order = (f"persistent, longest first once axis {p.work_axis} has {p.longest_first} blocks (then slowest, "
                 "from its last index)"
                 if p.work_axis is not None else f"persistent, {order}") + ", dealt forwards and backwards in turn"
    lines.append("block order: " + order)
    for b, a in p.chained.items():
        lines.append(f"pipeline {names[b]} issues the last tail of pipeline {names[a]} in its first step (chained)")
    for run in p.ring_runs:
        lines.append(f"pipelines {', '.join(names[i] for i in run)} share one ring (each one's first copies issued while "
                     "the one before computes; the SM fill may take separate rings)")
    if hopper and not p.producer_warps and any(pp.schedule == "tma" for pp in p.pipelines.values()):
        lines.append("ring refills: " + ("before a step whose products wait for themselves (load_ahead)" if p.load_ahead
                                         else "after each step"))
    if p.late_publish:
        lines.append(f"{len(p.late_publish)} load(s) before a ring published after its first copies")
    if p.tma_stores:
        lines.append(f"epilogue: {len(p.tma_stores)} store(s) through shared memory by TMA, each warpgroup its rows "
                     "in 64-column chunks")
    if p.prologue:
        lines.append(f"prologue: {len(p.prologue)} load(s) by the producer's TMA, {p.prologue_tx} bytes a tile, "
                     f"{p.prologue_stages} cop{'ies' if p.prologue_stages > 1 else 'y'}"
                     + (" (the next tile's loads while this tile runs)" if p.prologue_stages > 1 else ""))
    for i, tm in enumerate(p.tensor_maps):
        lines.append(f"tensor map {i}: param {tm.param} (rank {tm.rank}, {tm.dtype}), box {tm.box_rows}x{tm.box_cols}, "
                     + ("SWIZZLE_128B, written (out of bounds dropped)" if tm.store
                        else "SWIZZLE_128B, zero fill out of bounds"))
    return "\n".join(lines)
