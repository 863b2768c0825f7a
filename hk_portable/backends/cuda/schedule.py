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

`plan(program, target, variant)` returns the decisions, a frozen `Plan` (plan.py) with a reason for each, taken here
alone: the passes below return what they decide and `_Draft` records each value with its reason until the plan is
frozen. `plan.describe` prints them (the backend's lowering passes, `hk compile --emit lowered`).
"""
from __future__ import annotations

from dataclasses import MISSING, fields, replace
from types import MappingProxyType

from ...codegen import patterns
from ...codegen.layouts import Strip
from ...interface.backend import Target
from ...interface.ir import Op, Program, ScalarType, SharedBufType, TileType, Value
from . import archs, dataflow, deferred, footprint, occupancy, tma_writes
from .dataflow import MMA_ASYNC, MMA_STAGED
from .plan import DECISIONS, EMPTY, HandOver, PipelinePlan, Plan, RingGroup, TmaLoad
from .variants import BASE, FA3, LONGEST_FIRST_MIN, Base, Variant

PRODUCER_WARPS = 4               # one warpgroup: setmaxnreg moves registers per warpgroup


def grouped_blocks(program: Program) -> bool:
    """A 2-D grid of output tiles whose pipelined mma reads operands along both axes (a GEMM) is ordered so
    that neighbouring blocks share operand tiles in L2: runs of 8 x-rows sweep y. Other grids keep the
    hardware order, in which consecutive x already share everything (attention's blocks of one head)."""
    axes = {op.attrs["axis"] for op in program.body.walk() if op.opcode == "block_idx"}
    pipelined_mma = any(op.opcode == "pipeline" and any(o.opcode == "mma" for o in op.regions[1].walk())
                        for op in program.body.walk())
    return axes == {0, 1} and pipelined_mma


def plan(program: Program, target: Target, variant: Variant = BASE, layouts: dict | None = None, *,
         min_blocks: int | None = None, hand_over: bool = True, fast_exp2: bool = True, tma_reduce: bool = True) -> Plan:
    """The schedule of `program` on `target` under `variant`, with its uses of spare shared memory fitted to the
    target (_fit_shared) and the build's choices (`min_blocks`, `hand_over`, `fast_exp2`: backend._build's search)
    applied to it. `layouts`: the layout pass's choice, where already made (None: run it); the plan keeps it for
    the emitter."""
    if layouts is None:
        layouts = footprint.layouts(program, footprint.num_warps(program, target))
    d = _plan(program, target, variant, layouts)
    if isinstance(variant, FA3) and not (d.pingpong and d.prologue):
        lacks = "a load before the pipelines for the producer" if d.pingpong else "the ping-pong"
        d = _plan(program, target, Base(tma_store=variant.tma_store), layouts)
        d.take(f"FA3's schedule asked, but this Program cannot take all of it (it lacks {lacks}), and none of its "
               "parts alone is a schedule", variant=Base.name)
    _fit_shared(program, d, target)
    _emitted_forms(program, d)
    _build_choices(program, target, d, min_blocks, hand_over, fast_exp2)
    if d.tma_reduces and not tma_reduce:    # the build search's last resort where the adds' build spilled
        d.take("the build's: atomics from registers, where the TMA reduce-adds' build spilled", tma_reduces=EMPTY,
               tensor_maps=tuple(m for m in d.tensor_maps if not m.reduce))    # the reduce maps come last
    return d.frozen()


class _Draft:
    """The plan while it is decided: each decision taken with its reason (`take`), read back by the decisions after
    it (and by footprint.fits, as a plan), frozen into the Plan once every decision is taken (`frozen`)."""

    def __init__(self, layouts: dict):
        self.layouts = layouts
        self.values: dict = {}
        self.reasons: dict[str, str] = {}

    def take(self, why: str, **decided):
        for name, value in decided.items():
            assert name in DECISIONS, name
            self.values[name], self.reasons[name] = value, why

    def rest(self, why: str) -> None:
        """Every decision of the schedule not taken yet (not the build's: `BUILD`), at the Plan's default, for `why`."""
        self.take(why, **{f.name: f.default if f.default_factory is MISSING else f.default_factory()
                          for f in fields(Plan) if f.name in DECISIONS and f.name not in (*self.values, *BUILD, *FORMS)})

    def __getattr__(self, name: str):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def frozen(self) -> Plan:
        missing = [n for n in DECISIONS if n not in self.values]
        assert not missing, f"decisions not taken: {missing}"
        return Plan(**self.values, reasons=tuple(self.reasons.items()),
                    layouts=MappingProxyType(dict(self.layouts)))


def _plan(program: Program, target: Target, v: Variant, layouts: dict) -> _Draft:
    fa3 = isinstance(v, FA3)
    d = _Draft(layouts)
    d.take("FA3's schedule asked (the fa3 option, or fa3_variant where it measured a gain)" if fa3
           else "the schedule every program gets unless FA3's is taken", variant=v.name)
    producers = {r.id: op for op in program.body.walk() for r in op.results}
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    grouped = grouped_blocks(program)
    d.take(GROUPED_WHY if grouped else UNGROUPED_WHY, grouped_blocks=grouped)
    axis, why = _dispatch_axis(pipes, producers, grouped, fa3 or v.heavy_first)
    d.take(why, dispatch_axis=axis)
    if not archs.of(target).async_tensor_core:
        d.rest(f"{target.arch} has no async tensor core: the cp.async ring and mma.sync, no TMA, wgmma or warp "
               "specialisation")
        return d
    params = {v.id: i for i, v in enumerate(program.body.args)}
    maps: list[TmaLoad] = []                 # tensor maps in the order the passes ask for them
    pipelines, modes = {}, {}
    for op in pipes:
        pipelines[id(op)] = _plan_pipeline(op, producers, params, maps, modes)
    d.take(MODES_WHY, mma_modes=MappingProxyType(modes))
    not_specialised = _not_specialisable(program, pipelines, producers)
    if not_specialised:
        _one_ring(program, d, v, pipelines, producers, params)
        d.take(PIPELINES_WHY, pipelines=MappingProxyType(pipelines))
        d.take(MAPS_WHY, tensor_maps=tuple(maps))
        d.rest(f"not warp-specialised: {not_specialised}")
        return d
    d.take(f"warp-specialised: every pipeline on TMA at the top level with one stage count, {program.num_warps} "
           "warps, nothing else touching a staged buffer: a producer warpgroup issues every load",
           producer_warps=PRODUCER_WARPS)
    d.take("the Program's scalars and shared addresses, which the producer's loads read",
           producer_runs=frozenset(id(o) for o in program.body.ops if o.opcode in PRODUCER_OPS))
    d.take("the FA3 variant's" if fa3 else "LONGEST_FIRST_MIN (read where the grid is persistent)",
           longest_first=v.longest_first if fa3 else LONGEST_FIRST_MIN)
    if fa3:
        _fa3(program, pipes, d, pipelines, producers, params, maps, v)
    else:
        d.take("FA3's part: the base variant runs without it", persistent=False, work_axis=None, ring_groups=1,
               prologue=EMPTY, prologue_buffers=frozenset(), prologue_tx=0, prologue_stages=1, pingpong=False)
    d.take(PIPELINES_WHY, pipelines=MappingProxyType(pipelines))
    orders = {id(op): order for op in pipes if not (pipelines[id(op)].overlap or pipelines[id(op)].async_mma)
              for order in [deferred.plan(op.regions[1], producers, modes, program.num_warps,
                                          getattr(v, "defer_wgmma", ""))] if order}
    d.take(DEFERRED_WHY if orders else "the variant defers no wgmma (defer_wgmma)" if not getattr(v, "defer_wgmma", "")
           else "no staged wgmma outside FA3's overlap to defer",
           compute_orders=MappingProxyType(orders))
    d.take(MODES_WHY + ("; deferred: a staged wgmma of such a region" if orders else ""),
           mma_modes=MappingProxyType(modes))
    strips = frozenset(val.id for val, lay in layouts.items() if isinstance(lay, Strip))
    stores = tma_writes.stores(program, params, strips, maps) if v.tma_store else {}
    d.take(TMA_STORES_WHY if stores else "the variant's tma_store is off" if not v.tma_store
           else "no store after the pipelines TMA can take", tma_stores=MappingProxyType(stores))
    wanted = v.tma_store and getattr(v, "tma_reduce", False)
    reduces = tma_writes.reduces(program, params, strips, maps) if wanted else {}
    d.take(TMA_REDUCES_WHY if reduces else "the variant's tma_store or tma_reduce is off" if not wanted
           else "no atomic add of a whole f32 register tile TMA can take", tma_reduces=MappingProxyType(reduces))
    d.take(MAPS_WHY, tensor_maps=tuple(maps))
    fed, why = _tma_fed(program, target, layouts, pipelines, d.prologue)
    d.take(why, tma_fed=fed)
    d.take("the ping-pong's turns run on across pipelines and tiles: the consumers write no shared memory of their "
           "own" if d.pingpong and d.tma_fed else "only a ping-pong on a block fed by TMA alone",
           free_turns=d.pingpong and d.tma_fed)
    d.rest("a specialised block's pipelines share the producer's ring already")
    return d


MODES_WHY = ("staged: a pipeline's mma whose shared operands the pipeline has published (its stages, buffers written "
             "only before it); async: one whose compute region is a pure accumulator chain; else standalone")
DEFERRED_WHY = ("the variant's defer_wgmma: those staged wgmma of a specialised compute region left in flight and waited "
                "for where the step first reads them; with 'all', an independent one issued right after the region's "
                "first (deferred.py)")
GROUPED_WHY = ("a 2-D grid of output tiles whose pipelined mma reads operands along both axes (a GEMM): runs of 8 "
               "x-rows sweep y, so neighbouring blocks share operand tiles in L2")
UNGROUPED_WHY = "not a GEMM's 2-D grid: the hardware order (x fastest), in which consecutive x share everything"
PIPELINES_WHY = "each pipeline's schedule, with its reason, on its line above"
MAPS_WHY = "one per (tensor, box) that the TMA loads and stores go through, encoded by the host at launch (tma.py)"
TMA_REDUCES_WHY = ("atomic adds of whole f32 register tiles (attention_bwd's dQ): each consumer warpgroup writes its 64 "
                   "rows to shared memory in 32-column chunks (a transposed view's tile transposed back) and one thread "
                   "adds each chunk into the tensor by TMA reduce-add, instead of one red.global per element and thread")
TMA_STORES_WHY = ("the epilogue's stores of whole 16-bit register tiles: each consumer warpgroup writes its 64 rows to "
                  "shared memory a 64-column chunk at a time and one thread copies each chunk out by TMA")


def _dispatch_axis(pipes: list[Op], producers: dict, grouped: bool, wanted: bool) -> tuple[int | None, str]:
    """The axis of the heaviest-first dispatch (hk::heavy_first_idx), and why."""
    if grouped:
        return None, "grouped blocks keep their order"
    if not wanted:
        return None, ("the variant's heavy_first is off (the SM fill gives it up where only the build without it "
                      "fills the SM: backend._fill_sm)")
    axis = work_axis(pipes, producers)
    if axis is None:
        return None, "no one block_idx axis the pipelines' trip counts grow with"
    return axis, f"the pipelines' trip counts grow along block_idx axis {axis}: each run of rows heaviest first"


def _one_ring(program: Program, d: _Draft, v: Variant, pipelines: dict, producers: dict, params: dict) -> None:
    """The runs of TMA pipelines on one ring of a block that is not specialised (_ring_runs), where the variant
    allows them (FA3's plan is specialised or not taken)."""
    if isinstance(v, FA3) or not v.one_ring:
        return d.take("off in the variant (the SM fill gives it up where only the build without it fills the SM: "
                      "backend._fill_sm)", ring_runs=(), ring_hoist=(), late_publish=frozenset())
    runs, hoist, late = _ring_runs(program, pipelines, producers, params)
    d.take("consecutive TMA pipelines with one stage count and size and only quiet ops between share one ring: each "
           "one's first copies issued while the one before computes" if runs else "no two consecutive TMA pipelines "
           "that could share a ring", ring_runs=runs)
    d.take("scalars inside a run that later pipelines' trip counts or loads read: emitted when the run opens its ring",
           ring_hoist=hoist)
    d.take("loads before a run with only quiet ops between: published once the run's first copies are issued, so "
           "both are in flight together", late_publish=late)


def _fa3(program: Program, pipes: list[Op], d: _Draft, pipelines: dict, producers: dict, params: dict,
         maps: list[TmaLoad], v: FA3) -> None:
    """FA3's parts on a specialised plan: a persistent grid, the split ring, Q on the producer, the overlap, and
    the ping-pong where every pipeline took the split and the overlap."""
    d.take("a persistent block walks its tiles itself (work_axis)", dispatch_axis=None)
    d.take("FA3's persistent grid: one block per SM walks the logical grid's tiles, the ring running on across them",
           persistent=True)
    axis = work_axis(pipes, producers) if v.longest_first else None
    d.take(f"tiles' work grows along block_idx axis {axis}: walked slowest, longest tiles first once it has "
           "longest_first blocks" if axis is not None else "the variant's longest_first is 0: block order"
           if not v.longest_first else "no one block_idx axis the tiles' trip counts grow with: block order",
           work_axis=axis)
    groups = _split_ring(pipes, pipelines, d.mma_modes, producers, program.num_warps)
    for op in pipes:
        pipelines[id(op)] = replace(pipelines[id(op)], groups=groups.get(id(op), ()))
    d.take("each pipeline's staged buffers fall into groups by their one staged wgmma reader: barriers of their own, "
           "so K is refilled once QKᵀ retired while V is still read" if groups else "the staged buffers do not fall "
           "into two or more groups by one reader in every pipeline: one barrier pair a stage",
           ring_groups=max((len(g) for g in groups.values()), default=1))
    prologue, buffers, tx = _producer_prologue(program, pipes, producers, params, maps)
    d.take("loads before the pipelines into buffers only the pipelines' wgmma read: issued by the producer's TMA on a "
           "barrier pair of their own" if prologue else "no load before the pipelines that only their wgmma read",
           prologue=MappingProxyType(prologue), prologue_buffers=frozenset(buffers), prologue_tx=tx)
    d.take("the variant's: the producer loads the next tile's while the consumers read this tile's" if prologue
           else "no prologue", prologue_stages=v.prologue_stages if prologue else 1)
    for op in pipes:
        pp = pipelines[id(op)]
        ov = dataflow.overlap_split(op.regions[1], d.mma_modes, program.num_warps)
        if ov and pp.groups and [g.reader for g in pp.groups] != [ov.head, ov.mma]:
            ov = None                   # the split ring's waits sit where the head and the tail read
        pipelines[id(op)] = replace(pp, overlap=ov)
    pingpong = (d.ring_groups > 1 and program.num_warps >= 8 and all(pipelines[id(op)].overlap for op in pipes))
    d.take("a split ring and every compute region software-pipelined (head, then the last step's tail): the consumer "
           "warpgroups take turns issuing a step's products" if pingpong else "needs the split ring and every "
           "compute region overlapped", pingpong=pingpong)


def _tma_fed(program: Program, target: Target, layouts: dict, pipelines: dict, prologue) -> tuple[bool, str]:
    """Whether, with tensor maps, the consumers write no shared memory in a tile: every shared buffer is filled
    by the producer's TMA copies (its ring, the prologue), nothing is stored to shared, no scratch. Then a
    persistent block's consumer warpgroups need not meet between tiles (the barriers order each buffer):
    one finishes its epilogue while the other still multiplies, and the ping-pong runs on across tiles."""
    ops = list(program.body.walk())
    if footprint.scratch_bytes(program, footprint.num_warps(program, target), layouts):
        return False, "the library's scratch is written in every tile"
    if any(o.opcode == "register_to_shared" for o in ops):
        return False, "the consumers store to shared memory"
    by_tma = {i for pp in pipelines.values() for i in pp.tma_loads} | set(prologue)
    if not all(id(o) in by_tma for o in ops if o.opcode == "global_to_shared"):
        return False, "a shared buffer is filled by the consumers' own copies"
    return True, "every shared buffer filled by the producer's TMA copies; nothing stored to shared, no scratch"


def _fit_shared(program: Program, d: _Draft, target: Target) -> None:
    """The schedule's uses of spare shared memory, kept while the block still fits the target: the prologue's
    second copy is given up first (it measured neutral to a few percent), then the TMA stores' staging area."""
    if d.prologue_stages > 1 and not footprint.fits(program, d, target):
        d.take("shared memory cannot hold a second copy of the prologue's buffers (given up first: it measured "
               "neutral to a few percent)", prologue_stages=1)
    if (d.tma_stores or d.tma_reduces) and not footprint.fits(program, d, target):
        d.take("shared memory cannot hold the staging area of the TMA stores and reduce-adds: plain stores and atomics",
               tma_stores=EMPTY, tma_reduces=EMPTY,
               tensor_maps=tuple(m for m in d.tensor_maps if not m.store))    # the written maps come last


BUILD = ("hand_over", "min_blocks", "fast_exp2")     # the build search's knobs (backend._build), decided last
FORMS = ("folded_scales", "tile_invariant", "tile_dividers")   # forms of ops the plan settles: _emitted_forms


def _emitted_forms(program: Program, d: _Draft) -> None:
    """The forms some ops take in the kernel: a softmax's scale folded (where its scores are not in a strip: the
    library folds it on fragments), and what a persistent block computes once before its tile loop."""
    folds = patterns.folded_scales(program, lambda v: not isinstance(d.layouts.get(v), Strip))
    d.take("a softmax's scale folded into its row max and its exp2 argument: the mul skipped, the difference one fma"
           if folds else "no softmax scale to fold", folded_scales=MappingProxyType({id(o): f for o, f in folds.items()}))
    if not d.persistent:
        d.take("not persistent: each block runs one tile", tile_invariant=(), tile_dividers=())
        return
    ops = patterns.tile_invariant(program)
    d.take("persistent: the scalars no tile index reaches, and dividers by their divisors, once before the tile loop",
           tile_invariant=tuple(id(o) for o in ops),
           tile_dividers=tuple(patterns.invariant_divisors(program, {v for o in ops for v in o.results})))


def _build_choices(program: Program, target: Target, d: _Draft, min_blocks: int | None, hand_over: bool,
                   fast_exp2: bool) -> None:
    """What the build search's knobs mean for this plan: the register hand-over and the launch bounds."""
    split, why = _hand_over(program, target, d.producer_warps, hand_over)
    d.take(why, hand_over=split)
    if d.producer_warps:
        d.take("a specialised block runs alone on its SM (its hand-over assumes the whole register file): ptxas need "
               "not cap registers for occupancy", min_blocks=1)
    else:
        d.take("the build's: none, ptxas's own register choice" if min_blocks is None else "the build's (1 where "
               "ptxas spilled, else as many as shared memory allows: occupancy.py)", min_blocks=min_blocks)
    d.take("the build's: one ex2.approx.ftz" if fast_exp2 else "the build's: exp2f, where the flushing form spilled",
           fast_exp2=fast_exp2)


def _hand_over(program: Program, target: Target, producer_warps: int, wanted: bool) -> tuple[HandOver | None, str]:
    """setmaxnreg's counts in a specialised block (occupancy.register_split), or None, and why. The incs only balance
    the decs if ptxas allocates exactly `block` registers a thread: the backend checks that after compiling
    (`hand_over_registers` in the launch extras) and builds without the hand-over where it did not."""
    if not producer_warps:
        return None, "not warp-specialised"
    split = HandOver(*occupancy.register_split(footprint.num_warps(program, target), producer_warps, archs.of(target)))
    if split.consumer <= split.block:
        return None, f"the block gives every thread {split.block} registers already: the consumers would gain none"
    if not wanted:
        return None, "the build's: ptxas did not allocate exactly the block's registers (setmaxnreg.inc would wait)"
    return split, "the producer warpgroup needs few registers: setmaxnreg moves them to the consumers"


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


def _split_ring(pipes: list[Op], pipelines: dict, modes, producers: dict, num_warps: int) -> dict[int, tuple]:
    """{pipeline op id: its RingGroups} when every pipeline's staged buffers fall into the same number (two or more)
    of groups by their one reader, else {}: each group gets its own full/empty barriers per stage, so a stage's K is
    refilled once QKᵀ retired while its V is still being read (FA3 releases them apart)."""
    groups = [_ring_groups(op, producers, pipelines[id(op)], modes, num_warps) for op in pipes]
    if all(groups) and len({len(g) for g in groups}) == 1 and len(groups[0]) > 1:
        return {id(op): tuple(g) for op, g in zip(pipes, groups)}
    return {}


def _producer_prologue(program: Program, pipes: list[Op], producers: dict, params: dict,
                       maps: list[TmaLoad]) -> tuple[dict[int, int], set[int], int]:
    """Loads before the first pipeline that the producer issues by TMA on a barrier pair of their own (attention's
    Q), as (load op id -> tensor map, the buffers they fill, the bytes they deliver a tile): a whole-tile load into a
    buffer that nothing but the pipelines' wgmma read and nothing else writes. The consumers wait for it instead of
    loading it; a persistent block releases it after its last pipeline, so the producer loads the next tile's while
    the consumers run this tile's epilogue."""
    ops = program.body.ops
    first = next(k for k, o in enumerate(ops) if o.opcode == "pipeline")
    inside = {id(o) for op in pipes for r in op.regions for o in r.walk()}
    prologue, buffers, tx = {}, set(), 0
    for g2s in (o for o in ops[:first] if o.opcode == "global_to_shared"):
        buf, spec = dataflow.buffer_of(g2s.operands[0], producers), dataflow.tma_spec(g2s, producers, params)
        users = [u for u in program.body.walk() if u is not g2s and u.opcode != "shared_stage"
                 and any(dataflow.buffer_of(v, producers) == buf for v in u.operands)]
        if (spec is None or not users
                or any(u.opcode != "mma" or id(u) not in inside or not dataflow.wgmma_eligible(u, program.num_warps) for u in users)):
            continue
        prologue[id(g2s)] = tma_writes.map_index(maps, spec)
        buffers.add(buf)
        tx += dataflow.copy_bytes(g2s)
    return prologue, buffers, tx


def _ring_groups(pipe: Op, producers: dict, pp: PipelinePlan, modes, num_warps: int) -> list[RingGroup]:
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
        if (len(rs) != 1 or rs[0].opcode != "mma" or modes.get(id(rs[0])) != MMA_STAGED
                or not dataflow.wgmma_eligible(rs[0], num_warps) or id(g2s) not in pp.tma_loads):
            return []
        by_reader.setdefault(id(rs[0]), []).append(g2s)
    order = [o for o in creg.ops if id(o) in by_reader]
    return [RingGroup(r, tuple(id(g) for g in by_reader[id(r)]), sum(dataflow.copy_bytes(g) for g in by_reader[id(r)]))
            for r in order]


# What the producer warpgroup runs of the Program: the scalars and shared addresses its loads need.
PRODUCER_OPS = dataflow.TMA_LOAD_REGION_OPS | {"alloc_shared"}
MIN_SPECIALISED_WARPS = 8        # two consumer warpgroups: a smaller block would lose occupancy to the producer


def _not_specialisable(program: Program, pipelines: dict, producers: dict) -> str | None:
    """Why the kernel cannot run warp-specialised, or None where it can: a producer warpgroup (few registers) runs
    the Program's scalars and issues every pipeline's TMA loads into one ring of stages, then leaves; the Program's
    warps (more registers) run everything else, wait only on full barriers and release stages by mbarrier.
    Taken when every pipeline is at the top level, on TMA, with one stage count (they share the ring), the
    Program's warps are two or more whole warpgroups, and no other op touches a staged buffer (the
    producer fills them whenever the ring lets it)."""
    ops = program.body.ops
    pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
    if not pipes:
        return "no pipeline"
    if program.num_warps % 4 or program.num_warps < MIN_SPECIALISED_WARPS:
        return f"{program.num_warps} warps, not two or more whole warpgroups beside the producer's"
    if any(op not in ops or pipelines[id(op)].schedule != "tma" for op in pipes):
        return "a pipeline inside another op or on the cp.async ring"
    if len({op.attrs["stages"] for op in pipes}) != 1:
        return "pipelines with different stage counts (the producer's ring has one)"
    staged = set().union(*(dataflow.staged_buffers(op.regions[0], producers) for op in pipes))
    others = [o for op in ops if op.opcode != "pipeline" for o in [op, *(n for r in op.regions for n in r.walk())]]
    if any(dataflow.buffer_of(v, producers) in staged for o in others if o.opcode != "shared_stage"
           for v in o.operands if isinstance(v.type, (TileType, SharedBufType))):
        return "an op outside the pipelines touches a staged buffer (the producer fills them whenever the ring lets it)"
    return None


def _ring_runs(program: Program, pipelines: dict, producers: dict,
               params: dict) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...], frozenset[int]]:
    """(the runs, the ops their ring_open hoists, the loads published late): runs of consecutive top-level TMA
    pipelines of a block that is not specialised (attention's leading edge, full blocks and diagonal) on one ring
    of stages: the ring's barriers are set up once, its step count runs across the pipelines and each pipeline's
    first copies are issued while the one before computes, where separate rings started each pipeline on a barrier,
    a fresh ring and a copy waited for at once. A run takes pipelines with one stage count and one stage size, only
    quiet ops between them (dataflow.quiet), and later pipelines whose trip counts and loads read only values defined
    before the run's first pipeline (their loads are issued early). A global_to_shared before the run with only
    quiet ops between (attention's Q) is published once the run's first copies are issued (late_publish): its copy
    and theirs are in flight together."""
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
        pp = pipelines.get(id(op)) if op.opcode == "pipeline" else None
        if pp is not None and pp.schedule == "tma":
            if run and _joins(op, pp, ops[index[run[0]]], pipelines, early, index[run[0]], producers):
                run.append(id(op))
            else:
                runs.append(run)
                run = [id(op)]
        elif not dataflow.quiet(op):                            # anything else touching memory ends a run
            runs.append(run)
            run = []
    runs.append(run)
    ring_runs = tuple(tuple(r) for r in runs if len(r) > 1)
    ring_hoist = tuple(id(o) for i, o in enumerate(ops) if id(o) in hoist and any(
        index[r[0]] < i < index[r[-1]] for r in ring_runs))
    late = set()
    for r in ring_runs:
        first = index[r[0]]
        staged = set().union(*(dataflow.staged_buffers(ops[index[p]].regions[0], producers) for p in r))
        for j in range(first - 1, -1, -1):
            o = ops[j]
            if o.opcode == "global_to_shared" and dataflow.buffer_of(o.operands[0], producers) not in staged:
                late.add(id(o))
            elif not dataflow.quiet(o):
                break
    return ring_runs, ring_hoist, frozenset(late)


