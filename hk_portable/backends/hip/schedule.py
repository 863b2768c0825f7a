"""The hip backend's decisions for one program on one target: the `Plan`, made once by `make_plan`. Its records
(the decisions and their reasons) go into the Artifact; the `Lowering` it carries says what they mean op by op,
so that codegen.HipEmitter only renders. patterns.py finds the ops lowered in forms of their own; this module
is the one that decides, and the only caller of those finders.

Decided here, per program and target:
  * waves per block: the kernel's `num_warps` hint (1..16), or the `waves` option (options.py), of the arch
    row's wave size (archs.Arch.wave_size);
  * the schedule of each `hk.pipeline`: plain double buffering, or the 8-wave ping-pong when the kernel
    asks for 8 waves, the pipeline has 3+ stages and its compute step never talks to other waves
    (the `schedule` option: "auto" | "double_buffer" | "pingpong" overrides);
  * scratch LDS for the library's exchanges between waves (column reductions, register mma operands
    that are not the wave's own rows), sized with the library's own formulas;
  * layouts (codegen/layouts.py, with this library's strips, wave-grid accumulators, transposed-fragment
    accumulators and column-major shared tiles) and, per pipeline load that walks one index by the step, a
    cursor that computes its addresses once before the loop (patterns.cursor_loads);
  * operands held in registers: a shared tile read only as the A operand of transposed-fragment mmas inside
    pipelines (attention's Q) is read into registers once, before the first of them (`preloads`), and its
    LDS is then free for the buffers those pipelines fill (`arena`);
  * per pipeline, whether its step's loads are split around the compute step (`split_prefetch`): the
    global reads of tile i+AHEAD issued before compute(i), their LDS writes (or LDS-DMA waits) after it,
    so the loads are in flight while the MFMAs run; recorded as the schedule's "prefetch";
  * per pipeline, whether the MFMAs of its PV mma are interleaved with P's exp2 (patterns.interleaved_pv;
    the `interleave` option); recorded as the schedule's "interleave";
  * gfx942's fp8 (e4m3 x e4m3 on FNUZ hardware, docs/fp8.md): shared tiles stored as FNUZ codes, mapped
    once on the way in (`fnuz_storage`), and k-loop accumulators kept in the quartered domain, rescaled
    once after the loop (`quartered_carries`); recorded in `Plan.fp8`.
The backend revisits two of them after compiling (`unsplit`, `uninterleaved`: backend.py, HipBackend.compile).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from ...codegen import resources
from ...codegen.layouts import (Strip, TFragment, assign_layouts, assign_shared_storage, shared_buffer_uses,
                                strip_reduce_scratch, with_stages)
from ...codegen.resources import mma_scratch_bytes
from ...interface import opcodes
from ...interface.backend import Target
from ...interface.errors import UnsupportedError
from ...interface.ir import Op, Program, Region, SharedBufType, TileType, Value
from . import archs
from .archs import ARCHS
from .options import MAX_WAVES, PIPELINE_FORMS, HipOptions
from .patterns import (cursor_loads, folded_scales, fused_epilogues, fused_grid_loads, fused_masks, interleaved_pv,
                       lazy_rescales, nan_row_casts)

SCRATCH_ALIGN = 16          # hk_hip.h's granule for its scratch area (and an mma's A part)


def _blocks(n: int) -> int:
    return -(-n // 16)


# ----------------------------------------------------------------------------------------- layouts
def register_layouts(program: Program, waves: int, lanes: int) -> dict:
    """The layout pass's choice of register layouts for this backend (its library implements strips over a
    wave's `lanes`, wave grids and transposed fragments)."""
    return assign_layouts(program, waves, strips=True, lanes=lanes, grids=True, tfrags=True)


def layouts(program: Program, waves: int, lanes: int, arch: str | None = None) -> dict:
    """register_layouts, then shared buffers and their stages (`shared_storage`; `arch` None: as on an arch
    without a transposing LDS read)."""
    regs = register_layouts(program, waves, lanes)
    return {**regs, **shared_storage(program, regs, arch)}


