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
    LDS is then free for the buffers those pipelines fill (`arena`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...codegen import library, resources
from ...codegen.cstyle import CStyleEmitter, EmittedKernel
from ...codegen.layouts import Strip, TFragment, assign_layouts, assign_shared_storage, strip_reduce_scratch
from ...codegen.resources import mma_scratch_bytes
from ...interface import dtypes as D
from ...interface.backend import Target
from ...interface.errors import UnsupportedError
from ...interface.ir import Op, Program, Region, TileType, Value
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
    """layouts.assign_shared_storage, except on gfx950 for a buffer read only as the B operand of mmas whose
    A is a transposed-fragment register tile (attention's V): ds_read_b64_tr_b16 reads its k-runs from
    row-major storage, so it stays row-major and loads straight into LDS (no transposing 16-bit stores)."""
    storage = assign_shared_storage(program)
    if arch != "gfx950":
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
    for op in program.body.walk():
        if op.opcode == "pipeline":
            s, why = pipeline_schedule(op, waves, requested, lay)
            scheds.append({"pipeline": op.results[0].id if op.results else None, "stages": op.attrs["stages"],
                           "schedule": s, "why": why})
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
              "B": "ds_read_b64_tr_b16 (row-major)" if op.operands[0].type.space == "rt" and target.arch == "gfx950"
                   and not lay.get(op.operands[1]) else "k-contiguous reads",
              "why": "transposed-fragment accumulator: operands swapped, the tile's rows lie along the lanes"}
             for op in program.body.walk() if op.opcode == "mma" and isinstance(lay.get(op.result), TFragment)]
    fused = [{"op": m.result.id, "opcode": m.opcode, "in": w.result.id,
              "why": "mask evaluated where the select writes (no mask tile)"} for m, w in fused_masks(program, lay).items()]
    fused += [{"op": op.result.id, "opcode": "binary mul", "in": next(u.result.id for u in program.body.walk()
                                                                      if op.result in u.operands),
               "why": "lazy rescale: skipped when every factor the wave holds is 1"}
              for op in lazy_rescales(program, lay)]
    # an upper bound: the compiler drops an arena (or scratch) no code reaches
    lds = resources.shared_bytes(arena_total, scratch)
    return Plan(target.arch, waves, waves * LANES, scratch, arena_total, lds, scheds, options.block_remap,
                registers, tfrag, fused)


# ------------------------------------------------------------------------------------------ fused masks
MASK_LEAVES = ("causal_mask", "bounds_mask")


def fused_masks(program: Program, lay: dict) -> dict[Op, Op]:
    """{mask op: the where op it is evaluated in} for selects into transposed-fragment tiles whose mask is a
    tree of causal/bounds masks joined by and/or/not, each used once: the where evaluates the tree at each
    element it writes (hk::where_at), so no mask tile is ever held (attention's edge tiles: three 256x64
    masks would be 96 VGPRs a lane, or as lane masks more SGPRs than there are)."""
    uses: dict[Value, int] = {}
    for op in program.body.walk():
        for v in op.operands:
            uses[v] = uses.get(v, 0) + 1
        for r in op.regions:
            for y in r.yields:
                uses[y] = uses.get(y, 0) + 2          # a carried value is never fused
    producers = {r: o for o in program.body.walk() for r in o.results}

    def tree(v: Value) -> list[Op] | None:
        o = producers.get(v)
        if o is None or uses.get(v, 0) != 1 or not isinstance(lay.get(v), TFragment):
            return None
        if o.opcode in MASK_LEAVES:
            return [o]
        if o.opcode == "unary" and o.attrs["op"] == "not":
            sub = tree(o.operands[0])
            return None if sub is None else sub + [o]
        if o.opcode == "binary" and o.attrs["op"] in ("and", "or"):
            a, b = tree(o.operands[0]), tree(o.operands[1])
            return None if a is None or b is None else a + b + [o]
        return None
    out: dict[Op, Op] = {}
    for op in program.body.walk():
        if op.opcode == "where" and isinstance(lay.get(op.result), TFragment):
            t = tree(op.operands[0])
            if t is not None:
                out.update({m: op for m in t})
    return out


