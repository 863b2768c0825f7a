"""Program -> header-free HIP C++: the shared C-style emitter plus this backend's prelude (the device
library inlined), the launch bound, the pipeline schedule and the checks of what the library takes.

Decisions made here, per program and target (a `Plan`, recorded in the Artifact):
  * waves per block: the kernel's `num_warps` hint (1..16), or the `waves` option (options.py);
  * the schedule of each `hk.pipeline`: plain double buffering, or the 8-wave ping-pong when the kernel
    asks for 8 waves, the pipeline has 3+ stages and its compute step never talks to other waves
    (the `schedule` option: "auto" | "double_buffer" | "pingpong" overrides);
  * scratch LDS for the library's exchanges between waves (column reductions, register mma operands
    that are not the wave's own rows), sized with the library's own formulas;
  * layouts (codegen/layouts.py, with this library's strips, wave-grid accumulators, transposed-fragment
    accumulators and column-major shared tiles) and, per pipeline load that walks one index by the step, a
    cursor that computes its addresses once before the loop (`cursor_loads`);
  * operands held in registers: a shared tile read only as the A operand of transposed-fragment mmas inside
    pipelines (attention's Q) is read into registers once, before the first of them (`preloads`), and its
    LDS is then free for the buffers those pipelines fill (`arena`);
  * per pipeline, whether its step's loads are split around the compute step (`split_prefetch`): the
    global reads of tile i+AHEAD issued before compute(i), their LDS writes (or LDS-DMA waits) after it,
    so the loads are in flight while the MFMAs run; recorded as the schedule's "prefetch";
  * gfx942's fp8 (e4m3 x e4m3 on FNUZ hardware, docs/fp8.md): shared tiles stored as FNUZ codes, mapped
    once on the way in (`fnuz_storage`), and k-loop accumulators kept in the quartered domain, rescaled
    once after the loop (`quartered_carries`); recorded in `Plan.fp8`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...codegen import library, patterns, resources
from ...codegen.cstyle import CStyleEmitter, EmittedKernel
from ...codegen.layouts import Strip, TFragment, assign_layouts, assign_shared_storage, strip_reduce_scratch
from ...codegen.resources import mma_scratch_bytes
from ...interface import dtypes as D
from ...interface.backend import Target
from ...interface import opcodes
from ...interface.errors import UnsupportedError
from ...codegen.cstyle import BINARY_FN, CTYPE
from ...codegen.layouts import ColMajor, WaveGrid, shared_buffer_uses, with_stages
from ...interface.ir import Op, Program, Region, SharedBufType, TileType, Value
from . import archs
from .archs import ARCHS, LANES
from .options import MAX_WAVES, HipOptions

HEADER = Path(__file__).with_name("include") / "hk_hip.h"
SCRATCH_ALIGN = 16          # hk_hip.h's granule for its scratch area (and an mma's A part)


LIBRARY = library.DeviceLibrary(HEADER, Path(__file__))
header_text = LIBRARY.text              # the device library inlined: the prelude of every kernel
library_hash = LIBRARY.fingerprint      # part of the compile cache key


def _blocks(n: int) -> int:
    return -(-n // 16)


# ----------------------------------------------------------------------------------------- scratch
def layouts(program: Program, waves: int, arch: str | None = None) -> dict:
    """The layout pass's choice for this backend (its library implements strips over 64 lanes, wave grids,
    transposed fragments and column-major shared tiles): register values, then shared buffers and their
    stages (`shared_storage`; `arch` None: as on gfx942)."""
    regs = assign_layouts(program, waves, strips=True, lanes=LANES, grids=True, tfrags=True)
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
            b = _buffer_of(v, producers)
            if b is None or b not in storage:
                continue
            tr = (j == 1 and op.operands[0].type.space == "rt" and isinstance(regs.get(op.result), TFragment)
                  and op.operands[1].type.rows % 16 == 0)
            tr_ok[b] = tr_ok.get(b, True) and tr
    stages = {op.result: op.operands[0] for op in program.body.walk() if op.opcode == "shared_stage"}
    return {v: lay for v, lay in storage.items() if not tr_ok.get(stages.get(v, v), False)}


# ------------------------------------------------------------------------------- operands in registers
def _buffer_of(v: Value, producers: dict) -> Value | None:
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
                b = _buffer_of(v, producers)
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


def arena(program: Program, lay: dict, align: int = resources.SMEM_ALIGN) -> tuple[dict[Value, int], int]:
    """({shared buffer: offset}, arena bytes). Program order, each buffer at an `align`-aligned offset, as
    resources.arena_layout; except that a preloaded buffer (`preloads`) is dead once its fragments are in
    registers, so buffers first touched at or after that point may take its bytes (the emitter puts a barrier
    between the preload and the pipeline)."""
    bufs = [op.result for op in program.shared_buffers()]
    pre = preloads(program, lay)
    if not pre:
        offsets, total = resources.arena_layout((b.type for b in bufs), align)
        return dict(zip(bufs, offsets)), total
    top = program.body.ops
    producers = {r: o for o in program.body.walk() for r in o.results}
    first: dict[Value, int] = {}
    for i, t in enumerate(top):
        for o in [t, *(x for r in t.regions for x in r.walk())]:
            if o.opcode in ("alloc_shared", "shared_stage"):
                continue
            for v in o.operands:
                b = _buffer_of(v, producers)
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


def scratch_bytes(program: Program, waves: int) -> int:
    lay = layouts(program, waves)
    return resources.scratch_bytes(program.body.walk(), lambda op: _op_scratch(op, waves, lay), SCRATCH_ALIGN)



# ---------------------------------------------------------------------------------------- schedule
def _talks_across_waves(region: Region, waves: int, lay: dict | None = None) -> str | None:
    """Why a pipeline's compute step needs other waves (barriers inside), or None if it is wave-local."""
    for op in region.walk():
        if op.opcode in ("global_to_shared", "register_to_shared"):
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