def shared_storage(program: Program, regs: dict, arch: str | None) -> dict:
    """layouts.assign_shared_storage, except on an arch with a transposing LDS read (gfx950) for a buffer read only
    as the B operand of mmas whose A is a transposed-fragment register tile (attention's V): ds_read_b64_tr_b16
    reads its k-runs from row-major storage, so it stays row-major and loads straight into LDS (no transposing
    16-bit stores)."""
    storage = assign_shared_storage(program)
    if not archs.has(arch, "lds_transpose_read"):
        return storage
    producers = {r: o for o in program.body.walk() for r in o.results}
    tr_ok: dict[Value, bool] = {}
    for op in program.body.walk():
        if op.opcode != "mma":
            continue
        for j, v in enumerate(op.operands[:2]):
            b = buffer_of(v, producers)
            if b is None or b not in storage:
                continue
            tr = (j == 1 and op.operands[0].type.space == "rt" and isinstance(regs.get(op.result), TFragment)
                  and op.operands[1].type.rows % 16 == 0)
            tr_ok[b] = tr_ok.get(b, True) and tr
    stages = {op.result: op.operands[0] for op in program.body.walk() if op.opcode == "shared_stage"}
    return {v: lay for v, lay in storage.items() if not tr_ok.get(stages.get(v, v), False)}


# ------------------------------------------------------------------------------- operands in registers
def buffer_of(v: Value, producers: dict) -> Value | None:
    """The shared buffer a value is (an alloc_shared result) or is a stage of; None for any other value."""
    p = producers.get(v)
    if p is None:
        return None
    return v if p.opcode == "alloc_shared" else p.operands[0] if p.opcode == "shared_stage" else None


def preloads(program: Program, lay: dict) -> dict[Value, Op]:
    """{shared buffer: the first pipeline that reads it} for the buffers whose fragments are read into
    registers once: one stage, written only by loads at the top level before that pipeline, read only as the
    A operand (not transposed) of transposed-fragment mmas in the compute steps of top-level pipelines. The
    library's `hk::preload` reads this wave's row blocks as MFMA fragments; every such mma takes them."""
    top = program.body.ops
    producers = {r: o for o in program.body.walk() for r in o.results}
    writes: dict[Value, list[int]] = {}
    reads: dict[Value, list[int]] = {}
    bad: set[Value] = set()
    for i, t in enumerate(top):
        compute = set(t.regions[1].walk()) if t.opcode == "pipeline" else set()
        for o in [t, *(x for r in t.regions for x in r.walk())]:
            for j, v in enumerate(o.operands):
                b = buffer_of(v, producers)
                if b is None or (o.opcode == "shared_stage" and j == 0):
                    continue
                if o.opcode == "global_to_shared" and j == 0 and o is t:
                    writes.setdefault(b, []).append(i)
                elif (o.opcode == "mma" and j == 0 and o in compute and not o.attrs["trans_a"]
                      and isinstance(lay.get(o.result), TFragment) and b.type.stages == 1):
                    reads.setdefault(b, []).append(i)
                else:
                    bad.add(b)
    return {b: top[min(r)] for b, r in reads.items()
            if b not in bad and all(w < min(r) for w in writes.get(b, []))}


