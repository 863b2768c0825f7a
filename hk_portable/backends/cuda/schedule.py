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

Each Program runs one of two named variants (variants.py: `Base`, `FA3`).

`FA3` is FlashAttention 3's schedule, for a warp-specialised kernel whose compute region is two products, the
second accumulating into a carry (attention: S = QKᵀ, the softmax, O = O·α + PV). Its parts, which only run
together (alone each measured no gain on the H200, perf-notes 2026-12-03; git keeps them):
  * the split ring (`RingGroup`): each staged buffer of every pipeline is read by exactly one wgmma of the compute
    region that retires before it returns, so each reader's buffers get their own full and empty barrier per
    stage; K is refilled once QKᵀ retired, while V is still being read by PV;
  * the producer prologue: the loads before the pipelines (Q) issued by the producer on barriers of their own;
  * the overlap (`dataflow.Overlap`, FA3's intra-warpgroup overlap): step i issues its head product, then the tail of step
    i-1 (the accumulator's rescale and its product), and runs the rest of step i, the softmax, while the tail's
    product is on the tensor cores; the waits and releases of the split ring sit where the head and the tail are
    issued and retired;
  * the ping-pong (FA3's inter-warpgroup schedule): the consumer warpgroups take turns issuing a step's two
    products, so one warpgroup's softmax runs while the next one's products occupy the tensor cores;
  * the persistent grid (`Plan.persistent`): the launch starts one block per SM (at most), each walking the
    logical grid's tiles in block_idx order, producer and consumers alike; the ring runs on across tiles, so the
    producer loads tile t+1's first stages while the consumers finish tile t. The tiles are dealt statically,
    longest first where tiles differ in work (`work_axis`; no dynamic tile counter).
The backend takes it unasked where it measured a gain (`fa3_variant`: attention on two or three consumer
warpgroups, causal or not).

`plan(program, target, variant)` returns the decisions; `describe` prints them (the backend's lowering passes,
`hk compile --emit lowered`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...codegen.layouts import Strip
from ...interface import opcodes
from ...interface.backend import Target
from ...interface.ir import GlobalType, Op, Program, ScalarType, SharedBufType, TileType, Value
from . import archs, dataflow, footprint, occupancy
from .dataflow import MMA_ASYNC, MMA_STAGED, MMA_STANDALONE, TMA_SWIZZLE_BYTES
from .variants import BASE, FA3, LONGEST_FIRST_MIN, Base, Variant

TMA_MAX_BOX = 256                # cuTensorMapEncodeTiled: at most 256 elements per box dimension
PRODUCER_WARPS = 4               # one warpgroup: setmaxnreg moves registers per warpgroup


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
    overlap: dataflow.Overlap | None = None                  # software-pipelined compute (warp-specialised only)
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
    free_turns: bool = False            # pingpong only: turns run on across pipelines and tiles (no meeting), where
                                        # the consumers write no shared memory of their own (tma_fed)
    tma_fed: bool = False               # specialised only: with tensor maps every shared buffer is filled by TMA
    prologue: dict[int, int] = field(default_factory=dict)   # specialised only: load op id -> tensor map, the producer's
    prologue_tx: int = 0                # bytes those loads deliver per tile
    tma_stores: dict[int, int] = field(default_factory=dict)  # specialised only: register_to_global op id -> tensor
                                        # map; each warpgroup stores its rows through shared memory (_tma_stores)
    prologue_buffers: set[int] = field(default_factory=set)  # alloc_shared op ids those loads fill
    prologue_stages: int = 1            # persistent only: copies of those buffers, tile t's in copy t % stages, so the
                                        # producer loads tile t+1's while the consumers still read tile t's; the
                                        # emitter takes it back to 1 where shared memory cannot hold the copy
    ring_runs: list[tuple[int, ...]] = field(default_factory=list)   # not specialised: runs of consecutive TMA
                                        # pipelines (op ids) on one ring, each pipeline's first copies issued while
                                        # the one before runs (hk::ring_open / ring_steps / ring_close: _ring_runs)
    late_publish: set[int] = field(default_factory=set)   # loads before a run (attention's Q) published once the
                                        # run's first copies are issued, so both land together (_ring_runs)
    ring_hoist: list[int] = field(default_factory=list)   # quiet scalar ops inside a run that later pipelines' trip
                                        # counts or loads read: emitted when the run opens its ring

    layouts: dict = field(default_factory=dict, repr=False)   # the layout pass's choice the plan was made with
                                        # (value -> layout), which the emitter renders

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


def plan(program: Program, target: Target, variant: Variant = BASE, layouts: dict | None = None) -> Plan:
    """The schedule of `program` on `target` under `variant`, with its uses of spare shared memory fitted to the
    target (_fit_shared). `layouts`: the layout pass's choice, where already made (None: run it); the plan keeps
    it for the emitter."""
    if layouts is None:
        layouts = footprint.layouts(program, footprint.num_warps(program, target))
    p = _plan(program, target, variant, layouts)
    if isinstance(variant, FA3) and not (p.pingpong and p.prologue):
        p = _plan(program, target, Base(tma_store=variant.tma_store), layouts)
    _fit_shared(program, p, target)
    return p


def _plan(program: Program, target: Target, v: Variant, layouts: dict) -> Plan:
    fa3 = isinstance(v, FA3)
    strips = frozenset(val.id for val, lay in layouts.items() if isinstance(lay, Strip))
    out = Plan(grouped_blocks=grouped_blocks(program), layouts=layouts)
    producers = {r.id: op for op in program.body.walk() for r in op.results}
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if (fa3 or v.heavy_first) and not out.grouped_blocks:
        out.dispatch_axis = work_axis(pipes, producers)
    if not archs.of(target).async_tensor_core:
        return out
    params = {v.id: i for i, v in enumerate(program.body.args)}
    for op in pipes:
        out.pipelines[id(op)] = _plan_pipeline(op, producers, params, out)
    if not _specialisable(program, out, producers):
        if not fa3 and v.one_ring:
            _ring_runs(program, out, producers, params)
        return out
    out.producer_warps = PRODUCER_WARPS
    out.longest_first = v.longest_first if fa3 else LONGEST_FIRST_MIN
    if fa3:
        _fa3(program, pipes, out, producers, params, v)
    if v.tma_store:
        _tma_stores(program, out, producers, params, strips)
    out.tma_fed = _tma_fed(program, out, target)
    out.free_turns = out.pingpong and out.tma_fed
    return out


def _fa3(program: Program, pipes: list[Op], out: Plan, producers: dict, params: dict, v: FA3) -> None:
    """FA3's parts on a specialised plan: a persistent grid, the split ring, Q on the producer, the overlap, and
    the ping-pong where every pipeline took the split and the overlap."""
    out.persistent = True
    out.dispatch_axis = None          # a persistent block walks its tiles itself (work_axis below)
    out.work_axis = work_axis(pipes, producers) if v.longest_first else None
    _split_ring(pipes, out, producers, program.num_warps)
    _producer_prologue(program, pipes, out, producers, params)
    out.prologue_stages = v.prologue_stages if out.prologue else 1
    for op in pipes:
        pp = out.pipelines[id(op)]
        pp.overlap = dataflow.overlap_split(op.regions[1], out.mma_modes, program.num_warps)
        if pp.overlap and pp.groups and [g.reader for g in pp.groups] != [pp.overlap.head, pp.overlap.mma]:
            pp.overlap = None           # the split ring's waits sit where the head and the tail read
    out.pingpong = (out.ring_groups > 1 and program.num_warps >= 8
                    and all(out.pipelines[id(op)].overlap for op in pipes))


def _tma_fed(program: Program, p: Plan, target: Target) -> bool:
    """Whether, with tensor maps, the consumers write no shared memory in a tile: every shared buffer is filled
    by the producer's TMA copies (its ring, the prologue), nothing is stored to shared, no scratch. Then a
    persistent block's consumer warpgroups need not meet between tiles (the barriers order each buffer):
    one finishes its epilogue while the other still multiplies, and the ping-pong runs on across tiles."""
    ops = list(program.body.walk())
    if (footprint.scratch_bytes(program, footprint.num_warps(program, target), p.layouts)
            or any(o.opcode == "register_to_shared" for o in ops)):
        return False
    by_tma = {i for pp in p.pipelines.values() for i in pp.tma_loads} | set(p.prologue)
    return all(id(o) in by_tma for o in ops if o.opcode == "global_to_shared")


def _fit_shared(program: Program, p: Plan, target: Target) -> None:
    """The schedule's uses of spare shared memory, kept while the block still fits the target: the prologue's
    second copy is given up first (it measured neutral to a few percent), then the TMA stores' staging area."""
    if not footprint.fits(program, p, target):
        p.prologue_stages = 1
    if not footprint.fits(program, p, target):
        p.tma_stores = {}
        p.tensor_maps = [m for m in p.tensor_maps if not m.store]   # the stores' maps come last


FA3_WHY = ("FA3's schedule (split ring, Q on the producer, overlap, ping-pong, persistent grid): attention on two or "
           "three consumer warpgroups, built within FA3_SPILL_BYTES and with the register hand-over; on the H200 "
           "+20 % causal and +3-30 % unmasked against the shared ring on two (perf-notes 2026-12-03, fifth session), "
           "+8-15 % on D64's three (2026-12-04, tenth session)")
# FA3's schedule is taken on this many consumer warpgroups, kept where its build spills at most this many bytes:
# none on two (a spill there went with a slowdown, fifth session); on three, D64's 192-row block at 160 registers a
# consumer spills 16 bytes under NVRTC 13.0 (4 under 13.5) and still ran 8-15 % faster than without (tenth session)
FA3_SPILL_BYTES = {2: 0, 3: 16}


def fa3_variant(program: Program, target: Target, v: FA3) -> FA3 | None:
    """`v` where the backend takes FA3's schedule unasked, else None: a Program that can take all of it (attention,
    masked or not) on two or three consumer warpgroups (FA3_WHY's measurements). The backend keeps it only if the
    build keeps the register hand-over and spills no more than FA3_SPILL_BYTES."""
    if program.num_warps % PRODUCER_WARPS or program.num_warps // PRODUCER_WARPS not in FA3_SPILL_BYTES:
        return None
    p = _plan(program, target, v, footprint.layouts(program, footprint.num_warps(program, target)))
    return v if p.pingpong and p.prologue else None


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
        buf, spec = dataflow.buffer_of(g2s.operands[0], producers), _tma_spec(g2s, producers, params)
        users = [u for u in program.body.walk() if u is not g2s and u.opcode != "shared_stage"
                 and any(dataflow.buffer_of(v, producers) == buf for v in u.operands)]
        if (spec is None or not users
                or any(u.opcode != "mma" or id(u) not in inside or not dataflow.wgmma_eligible(u, program.num_warps) for u in users)):
            continue
        if spec not in out.tensor_maps:
            out.tensor_maps.append(spec)
        out.prologue[id(g2s)] = out.tensor_maps.index(spec)
        out.prologue_buffers.add(buf)
        t = g2s.operands[0].type
        out.prologue_tx += t.rows * t.cols * t.dtype.itemsize


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


def _ring_groups(pipe: Op, producers: dict, out: Plan, num_warps: int) -> list[RingGroup]:
    """The pipeline's staged buffers grouped by the one top-level compute op reading each (a staged wgmma,
    which retires before it returns), in the order those readers run; [] when a buffer has no such reader."""
    lreg, creg = pipe.regions
    if any(o.regions for o in creg.ops):
        return []
    readers: dict[int, list[Op]] = {}
    for o in (o for o in creg.ops if o.opcode != "shared_stage"):
        for b in {dataflow.stage_buffer(v, producers) for v in o.operands} - {None}:
            readers.setdefault(b, []).append(o)
    by_reader: dict[int, list[Op]] = {}
    for g2s in (o for o in lreg.walk() if o.opcode == "global_to_shared"):
        rs = readers.get(dataflow.stage_buffer(g2s.operands[0], producers), [])
        if (len(rs) != 1 or rs[0].opcode != "mma" or out.mma_modes.get(id(rs[0])) != MMA_STAGED
                or not dataflow.wgmma_eligible(rs[0], num_warps) or id(g2s) not in out.pipelines[id(pipe)].tma_loads):
            return []
        by_reader.setdefault(id(rs[0]), []).append(g2s)
    order = [o for o in creg.ops if id(o) in by_reader]
    return [RingGroup(r, tuple(id(g) for g in by_reader[id(r)]),
                      sum(g.operands[0].type.rows * g.operands[0].type.cols * g.operands[0].type.dtype.itemsize
                          for g in by_reader[id(r)])) for r in order]


# What a TMA load region may hold besides its copies (one thread issues it), and what the producer warpgroup runs
# of the Program: the scalars and shared addresses its loads need.
TMA_LOAD_REGION_OPS = opcodes.SCALAR_OPS | {"global_to_scalar", "shared_stage"}
PRODUCER_OPS = TMA_LOAD_REGION_OPS | {"alloc_shared"}
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
    staged = set().union(*(dataflow.staged_buffers(op.regions[0], producers) for op in pipes))
    others = [o for op in ops if op.opcode != "pipeline" for o in [op, *(n for r in op.regions for n in r.walk())]]
    return not any(dataflow.buffer_of(v, producers) in staged for o in others if o.opcode != "shared_stage"
                   for v in o.operands if isinstance(v.type, (TileType, SharedBufType)))


def _ring_runs(program: Program, out: Plan, producers: dict, params: dict) -> None:
    """Runs of consecutive top-level TMA pipelines of a block that is not specialised (attention's leading edge,
    full blocks and diagonal) on one ring of stages: the ring's barriers are set up once, its step count runs
    across the pipelines and each pipeline's first copies are issued while the one before computes, where
    separate rings started each pipeline on a barrier, a fresh ring and a copy waited for at once. A run takes
    pipelines with one stage count and one stage size, only quiet ops between them (dataflow.quiet), and later pipelines
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
        if o is None or id(o) not in index or not dataflow.quiet(o) or not all(isinstance(r.type, ScalarType) for r in o.results):
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
        elif not dataflow.quiet(op):                            # anything else touching memory ends a run
            runs.append(run)
            run = []
    runs.append(run)
    out.ring_runs = [tuple(r) for r in runs if len(r) > 1]
    out.ring_hoist = [id(o) for i, o in enumerate(ops) if id(o) in hoist and any(
        index[r[0]] < i < index[r[-1]] for r in out.ring_runs)]
    for r in out.ring_runs:
        first = index[r[0]]
        staged = set().union(*(dataflow.staged_buffers(ops[index[p]].regions[0], producers) for p in r))
        for j in range(first - 1, -1, -1):
            o = ops[j]
            if o.opcode == "global_to_shared" and dataflow.buffer_of(o.operands[0], producers) not in staged:
                out.late_publish.add(id(o))
            elif not dataflow.quiet(o):
                break


def _joins(op: Op, pp: PipelinePlan, first_op: Op, out: Plan, early, first: int, producers: dict) -> bool:
    """Whether pipeline `op` may join the run that began with `first_op` (at top-level index `first`)."""
    head = out.pipelines[id(first_op)]
    return (op.attrs["stages"] == first_op.attrs["stages"] and pp.tx_bytes == head.tx_bytes and not pp.groups
            and early(op.operands[0], first) and all(early(v, first) for v in dataflow.free_values(op.regions[0], producers)))


def _plan_pipeline(op: Op, producers: dict, params: dict, out: Plan) -> PipelinePlan:
    lreg, creg = op.regions
    staged = dataflow.staged_buffers(lreg, producers)
    written = dataflow.written_buffers(op, producers) - staged
    pp = PipelinePlan("cp_async")
    for mma in (o for o in creg.walk() if o.opcode == "mma"):
        if all(dataflow.published(v, producers, staged, written) for v in mma.operands[:2]):
            out.mma_modes[id(mma)] = MMA_STAGED
    if dataflow.is_accumulator_chain(creg, producers):
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


def _tma_loads(lreg, producers: dict, params: dict) -> list[tuple[Op, TmaLoad]] | None:
    """The TMA form of every load in the region, or None when one of them has none."""
    loads = []
    for o in lreg.walk():
        if o.opcode == "global_to_shared":
            spec = _tma_spec(o, producers, params)
            if spec is None:
                return None
            loads.append((o, spec))
        elif o.opcode not in TMA_LOAD_REGION_OPS:
            return None                 # anything else in the load region keeps the all-threads ring
    return loads or None


def _tma_spec(o: Op, producers: dict, params: dict) -> TmaLoad | None:
    st, gl = o.operands[:2]
    t = st.type
    item = t.dtype.itemsize
    if (o.attrs.get("fill", 0.0) != 0.0 or dataflow.stage_buffer(st, producers) is None or gl.id not in params
            or not isinstance(gl.type, GlobalType) or gl.type.rank < 2 or item not in (1, 2)
            or (t.cols * item) % TMA_SWIZZLE_BYTES or t.rows % 8 or t.rows > TMA_MAX_BOX):
        return None
    return TmaLoad(params[gl.id], gl.type.rank, gl.type.dtype.name, t.rows, TMA_SWIZZLE_BYTES // item)


def fast_path(program: Program, target: Target) -> bool:
    """Whether every pipeline of the Program runs on TMA and every mma in them on wgmma (sm_90a): what
    the backend's configuration choice looks for among a kernel's candidates."""
    p = plan(program, target)
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if not pipes or any(p.pipelines[id(op)].schedule != "tma" for op in pipes):
        return False
    return all(dataflow.wgmma_eligible(m, program.num_warps) for op in pipes for m in op.regions[1].walk()
               if m.opcode == "mma")


def describe(program: Program, p: Plan, target: Target) -> str:
    """The plan as text (`hk compile --emit lowered`, after the Program)."""
    lines = [f"// schedule (cuda backend, {target.spec})"]
    hopper = archs.of(target).async_tensor_core
    names = {id(op): f"%{op.results[0].id}" if op.results else op.opcode for op in program.body.walk()}
    mode = {MMA_STANDALONE: "standalone (barrier + fence, waits)", MMA_STAGED: "staged (no barrier, waits)",
            MMA_ASYNC: "async (left in flight; the pipeline waits a step later)"}
    for op in program.body.walk():
        if op.opcode == "pipeline":
            pp = p.pipelines.get(id(op), PipelinePlan("cp_async"))
            extra = f", {len(pp.tma_loads)} tile loads/stage ({pp.tx_bytes} bytes)" if pp.schedule == "tma" else ""
            if p.producer_warps:
                block, prod, cons = occupancy.register_split(program.num_warps, p.producer_warps, archs.of(target))
                extra += (f", warp-specialised ({p.producer_warps} producer warps issue the loads; registers "
                          f"{block} -> producer {prod}, consumers {max(cons, block)})")
            if pp.overlap:
                extra += (f", software-pipelined (head {names[id(pp.overlap.head)]}; tail "
                          f"{', '.join(names[id(o)] for o in pp.overlap.tail)} one step late; crossing "
                          f"{', '.join(f'%{v.id}' for v in pp.overlap.crossing)})")
            lines.append(f"pipeline {names[id(op)]}: {pp.schedule}{extra}, stages={op.attrs['stages']}")
        elif op.opcode == "mma" and not (hopper and dataflow.wgmma_eligible(op, program.num_warps)):
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
    for run in p.ring_runs:
        lines.append(f"pipelines {', '.join(names[i] for i in run)} share one ring (each one's first copies issued while "
                     "the one before computes; the SM fill may take separate rings)")
    if hopper and not p.producer_warps and any(pp.schedule == "tma" for pp in p.pipelines.values()):
        lines.append("ring refills: before a step whose products wait for themselves")
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