def split_prefetch(pipe: Op) -> tuple[bool, str]:
    """(split, why): whether a pipeline's step loads run in two phases around its compute step (hk_hip
    pipelines.h, `hk::split`): issue -- the global reads of tile i+AHEAD into registers (gfx942's
    register staging) or as LDS-DMA loads (gfx950) -- before compute(i), and commit -- the staged registers
    written to LDS; the LDS-DMA loads waited for by count -- after it. Every op of the load region must then
    be a cursor load (which keeps its staged registers between the phases) or free of effects but global
    reads (the region runs once per phase)."""
    stages = pipe.attrs["stages"]
    if stages < 2:
        return False, "one stage: a step's tile must land before its compute step reads the only stage"
    cursors = cursor_loads(pipe)
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


def uninterleaved(plan: "Plan", why: str) -> "Plan":
    """The plan with no interleaved mma (the backend's fallback when interleaving costs registers or makes the
    loop VALU-bound: backend.py, HipBackend.compile)."""
    scheds = [{**s, "interleave": "none", "interleave_why": why} if s.get("interleave") == "mfma_exp" else s
              for s in plan.schedules]
    return Plan(**{**asdict(plan), "schedules": scheds})


def unsplit(plan: "Plan", why: str) -> "Plan":
    """The plan with every pipeline's loads whole (the backend's fallback when splitting them costs
    registers: backend.py, HipBackend.compile)."""
    scheds = [{**s, "prefetch": "whole", "prefetch_why": why} if s.get("prefetch") == "split" else s
              for s in plan.schedules]
    return Plan(**{**asdict(plan), "schedules": scheds})


# --------------------------------------------------------------------------------------------- fp8
def _e4m3_pair(mma: Op) -> bool:
    return all(v.type.dtype.name == "fp8e4m3" for v in mma.operands[:2])


def fnuz_storage(program: Program, arch: str) -> dict[Value, str]:
    """The shared buffers (and their stage views) stored as FNUZ codes on an arch whose e4m3 MFMA reads FNUZ
    (gfx942): e4m3 buffers whose only uses are copies in from global memory and operands of e4m3 x e4m3 mma.
    Each code is mapped once, between the global load and the LDS write (hk_hip: st<..., fnuz<L>>), instead
    of in every fragment every wave reads. {value: why}."""
    if not ARCHS[arch].fnuz_e4m3:
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
    if not ARCHS[arch].fnuz_e4m3:
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


@dataclass
class Plan:
    """What the backend chose for one program on one target."""
    arch: str
    waves: int
    threads: int
    scratch_bytes: int
    arena_bytes: int
    lds_bytes: int
    schedules: list[dict] = field(default_factory=list)   # one per pipeline op, in program order
    block_remap: bool = True
    # gfx942 fp8: {"fnuz_shared": [{"buffer": id, "tile": type, "why": ...}],
    #              "quartered": [{"pipeline": id, "carry": k, "why": ...}]}
    fp8: dict = field(default_factory=dict)
    registers: list[dict] = field(default_factory=list)   # shared operands held in registers (preloads)
    tfrag: list[dict] = field(default_factory=list)       # mmas into transposed-fragment accumulators
    fused: list[dict] = field(default_factory=list)       # ops lowered inside another (masks, lazy rescales)

    def to_json(self) -> dict:
        return asdict(self)