def arena(program: Program, pre: dict[Value, Op], align: int = resources.SMEM_ALIGN) -> tuple[dict[Value, int], int]:
    """({shared buffer: offset}, arena bytes). Program order, each buffer at an `align`-aligned offset, as
    resources.arena_layout; except that a preloaded buffer (`pre`: preloads) is dead once its fragments are in
    registers, so buffers first touched at or after that point may take its bytes (the emitter puts a barrier
    between the preload and the pipeline)."""
    bufs = [op.result for op in program.shared_buffers()]
    if not pre:
        offsets, total = resources.arena_layout((b.type for b in bufs), align)
        return dict(zip(bufs, offsets)), total
    top = program.body.ops
    producers = {r: o for o in program.body.walk() for r in o.results}
    first: dict[Value, int] = {}
    for i, t in enumerate(top):
        for o in [t, *(x for r in t.regions for x in r.walk())]:
            if o.opcode in opcodes.SHARED_VIEW_OPS:
                continue
            for v in o.operands:
                b = buffer_of(v, producers)
                if b is not None:
                    first.setdefault(b, i)
    dead = {b: top.index(p) for b, p in pre.items()}
    placed: list[tuple[Value, int, int]] = []          # (buffer, start, end)
    out: dict[Value, int] = {}
    for b in bufs:
        size = b.type.nbytes
        def clash(o: Value) -> bool:                   # may b and o not share bytes?
            return not (o in dead and first.get(b, len(top)) >= dead[o]) and \
                   not (b in dead and first.get(o, len(top)) >= dead[b])
        off = 0
        for o, lo, hi in sorted(placed, key=lambda x: x[1]):
            if clash(o) and off < hi and lo < off + size:
                off = resources.round_up(hi, align)
        out[b] = off
        placed.append((b, off, off + size))
    return out, max((hi for _, _, hi in placed), default=0)


def _op_scratch(op: Op, waves: int, lay: dict | None = None) -> int:
    """Scratch bytes one op needs, as hk_hip.h computes them (each use static_asserts it fits)."""
    layout = (lay or {}).get(op.operands[0]) if op.opcode == "reduce" else None
    if isinstance(layout, Strip):
        return strip_reduce_scratch(op, layout, waves)
    if op.opcode == "reduce" and op.attrs["axis"] == "col":
        rows, cols = op.operands[0].type.shape
        return waves * _blocks(cols) * 16 * 4 if _blocks(rows) > 1 else 0
    if op.opcode == "mma":
        return mma_scratch_bytes(op.operands[0].type, op.operands[1].type, op.attrs["trans_a"], SCRATCH_ALIGN)
    return 0


def scratch_bytes(program: Program, waves: int, lay: dict) -> int:
    return resources.scratch_bytes(program.body.walk(), lambda op: _op_scratch(op, waves, lay), SCRATCH_ALIGN)


# ---------------------------------------------------------------------------------------- schedule
def _talks_across_waves(region: Region, waves: int, lay: dict | None = None) -> str | None:
    """Why a pipeline's compute step needs other waves (barriers inside), or None if it is wave-local."""
    for op in region.walk():
        if opcodes.writes_shared(op.opcode):
            return f"it writes shared memory ('{op.opcode}')"
        if op.opcode == "pipeline":
            return "it contains a pipeline"
        if _op_scratch(op, waves, lay):
            what = "a column reduction" if op.opcode == "reduce" else "an mma with a register operand"
            return f"{what} exchanges data between waves"
    return None


def pipeline_schedule(op: Op, waves: int, requested: str, lay: dict | None = None) -> tuple[str, str]:
    """(schedule, why) for one pipeline op."""
    stages = op.attrs["stages"]
    blocker = None
    if waves != 8:
        blocker = f"ping-pong runs 8 waves, this kernel runs {waves}"
    elif stages < 3:
        blocker = f"ping-pong needs stages >= 3 (a stage in flight per wave group), got {stages}"
    else:
        why = _talks_across_waves(op.regions[1], waves, lay)
        if why:
            blocker = f"the compute step is not wave-local: {why}"
    if requested == "pingpong" and blocker:
        raise UnsupportedError(f"schedule 'pingpong' cannot run this pipeline: {blocker}")
    if requested == "double_buffer" or blocker:
        return "double_buffer", blocker or "requested"
    return "pingpong", "8 waves, >= 3 stages, wave-local compute"