def lazy_rescales(program: Program, lay: dict) -> dict[Op, tuple[Value, Value]]:
    """{mul op: (tile, row vector)} for the accumulator rescales of transposed-fragment mmas: an f32 tile times a
    row vector broadcast along its rows whose only use is the accumulator of an mma into a transposed fragment
    (attention's acc * alpha[:, None]). hk::mma_rescaled runs the mma on the unscaled accumulator when every
    factor the wave holds is 1 (no row's running max moved: x * 1 == x, bit for bit), the lazy rescale."""
    uses: dict[Value, list[Op]] = {}
    for op in program.body.walk():
        for v in op.operands:
            uses.setdefault(v, []).append(op)
        for r in op.regions:
            for y in r.yields:
                uses.setdefault(y, []).append(op)
    producers = {r: o for o in program.body.walk() for r in o.results}
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
        pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
        self._schedule = {id(op): s["schedule"] for op, s in zip(pipes, plan.schedules)}
        lay = layouts(program, plan.waves, plan.arch)
        self._offsets = arena(program, lay)[0]
        self._preloads = preloads(program, lay)               # buffer -> the pipeline it is preloaded before
        self._producers = {r: o for o in program.body.walk() for r in o.results}
        self._fused = fused_masks(program, lay)               # mask op -> the where that evaluates it
        self._lazy = lazy_rescales(program, lay)              # rescale op -> (tile, row vector), in its mma

    # ---- masks evaluated inside the select that uses them (fused_masks)
    def _mask_expr(self, v: Value) -> str:
        o = self._producers[v]
        if o.opcode in MASK_LEAVES:
            return f"{self.name(v)}.at(r, c)"
        if o.opcode == "unary":
            return f"!{self._mask_expr(o.operands[0])}"
        join = " && " if o.attrs["op"] == "and" else " || "
        return f"({self._mask_expr(o.operands[0])}{join}{self._mask_expr(o.operands[1])})"

    def op_causal_mask(self, op: Op) -> None:
        if op not in self._fused:
            return super().op_causal_mask(op)
        self.line(f"const auto {self.name(op.result)} = hk::causal_at({self.args(op.operands)});")

    def op_bounds_mask(self, op: Op) -> None:
        if op not in self._fused:
            return super().op_bounds_mask(op)
        self.line(f"const auto {self.name(op.result)} = hk::bounds_at({self.args(op.operands)});")

    def op_unary(self, op: Op) -> None:
        if op not in self._fused:
            super().op_unary(op)

    def op_binary(self, op: Op) -> None:
        if op not in self._fused and op not in self._lazy:
            super().op_binary(op)

    op_compare = op_binary

    def op_where(self, op: Op) -> None:
        m, a, b = op.operands
        if self._producers.get(m) not in self._fused:
            return super().op_where(op)
        self.line(f"{self.decl(op.result)};")
        self.line(f"hk::where_at({self.name(op.result)}, [&](int r, int c) {{ return {self._mask_expr(m)}; }}, "
                  f"{self.name(a)}, {self.name(b)});")

    def arena(self, program: Program, buffers: list[Value]) -> tuple[list[int], int]:
        offsets, total = arena(program, layouts(program, self.plan.waves), self.smem_align)
        return [offsets[b] for b in buffers], total

    def op_mma(self, op: Op) -> None:
        a, bb, c = op.operands
        buf = _buffer_of(a, self._producers)
        a_name = f"hk_pre{buf.id}" if buf is not None and buf in self._preloads else self.name(a)
        scale = self._lazy.get(self._producers.get(c))
        if scale is not None:             # acc * rows[:, None] feeds only this mma: the rescale is skippable
            x, v = scale
            self._result(op, f"hk::mma_rescaled<{self.mma_template_args(op)}>({{dst}}, {a_name}, {self.name(bb)}, "
                             f"{self.name(x)}, {self.name(v)});")
        else:
            self._result(op, f"hk::mma<{self.mma_template_args(op)}>({{dst}}, {a_name}, {self.name(bb)}, "
                             f"{self.name(c)});")

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
        for k, (g2s, (dim, ix0, step)) in enumerate(cursor_loads(op).items()):
            st, gl = g2s.operands[:2]
            name = f"hk_cur{self.pipeline_uid(op)}_{k}"
            start = ", ".join("0" if v is None else str(v) if isinstance(v, int) else self.name(v) for v in ix0)
            self.line(f"const auto {name} = hk::make_cursor<{self.ctype(st.type, st)}, {dim}>({self.name(gl)}, {start});")
            self._cursors[id(g2s)] = (name, step)
        try:
            super().op_pipeline(op)
        finally:
            self._cursors = {}

    def op_global_to_shared(self, op: Op) -> None:
        if id(op) not in self._cursors:
            return super().op_global_to_shared(op)
        name, step = self._cursors[id(op)]
        st, gl, *idx = op.operands
        fill = self.literal(op.attrs["fill"], D.f32)
        self.line(f"hk::load({self.name(st)}, {name}, {self.name(step)}, {self.name(gl)}, {fill}, {self.args(idx)});")

    def pipeline_template_args(self, op: Op) -> str:
        sched = self._schedule[id(op)]
        return f"{op.attrs['stages']}, hk::sched::{sched}"

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