def make_plan(program: Program, target: Target, options: "HipOptions | dict | None" = None) -> Plan:
    options = HipOptions.coerce(options)
    waves = options.waves if options.waves is not None else int(program.num_warps)
    if not 1 <= waves <= MAX_WAVES:
        raise UnsupportedError(f"{program.name}: {waves} waves per block; a block runs 1 to {MAX_WAVES} waves "
                               f"of {LANES} lanes on {target.arch}")
    requested = options.schedule
    scheds = []
    lay = layouts(program, waves, target.arch)
    interleaved = interleaved_pv(program, lay)
    for op in program.body.walk():
        if op.opcode == "pipeline":
            s, why = pipeline_schedule(op, waves, requested, lay)
            split, split_why = split_prefetch(op)
            if options.prefetch == "split" and not split:
                raise UnsupportedError(f"prefetch 'split' cannot run this pipeline: {split_why}")
            if options.prefetch == "whole" and split:
                split, split_why = False, "requested"
            entry = {"pipeline": op.results[0].id if op.results else None, "stages": op.attrs["stages"],
                     "schedule": s, "why": why, "prefetch": "split" if split else "whole", "prefetch_why": split_why}
            il = [m for m in interleaved if m in op.regions[1].ops]
            if il:
                on = options.interleave != "off"
                entry["interleave"] = "mfma_exp" if on else "none"
                entry["interleave_why"] = (
                    "requested" if not on else
                    f"{len(il)} mma with its A (P) in registers: P's exp2, conversion (branch-free) and row sum "
                    "issued between the MFMAs by LLVM's MFMA/exp interleave (iglp_opt(2))"
                    + ("; the lazy rescale's branch hoisted before them"
                                                           if any(interleaved[m]["order"] for m in il) else ""))
            scheds.append(entry)
    scratch = scratch_bytes(program, waves)
    _, arena_total = arena(program, lay)
    pre = preloads(program, lay)
    producers = {r: o for o in program.body.walk() for r in o.results}
    plain = resources.arena_bytes(program)
    registers = [{"buffer": b.id, "type": str(b.type), "before_pipeline": p.results[0].id if p.results else None,
                  "why": "read only as the A operand of transposed-fragment mmas: fragments in registers, LDS reused"
                         + (f" (arena {arena_total} B instead of {plain} B)" if arena_total < plain else "")}
                 for b, p in pre.items()]
    tfrag = [{"mma": op.result.id,
              "A": "registers, read in place" if op.operands[0].type.space == "rt" else
                   "preloaded registers" if _buffer_of(op.operands[0], producers) in pre else "LDS",
              "B": "ds_read_b64_tr_b16 (row-major)" if op.operands[0].type.space == "rt"
                   and archs.has(target.arch, "lds_transpose_read") and not lay.get(op.operands[1])
                   else "k-contiguous reads",
              "why": "transposed-fragment accumulator: operands swapped, the tile's rows lie along the lanes"}
             for op in program.body.walk() if op.opcode == "mma" and isinstance(lay.get(op.result), TFragment)]
    fused = [{"op": m.result.id, "opcode": m.opcode, "in": w.result.id,
              "why": "mask evaluated where the select writes (no mask tile)"} for m, w in fused_masks(program, lay).items()]
    fused += [{"op": op.result.id, "opcode": "binary mul", "in": next(u.result.id for u in program.body.walk()
                                                                      if op.result in u.operands),
               "why": "lazy rescale: skipped when every factor the wave holds is 1"}
              for op in lazy_rescales(program, lay)]
    fused += [{"op": op.result.id, "opcode": "binary mul", "in": f"{f[0].result.id}, {f[1].result.id}",
               "why": "scale folded: row max of the unscaled tile times the scale, exp2's argument one fma"}
              for op, f in folded_scales(program, lay).items() if op.opcode == "binary" and op.attrs["op"] == "mul"]
    # an upper bound: the compiler drops an arena (or scratch) no code reaches
    lds = resources.shared_bytes(arena_total, scratch)
    fp8 = {}
    if target.arch in ARCHS:
        fnuz = [{"buffer": v.id, "tile": str(v.type), "why": why}
                for v, why in fnuz_storage(program, target.arch).items() if isinstance(v.type, SharedBufType)]
        quart = [{"pipeline": op.results[0].id if op.results else None, "carry": k,
                  "why": "e4m3 x e4m3 accumulator chain: scaled by 1/4 before the loop and by 4 after it"}
                 for op in program.body.walk() if op.opcode == "pipeline"
                 for k in quartered_carries(op, target.arch)]
        fp8 = {k: v for k, v in (("fnuz_shared", fnuz), ("quartered", quart)) if v}
    return Plan(target.arch, waves, waves * LANES, scratch, arena_total, lds, scheds, options.block_remap, fp8,
                registers, tfrag, fused)