def split_prefetch(pipe: Op, cursors: dict[Op, tuple]) -> tuple[bool, str]:
    """(split, why): whether a pipeline's step loads run in two phases around its compute step (hk_hip
    pipelines.h, `hk::split`): issue -- the global reads of tile i+AHEAD into registers (gfx942's
    register staging) or as LDS-DMA loads (gfx950) -- before compute(i), and commit -- the staged registers
    written to LDS; the LDS-DMA loads waited for by count -- after it. Every op of the load region must then
    be one of its `cursors` (patterns.cursor_loads: a cursor keeps its staged registers between the phases)
    or free of effects but global reads (the region runs once per phase)."""
    stages = pipe.attrs["stages"]
    if stages < 2:
        return False, "one stage: a step's tile must land before its compute step reads the only stage"
    if not cursors:
        return False, "no load walks one tensor index by the step (no load cursor)"
    for o in pipe.regions[0].walk():
        if o in cursors:
            continue
        fx = opcodes.TABLE[o.opcode].effects if o.opcode in opcodes.TABLE else None
        if fx is None or fx.of_regions or fx.writes or "shared" in fx.reads:
            return False, f"the load step also runs '{o.opcode}', which is not a cursor load"
    return True, (f"{len(cursors)} cursor load(s): reads issued before the compute step, LDS writes and "
                  "waits by count after it")


# --------------------------------------------------------------------------------------------- fp8
def _e4m3_pair(mma: Op) -> bool:
    return all(v.type.dtype.name == "fp8e4m3" for v in mma.operands[:2])


def fnuz_storage(program: Program, arch: str) -> dict[Value, str]:
    """The shared buffers (and their stage views) stored as FNUZ codes on an arch whose e4m3 MFMA reads FNUZ
    (gfx942): e4m3 buffers whose only uses are copies in from global memory and operands of e4m3 x e4m3 mma.
    Each code is mapped once, between the global load and the LDS write (hk_hip: st<..., fnuz<L>>), instead
    of in every fragment every wave reads. {value: why}."""
    if not archs.has(arch, "fnuz_e4m3"):
        return {}
    stages, uses = shared_buffer_uses(program)
    ok: dict[Value, bool] = {}
    for op, i, buf in uses:
        fine = buf.type.dtype.name == "fp8e4m3" and (
            (op.opcode == "global_to_shared" and i == 0) or (op.opcode == "mma" and i < 2 and _e4m3_pair(op)))
        ok[buf] = ok.get(buf, True) and fine
    return with_stages(ok, stages, "e4m3 tile read only by e4m3 x e4m3 mma: FNUZ codes mapped once on the way into LDS")


def quartered_carries(pipe: Op, arch: str) -> dict[int, Op]:
    """The carries of a pipeline kept in the quartered accumulator domain of gfx942's e4m3 MFMA
    (instructions.h: the hardware sums (a/2)(b/2) = ab/4): a carry that only feeds one top-level e4m3 x e4m3
    mma of the compute step, whose result is only yielded back into the carry. Scaled by 1/4 once before
    the loop and by 4 once after it (powers of two: exact but for f32 subnormals, as the per-mma scaling
    was), not around every mma. {carry index: the mma}."""
    if not archs.has(arch, "fnuz_e4m3"):
        return {}
    creg = pipe.regions[1]
    carries, yields = creg.args[2:], list(creg.yields)
    uses: dict[Value, int] = {}
    for o in creg.walk():
        for v in o.operands:
            uses[v] = uses.get(v, 0) + 1
    for y in yields:
        uses[y] = uses.get(y, 0) + 1
    out = {}
    for k, (arg, y) in enumerate(zip(carries, yields)):
        m = next((o for o in creg.ops if o.opcode == "mma" and y in o.results), None)
        if (m is not None and m.operands[2] is arg and _e4m3_pair(m) and uses.get(arg) == 1
                and uses.get(y) == 1):
            out[k] = m
    return out