def _joins(op: Op, pp: PipelinePlan, first_op: Op, pipelines: dict, early, first: int, producers: dict) -> bool:
    """Whether pipeline `op` may join the run that began with `first_op` (at top-level index `first`)."""
    head = pipelines[id(first_op)]
    return (op.attrs["stages"] == first_op.attrs["stages"] and pp.tx_bytes == head.tx_bytes and not pp.groups
            and early(op.operands[0], first) and all(early(v, first) for v in dataflow.free_values(op.regions[0], producers)))


def _plan_pipeline(op: Op, producers: dict, params: dict, maps: list[TmaLoad], modes: dict) -> PipelinePlan:
    """The pipeline's schedule, with the modes of the mma in its compute region (into `modes`)."""
    lreg, creg = op.regions
    staged = dataflow.staged_buffers(lreg, producers)
    written = dataflow.written_buffers(op, producers) - staged
    for mma in (o for o in creg.walk() if o.opcode == "mma"):
        if all(dataflow.published(v, producers, staged, written) for v in mma.operands[:2]):
            modes[id(mma)] = MMA_STAGED
    async_mma = False
    if dataflow.is_accumulator_chain(creg, producers):
        (mma,) = [o for o in creg.ops if o.opcode == "mma"]
        if modes.get(id(mma)) == MMA_STAGED:
            modes[id(mma)] = MMA_ASYNC
            async_mma = True
    if op.attrs["stages"] < 2:
        return PipelinePlan("cp_async", "one stage: nothing to prefetch, a copy would be waited on right after issue",
                            async_mma=async_mma)
    loads, why = dataflow.tma_loads(lreg, producers, params)
    if loads is None:
        return PipelinePlan("cp_async", why, async_mma=async_mma)
    return PipelinePlan("tma", why, MappingProxyType({id(g2s): tma_writes.map_index(maps, spec) for g2s, spec in loads}),
                        sum(dataflow.copy_bytes(g2s) for g2s, _ in loads), async_mma)