# ------------------------------------------------------------------------------------------ fused masks
def where_at_takes(lay: dict, v: Value) -> bool:
    """Whether hk::where_at evaluates masks at the positions of v's layout: it is written for transposed-fragment
    tiles (attention's edge tiles: three 256x64 masks would be 96 VGPRs a lane, or as lane masks more SGPRs than
    there are)."""
    return isinstance(lay.get(v), TFragment)


def fused_masks(program: Program, lay: dict) -> dict[Op, Op]:
    """patterns.fused_masks for selects into the layouts hk::where_at takes here."""
    return patterns.fused_masks(program, lambda v: where_at_takes(lay, v))


def lazy_rescales(program: Program, lay: dict) -> dict[Op, tuple[Value, Value]]:
    """{mul op: (tile, row vector)} for the accumulator rescales of transposed-fragment mmas: an f32 tile times a
    row vector broadcast along its rows whose only use is the accumulator of an mma into a transposed fragment
    (attention's acc * alpha[:, None]). hk::mma_rescaled runs the mma on the unscaled accumulator when every
    factor the wave holds is 1 (no row's running max moved: x * 1 == x, bit for bit), the lazy rescale."""
    uses, producers = patterns.uses_and_producers(program)
    out = {}
    for op in program.body.walk():
        if (op.opcode != "binary" or op.attrs["op"] != "mul" or op.result.type.dtype.name != "f32"
                or not isinstance(lay.get(op.result), TFragment)):
            continue
        users = uses.get(op.result, [])
        if len(users) != 1 or users[0].opcode != "mma" or users[0].operands[2] is not op.result \
                or not isinstance(lay.get(users[0].result), TFragment):
            continue
        for x, b in (op.operands, op.operands[::-1]):
            p = producers.get(b)
            if p is not None and p.opcode == "broadcast" and p.attrs["axis"] == "row" and x is not b:
                out[op] = (x, p.operands[0])
                break
    return out


def folded_scales(program: Program, lay: dict) -> dict[Op, tuple]:
    """codegen.patterns.folded_scales on transposed-fragment tiles (hk::reduce_scaled, hk::fms_rows there)."""
    return patterns.folded_scales(program, lambda v: isinstance(lay.get(v), TFragment))


# ------------------------------------------------------------------------------------ interleaved mma
def interleaved_pv(program: Program, lay: dict) -> dict[Op, dict]:
    """The mmas of pipeline compute steps whose MFMAs hk_hip interleaves with the VALU work in front of them
    (mma.h, mma_tfrag_regs<IL = true>): an mma at the top level of a compute step into a transposed-fragment
    accumulator whose A is a 16-bit transposed-fragment register tile (attention's PV product, A = P). P's
    exp2, its bf16 conversion and its row sum are then in the mma's basic block, and sched_group_barriers
    issue them under the MFMAs of the k-steps before the columns they feed (HipKittens' MFMA/exp
    interleaving). Steps that apply masks (attention's edge tiles) are left as they are. The conversion of
    P is emitted branch-free (hk::cast_select). A lazy rescale of the accumulator (lazy_rescales) is a branch; it is hoisted, with the ops
    it needs, to just after the last op those need (`order`: the compute step's ops in emission order), so
    the branch comes before the work the MFMAs are interleaved with rather than between the two.
    {mma op: {"order": [ops] or None (program order), "rescale": the lazy mul op or None}}."""
    out: dict[Op, dict] = {}
    lazy = lazy_rescales(program, lay)
    producers = {r: o for o in program.body.walk() for r in o.results}
    for pipe in program.body.walk():
        if pipe.opcode != "pipeline":
            continue
        creg = pipe.regions[1]
        if any(o.opcode in patterns.MASK_LEAVES for o in creg.walk()):
            continue                   # an edge step (masks): rare trips, and its selects cost SGPRs
        for op in creg.ops:
            if op.opcode != "mma" or op.attrs["trans_a"] or not isinstance(lay.get(op.result), TFragment):
                continue
            a = op.operands[0]
            if (a.type.space != "rt" or a.type.dtype.itemsize != 2 or not isinstance(lay.get(a), TFragment)
                    or op.operands[1].type.space == "rt"):
                continue
            mul = producers.get(op.operands[2])
            rescale = mul if mul in lazy and mul in creg.ops else None
            out[op] = {"order": _hoisted(creg, mul) if rescale is not None else None, "rescale": rescale}
    return out