# -------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Lowering:
    """What make_plan found in the program, op by op, for the emitter to read: each analysis runs once, here.
    Not recorded in the Artifact (it holds the program's ops and values)."""
    layouts: dict                           # register values, then shared buffers and their stages (layouts())
    storage: dict                           # the shared part: buffers stored other than row-major
    offsets: dict[Value, int]               # each shared buffer's offset in the arena (arena)
    preloads: dict[Value, Op]               # buffer -> the pipeline its fragments are read into registers before
    preloaded_a: dict[Op, Value]            # mma -> the preloaded buffer it takes as its A operand
    pipelines: dict[Op, int]                # pipeline op -> its entry in Plan.schedules
    cursors: dict[Op, dict]                 # pipeline op -> its patterns.cursor_loads
    fnuz: dict[Value, str]                  # shared buffers and stage views stored as FNUZ codes (fnuz_storage)
    quartered: dict[Op, dict[int, Op]]      # pipeline op -> its quartered_carries, where it has any
    fused_loads: dict[Op, tuple[Op, int]]   # binary op -> the load folded into it, and its side
    lazy: dict[Op, tuple[Value, Value]]     # lazy rescale (mul op) -> (tile, row vector), done inside its mma
    scaled: dict[Op, tuple]                 # patterns.folded_scales
    interleavable: dict[Op, dict]           # patterns.interleaved_pv, whether or not the plan interleaves each
    nan_rows: dict[Op, tuple[Op, Value]]    # patterns.nan_row_casts (software bf16 archs): cast -> (mma, row sums)
    epilogues: dict[Op, list[Op]]           # patterns.fused_epilogues: store -> the ops computed inside it

    @cached_property
    def epilogue_ops(self) -> frozenset[Op]:
        return frozenset(o for run in self.epilogues.values() for o in run)

    @cached_property
    def quartered_mmas(self) -> frozenset[Op]:
        return frozenset(m for q in self.quartered.values() for m in q.values())

    @cached_property
    def folded_loads(self) -> frozenset[Op]:
        return frozenset(ld for ld, _ in self.fused_loads.values())

    @cached_property
    def nan_row_mmas(self) -> dict[Op, Value]:
        """The mmas whose rows with a NaN in A are restored after them (hk::nan_rows), with their row sums."""
        return {m: sums for m, sums in self.nan_rows.values()}

    @cached_property
    def lazy_rows(self) -> frozenset[Value]:
        """The row vectors of lazy rescales made into transposed fragments: by exp2, which is 1 exactly where its
        argument is 0 (hk::exp2_lazy)."""
        return frozenset(v for _, v in self.lazy.values() if isinstance(self.layouts.get(v), TFragment))


@dataclass(frozen=True)
class PipelineSchedule:
    """One pipeline's schedule: each decision with its reason. The values are checked at construction, so a
    schedule that cannot run (an unknown form, an interleave reason without an interleavable mma) cannot be
    written; `noted` and `revised` give changed copies (the backend's build search)."""
    pipeline: int | None                    # the pipeline op's result id
    stages: int
    schedule: str                           # PIPELINE_FORMS: "double_buffer" | "pingpong"
    why: str
    prefetch: str                           # "split" (issue before compute, commit after) | "whole"
    prefetch_why: str
    interleave: str | None = None           # "mfma_exp" | "none"; None: no interleavable mma in this pipeline
    interleave_why: str | None = None

    def __post_init__(self):
        if self.schedule not in PIPELINE_FORMS or self.prefetch not in ("split", "whole"):
            raise ValueError(f"pipeline schedule {self.schedule!r} / prefetch {self.prefetch!r}: expected one of "
                             f"{PIPELINE_FORMS} / split, whole")
        if self.interleave not in (None, "mfma_exp", "none") or (self.interleave is None) != (
                self.interleave_why is None):
            raise ValueError(f"interleave {self.interleave!r} needs a reason, and only then ('mfma_exp' or 'none')")

    def noted(self, key: str, text: str) -> "PipelineSchedule":
        """This schedule with `text` appended to the reason of decision `key` ("prefetch", "interleave")."""
        return replace(self, **{f"{key}_why": getattr(self, f"{key}_why") + text})

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.name.startswith("interleave") and self.interleave is None)}