def _hoisted(creg: Region, mul: Op) -> list[Op] | None:
    """The compute step's ops in an order where the lazy rescale `mul` and the ops of the step it reads
    (transitively: attention's alpha = exp2(m_old - m_new) and the new max) are emitted as soon as their
    operands exist, every other op in program order (a topological order: each op after the ops it reads).
    None when nothing moves, or when an op of the step has effects (its place then matters)."""
    ops = list(creg.ops)
    for o in ops:
        fx = opcodes.TABLE[o.opcode].effects if o.opcode in opcodes.TABLE else None
        if o.regions or fx is None or fx.writes or fx.of_regions:
            return None
    made = {r: o for o in ops for r in o.results}
    deps = {o: {made[v] for v in o.operands if v in made} for o in ops}
    sl: set[Op] = set()
    stack = [mul]
    while stack:
        o = stack.pop()
        if o not in sl:
            sl.add(o)
            stack.extend(deps[o])
    order: list[Op] = []
    done: set[Op] = set()

    def emit(o: Op) -> None:
        order.append(o)
        done.add(o)

    def flush() -> None:
        moved = True
        while moved:
            moved = False
            for o in ops:
                if o in sl and o not in done and deps[o] <= done:
                    emit(o)
                    moved = True
    for o in ops:
        flush()
        if o not in done:
            emit(o)
    return None if order == ops else order


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


# ------------------------------------------------------------------------------------------ emitter
class HipEmitter(CStyleEmitter):
    lanes = LANES
    strip_layouts = True
    grid_layouts = True
    col_major_shared = True
    tfrag_layouts = True

    def shared_storage(self, program: Program) -> dict:
        return shared_storage(program, self.layouts, self.plan.arch)

    def __init__(self, plan: Plan, program: Program):
        self.plan = plan
        self._cursors: dict[int, tuple[str, Value]] = {}    # load op id -> (cursor name, step value)
        self._split = False                                 # the pipeline being emitted splits its loads
        pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
        self._schedule = {id(op): s["schedule"] for op, s in zip(pipes, plan.schedules)}
        self._prefetch = {id(op): s.get("prefetch") == "split" for op, s in zip(pipes, plan.schedules)}
        # gfx942 fp8 (Plan.fp8): tiles stored as FNUZ, accumulator chains kept quartered
        self._fnuz = set(fnuz_storage(program, plan.arch)) if plan.fp8.get("fnuz_shared") else set()
        self._quartered = ({id(op): quartered_carries(op, plan.arch) for op in pipes}
                           if plan.fp8.get("quartered") else {})
        self._quartered_mmas = {id(m) for q in self._quartered.values() for m in q.values()}
        self._fused_loads = fused_grid_loads(program)      # binary op id -> (load op, loaded side)
        self._skipped = {id(ld) for ld, _ in self._fused_loads.values()}
        lay = layouts(program, plan.waves, plan.arch)
        self._offsets = arena(program, lay)[0]
        self._preloads = preloads(program, lay)               # buffer -> the pipeline it is preloaded before
        self._lay = lay                                      # fuses_masks: the where_at layouts
        self._lazy = lazy_rescales(program, lay)              # rescale op -> (tile, row vector), in its mma
        self._scaled = folded_scales(program, lay)            # scale folded into the max and the exp2 argument
        # the row vectors of lazy rescales, made by exp2: 1 exactly where its argument is 0 (hk::exp2_lazy)
        self._lazy_rows = {v for _, v in self._lazy.values()
                           if isinstance(lay.get(v), TFragment)}
        # interleaved_pv, where the plan turned it on for the mma's pipeline: mma -> {"order", "rescale"}
        on = {id(p) for p, s in zip(pipes, plan.schedules) if s.get("interleave") == "mfma_exp"}
        self._interleaved = {m: d for m, d in interleaved_pv(program, lay).items()
                             if any(id(p) in on and m in p.regions[1].ops for p in pipes)}
        self._orders = {id(next(r for p in pipes for r in [p.regions[1]] if m in r.ops)): d["order"]
                        for m, d in self._interleaved.items() if d["order"]}
        self._split_rescales = {d["rescale"] for d in self._interleaved.values() if d["rescale"] is not None}
        self._select_casts = {m.operands[0] for m in self._interleaved}

    def fuses_masks(self, v: Value) -> bool:
        return where_at_takes(self._lay, v)

    def op_unary(self, op: Op) -> None:
        if op.opcode == "unary" and op.attrs["op"] == "exp2" and op.result in self._lazy_rows:
            self._result(op, f"hk::exp2_lazy({{dst}}, {self.name(op.operands[0])});")   # lazy_rescales
            return
        super().op_unary(op)

    def op_compare(self, op: Op) -> None:
        if op not in self._lazy:
            super().op_compare(op)

    def op_reduce(self, op: Op) -> None:
        if op not in self._scaled:
            return super().op_reduce(op)
        x, c = self._scaled[op]
        self._result(op, f"hk::reduce_scaled({{dst}}, {self.name(x)}, {self.name(c)});")

    def arena(self, program: Program, buffers: list[Value]) -> tuple[list[int], int]:
        offsets, total = arena(program, layouts(program, self.plan.waves), self.smem_align)
        return [offsets[b] for b in buffers], total

    def num_threads(self, program: Program) -> int:
        return self.plan.threads

    def kernel_qualifiers(self, num_threads: int) -> str:
        # clang ignores launch_bounds for AMD; this attribute is what bounds registers and is checked
        return f"extern \"C\" __global__ __attribute__((amdgpu_flat_work_group_size(1, {num_threads})))"

    def smem_arena(self, shared_bytes: int) -> str:
        return f"HK_SMEM_ARENA(hk_smem, {max(shared_bytes, 16)});"

    # ---- pipeline load cursors (hk_hip/global_shared.h: make_cursor / load(dst, cursor, i, ...))
    def op_pipeline(self, op: Op) -> None:
        for b, p in self._preloads.items():
            if p is op:          # fragments in registers; the barrier frees the buffer's LDS for this pipeline
                self.line(f"const auto hk_pre{b.id} = hk::preload({self.name(b)}.stage(0));")
                self.line("hk::sync();")
        self._cursors = {}
        self._split = self._prefetch.get(id(op), False)
        self._split_tiles: list[str] = []
        for k, (g2s, (dim, ix0, step)) in enumerate(cursor_loads(op).items()):
            st, gl = g2s.operands[:2]
            name = f"hk_cur{self.pipeline_uid(op)}_{k}"
            start = ", ".join("0" if v is None else str(v) if isinstance(v, int) else self.name(v) for v in ix0)
            tile = self.ctype(st.type, st)
            fill = self.literal(g2s.attrs["fill"], D.f32)     # a zero fill lets the range check pad ragged rows
            # not const: a split pipeline's cursor holds the staged registers between issue and commit
            self.line(f"auto {name} = hk::make_cursor<{tile}, {dim}>({self.name(gl)}, {fill}, {start});")
            self._cursors[id(g2s)] = (name, step)
            self._split_tiles.append(tile)
        try:
            self._pipeline_body(op)
        finally:
            self._cursors = {}
            self._split = False

    def ctype(self, t, v: Value | None = None) -> str:
        if v is None or v not in self._fnuz:
            return super().ctype(t, v)
        base = self.layouts.get(v)
        tag = f"hk::fnuz<{base.template_arg() if isinstance(base, ColMajor) else 'hk::rowmajor'}>"
        dt, (r, c) = CTYPE[t.dtype.name], t.shape
        if isinstance(t, SharedBufType):
            return f"hk::sbuf<{dt}, {r}, {c}, {t.stages}, {tag}>"
        return f"hk::st<{dt}, {r}, {c}, {tag}>"

    def op_global_to_register(self, op: Op) -> None:
        if id(op) in self._skipped and isinstance(self.layouts.get(op.result), WaveGrid):
            return                               # loaded inside its one elementwise use (op_binary)
        super().op_global_to_register(op)

    def region(self, reg: Region, in_pipeline_load: bool = False) -> None:
        order = self._orders.get(id(reg))          # interleaved_pv: the lazy rescale hoisted
        self.emit_ops(order if order is not None else reg.ops, in_pipeline_load)

    def op_cast(self, op: Op) -> None:
        if op.result in self._select_casts:      # interleaved_pv: P's conversion in the MFMAs' basic block
            self._result(op, f"hk::cast_select({{dst}}, {self.name(op.operands[0])});")
            return
        super().op_cast(op)

    def op_binary(self, op: Op) -> None:
        if op in self._split_rescales:           # interleaved_pv: the lazy rescale apart from its mma
            x, v = self._lazy[op]
            self._result(op, f"hk::rescale_lazy({{dst}}, {self.name(x)}, {self.name(v)});")
            return
        if op in self.fused or op in self._lazy:
            return                               # evaluated inside its where / its mma (fused_masks, lazy_rescales)
        if op in self._scaled:                   # folded_scales: the mul is skipped, the sub is one fma
            if op.attrs["op"] == "sub":
                x, c, v = self._scaled[op]
                self._result(op, f"hk::fms_rows({{dst}}, {self.name(x)}, {self.name(c)}, {self.name(v)});")
            return
        fused = self._fused_loads.get(id(op))
        if fused is None or not isinstance(self.layouts.get(fused[0].result), WaveGrid):
            return super().op_binary(op)
        ld, side = fused
        gl, *idx = ld.operands
        x = op.operands[1 - side]
        fill = self.literal(ld.attrs["fill"], D.f32)
        self._result(op, f"hk::load_binary<{BINARY_FN[op.attrs['op']]}, {'true' if side == 0 else 'false'}>"
                         f"({{dst}}, {self.name(x)}, {self.name(gl)}, {fill}, {self.args(idx)});")

    def op_mma(self, op: Op) -> None:
        a, bb, c = op.operands
        buf = _buffer_of(a, self.producers)
        a_name = f"hk_pre{buf.id}" if buf is not None and buf in self._preloads else self.name(a)
        quartered = id(op) in self._quartered_mmas          # gfx942 fp8: the carry stays in the quartered domain
        if op in self._interleaved:                          # interleaved_pv: rescaled (if lazy) by op_binary
            self._result(op, f"hk::mma<{self.mma_template_args(op)}, true>({{dst}}, {a_name}, {self.name(bb)}, "
                             f"{self.name(c)});")
            return
        scale = None if quartered else self._lazy.get(self.producer_of(c))
        if scale is not None:             # acc * rows[:, None] feeds only this mma: the rescale is skippable
            x, v = scale
            self._result(op, f"hk::mma_rescaled<{self.mma_template_args(op)}>({{dst}}, {a_name}, {self.name(bb)}, "
                             f"{self.name(x)}, {self.name(v)});")
        else:
            args = self.mma_template_args(op) + (", true" if quartered else "")
            self._result(op, f"hk::mma<{args}>({{dst}}, {a_name}, {self.name(bb)}, {self.name(c)});")

    def _pipeline_body(self, op: Op) -> None:
        """cstyle's op_pipeline, with the quartered carries entering their domain before the loop and
        leaving it after."""
        n, *inits = op.operands
        lreg, creg = op.regions
        carry = self._carry_vars(op, inits)
        quartered = self._quartered.get(id(op), {})
        pair = {k: ", ".join(CTYPE[v.type.dtype.name] for v in m.operands[:2]) for k, m in quartered.items()}
        for k in quartered:
            self.line(f"hk::acc_enter<{pair[k]}>({carry[k]});")
        uid = self.pipeline_uid(op)
        self.load_lambda(f"hk_load{uid}", lreg)
        self.compute_lambda(f"hk_compute{uid}", creg, carry)
        self.line(f"hk::pipeline<{self.pipeline_template_args(op)}>({self.name(n)}, hk_load{uid}, hk_compute{uid});")
        for k in quartered:
            self.line(f"hk::acc_leave<{pair[k]}>({carry[k]});")

    def load_lambda(self, name: str, lreg: Region, extra_params: str = "") -> None:
        super().load_lambda(name, lreg, extra_params + (", auto hk_phase" if self._split else ""))

    def op_global_to_shared(self, op: Op) -> None:
        if id(op) not in self._cursors:
            return super().op_global_to_shared(op)
        name, step = self._cursors[id(op)]
        st, gl, *idx = op.operands
        fill = self.literal(op.attrs["fill"], D.f32)
        phase = "hk_phase" if self._split else "hk::phase::all{}"
        self.line(f"hk::load_step({phase}, {self.name(st)}, {name}, {self.name(step)}, {self.name(gl)}, {fill}, "
                  f"{self.args(idx)});")

    def pipeline_template_args(self, op: Op) -> str:
        sched = self._schedule[id(op)]
        loads = f"hk::split<{', '.join(self._split_tiles)}>" if self._split else "hk::whole"
        return f"{op.attrs['stages']}, hk::sched::{sched}, {loads}"

    def prelude(self, program: Program, num_threads: int, shared_bytes: int) -> str:
        p = self.plan
        lines = [
            f"// generated by hk_portable's hip backend: kernel {program.symbol} for {p.arch}, {p.waves} waves "
            f"of 64, LDS {p.lds_bytes} B",
            f"#define HK_NUM_WARPS {p.waves}",
            f"#define HK_NUM_THREADS {num_threads}",
            f"#define HK_SCRATCH_BYTES {max(p.scratch_bytes, 16)}",
            f"#define HK_BLOCK_REMAP {1 if p.block_remap else 0}",
            "#define HK_SMEM_ARENA(name, bytes) __shared__ __attribute__((aligned(128))) unsigned char name[bytes]",
            header_text(),
        ]
        return "\n".join(lines)