@dataclass(frozen=True)
class Plan:
    """What the backend chose for one program on one target: the records below (to_json, in the Artifact) and
    the `lowering` the emitter renders them by."""
    arch: str
    waves: int
    threads: int
    scratch_bytes: int
    arena_bytes: int
    lds_bytes: int
    schedules: tuple[PipelineSchedule, ...] = ()          # one per pipeline op, in program order
    block_remap: bool = True
    # gfx942 fp8: {"fnuz_shared": [{"buffer": id, "tile": type, "why": ...}],
    #              "quartered": [{"pipeline": id, "carry": k, "why": ...}]}
    fp8: dict = field(default_factory=dict)
    registers: list[dict] = field(default_factory=list)   # shared operands held in registers (preloads)
    tfrag: list[dict] = field(default_factory=list)       # mmas into transposed-fragment accumulators
    fused: list[dict] = field(default_factory=list)       # ops lowered inside another (masks, lazy rescales)
    lowering: Lowering | None = field(default=None, compare=False, repr=False)

    @property
    def wave_size(self) -> int:
        """Lanes per wave: make_plan sized the block by the arch row's (Target.lanes)."""
        return self.threads // self.waves

    def to_json(self) -> dict:
        """The records, for the Artifact: the lowering holds the program's ops and stays out."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "lowering"}
        out["schedules"] = [s.to_json() for s in self.schedules]
        return out

    def schedule_of(self, pipe: Op) -> PipelineSchedule:
        """The `schedules` entry of one pipeline op of the planned program."""
        return self.schedules[self.lowering.pipelines[pipe]]

    def interleaved(self) -> dict[Op, dict]:
        """The interleavable mmas of the pipelines whose schedule interleaves them (patterns.interleaved_pv)."""
        return {m: d for m, d in self.lowering.interleavable.items()
                if self.schedule_of(d["pipeline"]).interleave == "mfma_exp"}


def make_plan(program: Program, target: Target, options: HipOptions | dict | None = None) -> Plan:
    """Every decision for one program on one target, each analysis run once (UnsupportedError for options the
    program cannot take)."""
    options = HipOptions.coerce(options)
    waves = options.waves if options.waves is not None else int(program.num_warps)
    if not 1 <= waves <= MAX_WAVES:
        raise UnsupportedError(f"{program.name}: {waves} waves per block; a block runs 1 to {MAX_WAVES} waves "
                               f"of {target.lanes} lanes on {target.arch}")
    regs = register_layouts(program, waves, target.lanes)
    storage = shared_storage(program, regs, target.arch)
    lay = {**regs, **storage}
    pre = preloads(program, lay)
    offsets, arena_total = arena(program, pre)
    low = _lowering(program, target.arch, lay, storage, pre, offsets)
    scratch = scratch_bytes(program, waves, lay)
    # an upper bound: the compiler drops an arena (or scratch) no code reaches
    lds = resources.shared_bytes(arena_total, scratch)
    scheds = tuple(_schedule(p, waves, options, low) for p in low.pipelines)
    return Plan(target.arch, waves, waves * target.lanes, scratch, arena_total, lds, scheds, options.block_remap,
                _fp8_record(low), _registers_record(program, low, arena_total),
                _tfrag_record(program, target.arch, low), _fused_record(program, low), low)


def _lowering(program: Program, arch: str, lay: dict, storage: dict, pre: dict[Value, Op],
              offsets: dict[Value, int]) -> Lowering:
    ops = list(program.body.walk())
    pipes = [op for op in ops if op.opcode == "pipeline"]
    producers = {r: o for o in ops for r in o.results}
    lazy = lazy_rescales(program, lay)
    quartered = {p: q for p in pipes if (q := quartered_carries(p, arch))}
    epilogues = fused_epilogues(program, lay)
    in_epilogue = {o for run in epilogues.values() for o in run}
    return Lowering(
        layouts=lay, storage=storage, offsets=offsets, preloads=pre,
        preloaded_a={m: b for m in ops if m.opcode == "mma" and (b := buffer_of(m.operands[0], producers)) in pre},
        pipelines={p: k for k, p in enumerate(pipes)}, cursors={p: cursor_loads(p) for p in pipes},
        fnuz=fnuz_storage(program, arch), quartered=quartered,
        fused_loads={b: f for b, f in fused_grid_loads(program, lay).items() if b not in in_epilogue}, lazy=lazy,
        scaled=folded_scales(program, lay),
        interleavable=interleaved_pv(program, lay, lazy),
        nan_rows={} if archs.has(arch, "bf16_convert") else nan_row_casts(program, lay), epilogues=epilogues)


def _schedule(pipe: Op, waves: int, options: HipOptions, low: Lowering) -> PipelineSchedule:
    """The `schedules` entry of one pipeline: its schedule, whether its loads split, whether its PV interleaves."""
    s, why = pipeline_schedule(pipe, waves, options.schedule, low.layouts)
    split, split_why = split_prefetch(pipe, low.cursors[pipe])
    if options.prefetch == "split" and not split:
        raise UnsupportedError(f"prefetch 'split' cannot run this pipeline: {split_why}")
    if options.prefetch == "whole" and split:
        split, split_why = False, "requested"
    entry = PipelineSchedule(pipe.results[0].id if pipe.results else None, pipe.attrs["stages"], s, why,
                             "split" if split else "whole", split_why)
    il = [d for d in low.interleavable.values() if d["pipeline"] is pipe]
    if not il:
        return entry
    on = options.interleave != "off"
    return replace(entry, interleave="mfma_exp" if on else "none", interleave_why=(
        "requested" if not on else
        f"{len(il)} mma with its A (P) in registers: P's exp2, conversion (branch-free) and row sum "
        "issued between the MFMAs by LLVM's MFMA/exp interleave (iglp_opt(2))"
        + ("; the lazy rescale's branch hoisted before them" if any(d["order"] for d in il) else "")))


# ------------------------------------------------------------------------------------------ records
def _fp8_record(low: Lowering) -> dict:
    fnuz = [{"buffer": v.id, "tile": str(v.type), "why": why}
            for v, why in low.fnuz.items() if isinstance(v.type, SharedBufType)]
    quart = [{"pipeline": p.results[0].id if p.results else None, "carry": k,
              "why": "e4m3 x e4m3 accumulator chain: scaled by 1/4 before the loop and by 4 after it"}
             for p, q in low.quartered.items() for k in q]
    return {k: v for k, v in (("fnuz_shared", fnuz), ("quartered", quart)) if v}


def _registers_record(program: Program, low: Lowering, arena_total: int) -> list[dict]:
    plain = resources.arena_bytes(program)
    return [{"buffer": b.id, "type": str(b.type), "before_pipeline": p.results[0].id if p.results else None,
             "why": "read only as the A operand of transposed-fragment mmas: fragments in registers, LDS reused"
                    + (f" (arena {arena_total} B instead of {plain} B)" if arena_total < plain else "")}
            for b, p in low.preloads.items()]


def _tfrag_record(program: Program, arch: str, low: Lowering) -> list[dict]:
    lay = low.layouts
    return [{"mma": op.result.id,
             "A": "registers, read in place" if op.operands[0].type.space == "rt" else
                  "preloaded registers" if op in low.preloaded_a else "LDS",
             "B": "ds_read_b64_tr_b16 (row-major)" if op.operands[0].type.space == "rt"
                  and archs.has(arch, "lds_transpose_read") and not lay.get(op.operands[1])
                  else "k-contiguous reads",
             "why": "transposed-fragment accumulator: operands swapped, the tile's rows lie along the lanes"}
            for op in program.body.walk() if op.opcode == "mma" and isinstance(lay.get(op.result), TFragment)]


def _fused_record(program: Program, low: Lowering) -> list[dict]:
    fused = [{"op": m.result.id, "opcode": m.opcode, "in": w.result.id,
              "why": "mask evaluated where the select writes (no mask tile)"}
             for m, w in fused_masks(program, low.layouts).items()]
    fused += [{"op": op.result.id, "opcode": "binary mul", "in": next(u.result.id for u in program.body.walk()
                                                                      if op.result in u.operands),
               "why": "lazy rescale: skipped when every factor the wave holds is 1"}
              for op in low.lazy]
    fused += [{"op": op.result.id, "opcode": "binary mul", "in": f"{f[0].result.id}, {f[1].result.id}",
               "why": "scale folded: row max of the unscaled tile times the scale, exp2's argument one fma"
                      + ("" if f[0].operands[0] is op.result else "; the -inf select takes the unscaled tile")}
              for op, f in low.scaled.items() if op.opcode == "binary" and op.attrs["op"] == "mul"]
    fused += [{"op": op.result.id, "opcode": "cast", "in": m.result.id,
               "why": f"bf16 rounding without the NaN arm: the rows of the product whose sum {sums.id} is NaN "
                      "made NaN after it"}
              for op, (m, sums) in low.nan_rows.items()]
    fused += [{"op": st.operands[1].id, "opcode": "store epilogue", "in": ", ".join(str(o.result.id) for o in run),
               "why": "elementwise epilogue computed element by element as the store writes (no whole tile of "
                      "intermediate or converted values beside the accumulator)"}
              for st, run in low.epilogues.items()]
    return fused


# ------------------------------------------------------------------------------------------ revisits
def uninterleaved(plan: Plan, why: str) -> Plan:
    """The plan with no interleaved mma (the backend's fallback when interleaving costs registers or makes the
    loop VALU-bound: backend.py, HipBackend.compile)."""
    return _revised(plan, "interleave", "mfma_exp", "none", why)


def unsplit(plan: Plan, why: str) -> Plan:
    """The plan with every pipeline's loads whole (the backend's fallback when splitting them costs
    registers: backend.py, HipBackend.compile)."""
    return _revised(plan, "prefetch", "split", "whole", why)


def _revised(plan: Plan, key: str, was: str, now: str, why: str) -> Plan:
    """The plan with `key` of every schedule that says `was` set to `now` for `why`. The lowering stays: the
    emitter reads these two decisions from the schedules."""
    return replace(plan, schedules=tuple(replace(s, **{key: now, f"{key}_why": why}) if getattr(s, key) == was
                                         else s for s in plan.schedules))


def noted(plan: Plan, key: str, was: str, text: str) -> Plan:
    """The plan with `text` appended to the reason of `key` in every schedule that says `was` (the backend's
    figures for a choice it measured and kept)."""
    return replace(plan, schedules=tuple(s.noted(key, text) if getattr(s, key) == was else s
                                         for s in plan.schedules))


# ------------------------------------------------------------------------------------------- checks
def check(program: Program, target: Target, plan: Plan) -> None:
    """UnsupportedError naming what does not fit this target."""
    if target.arch not in ARCHS:
        raise UnsupportedError(f"the hip backend does not know the LDS size of {target.arch!r}")
    limit = ARCHS[target.arch].lds_bytes
    if plan.lds_bytes > limit:
        bufs = ", ".join(f"{op.result.type} = {op.result.type.nbytes} B" for op in program.shared_buffers())
        raise UnsupportedError(
            f"{program.name}: needs {plan.lds_bytes} bytes of LDS on {target.arch} (shared buffers: "
            f"{bufs or 'none'}; library scratch {plan.scratch_bytes} B) but a block may use {limit} "
            f"({limit // 1024} KiB); use smaller tiles or fewer stages")
    for op in program.body.walk():
        for v in list(op.operands) + list(op.results):
            t = v.type
            if isinstance(t, TileType) and t.dtype.name not in target.dtypes and t.dtype.name != "bool":
                raise UnsupportedError(f"{program.name}: {t} uses {t.dtype}, which {target.arch} does not "
                                       f"support here (supported: {', '.join(target.dtypes)})")