def cursor_loads(pipe: Op) -> dict[Op, tuple[int, list, Value]]:
    """The loads of a pipeline's load region that walk one tensor index by the step, which hk_hip's
    cursors run with their address math hoisted out of the loop: global_to_shared ops at the region's top
    level into tiles of whole 16-byte chunks, whose indices are all loop-invariant but one, which is the
    step or an invariant plus the step. {op: (the tensor dim walked, the start indices (None: 0 for the
    walked one; an int: a constant), the step value)}."""
    lreg = pipe.regions[0]
    step = lreg.args[0]
    inner = {r for o in lreg.walk() for r in o.results} | set(lreg.args)
    producers = {r: o for o in lreg.walk() for r in o.results}

    def _const(v: Value) -> int | None:          # a constant made inside the region (lo + i with lo = 0)
        q = producers.get(v)
        return int(q.attrs["value"]) if q is not None and q.opcode == "scalar_const" else None
    out = {}
    for o in lreg.ops:
        if o.opcode != "global_to_shared" or (o.operands[0].type.cols * o.operands[0].type.dtype.itemsize) % 16:
            continue
        walked, start = [], []
        for d, v in enumerate(o.operands[2:]):
            p = producers.get(v)
            if v not in inner:
                start.append(v)
            elif p is not None and p.opcode == "scalar_const":
                start.append(int(p.attrs["value"]))
            elif v is step:
                walked.append(d)
                start.append(None)
            elif (p is not None and p.opcode == "scalar_binary" and p.attrs["op"] == "add" and step in p.operands
                  and p.operands[0] is not p.operands[1]
                  and all(x is step or x not in inner or _const(x) is not None for x in p.operands)):
                walked.append(d)
                other = next(x for x in p.operands if x is not step)
                start.append(other if other not in inner else _const(other))
            else:
                walked = []
                break
        if len(walked) == 1:
            out[o] = (walked[0], start, step)
    return out


def fused_grid_loads(program: Program) -> dict[int, tuple[Op, int]]:
    """Register loads that the emitter folds into their one use, an elementwise binary op right after them
    in the same region (nothing in between): hk_hip's load_binary loads and combines element by element
    inside the load's mode branches (used for wave-grid tiles, where a second whole tile next to the
    accumulator spills: gemm_fp8's scale tiles). {id(binary op): (the load, the operand it was)}."""
    uses = patterns.use_counts(program)
    out = {}
    for o in program.body.walk():
        for reg in o.regions:
            _fuse_in(reg.ops, uses, out)
    _fuse_in(program.body.ops, uses, out)
    return out


def _fuse_in(ops, uses, out) -> None:
    for ld, nxt in zip(ops, ops[1:]):
        if (ld.opcode == "global_to_register" and nxt.opcode == "binary" and uses.get(ld.result) == 1
                and ld.result in nxt.operands and nxt.operands[0] is not nxt.operands[1]
                and ld.result.type == nxt.operands[1 - nxt.operands.index(ld.result)].type):
            out[id(nxt)] = (ld, nxt.operands.index(ld.result))


def emit(program: Program, plan: Plan) -> EmittedKernel:
    return HipEmitter(plan, program).emit(program)


# ----------------------------------------------------------------------------------------- grid order
XCDS, GROUP = 8, 8


def xcd_remap(block: int, n: int) -> int:
    """Python mirror of hk::detail::xcd_remap: XCD x = block % 8 takes a contiguous range of ids."""
    per, extra, xcd = n // XCDS, n % XCDS, block % XCDS
    return xcd * per + min(xcd, extra) + block // XCDS


def grouped(l: int, gx: int, gy: int) -> tuple[int, int]:
    """Python mirror of hk::detail::grouped: runs of GROUP x-rows sweep y."""
    in_group = GROUP * gy
    first = (l // in_group) * GROUP
    size = min(gx - first, GROUP)
    r = l % in_group
    return first + r % size, r // size


def block_remap(hw: int, grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """The logical (x, y, z) that hk::block_idx gives the block dispatched as linear id `hw`."""
    gx, gy, gz = grid
    l = xcd_remap(hw, gx * gy * gz)
    z, r = divmod(l, gx * gy)
    x, y = grouped(r, gx, gy)
    return x, y, z
