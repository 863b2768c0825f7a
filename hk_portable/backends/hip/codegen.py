"""Program -> header-free HIP C++: the shared C-style emitter plus this backend's prelude (the device
library inlined), the launch bound, the pipeline schedule and the checks of what the library takes.

Decisions made here, per program and target (a `Plan`, recorded in the Artifact):
  * waves per block: the kernel's `num_warps` hint (1..16), or the `waves` option (options.py);
  * the schedule of each `hk.pipeline`: plain double buffering, or the 8-wave ping-pong when the kernel
    asks for 8 waves, the pipeline has 3+ stages and its compute step never talks to other waves
    (the `schedule` option: "auto" | "double_buffer" | "pingpong" overrides);
  * scratch LDS for the library's exchanges between waves (column reductions, register mma operands
    that are not the wave's own rows), sized with the library's own formulas;
  * layouts (codegen/layouts.py, with this library's strips, wave-grid accumulators and column-major
    shared tiles) and, per pipeline load that walks one index by the step, a cursor that computes its
    addresses once before the loop (`cursor_loads`);
  * per pipeline, whether its step's loads are split around the compute step (`split_prefetch`): the
    global reads of tile i+AHEAD issued before compute(i), their LDS writes (or LDS-DMA waits) after it,
    so the loads are in flight while the MFMAs run; recorded as the schedule's "prefetch".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...codegen import library, resources
from ...codegen.cstyle import CStyleEmitter, EmittedKernel
from ...codegen.layouts import Strip, assign_layouts, assign_shared_storage, strip_reduce_scratch
from ...codegen.resources import mma_scratch_bytes
from ...interface import dtypes as D
from ...interface.backend import Target
from ...interface import opcodes
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
def layouts(program: Program, waves: int) -> dict:
    """The layout pass's choice for this backend (its library implements strips over 64 lanes and
    column-major shared tiles): register values, then shared buffers and their stages."""
    return {**assign_layouts(program, waves, strips=True, lanes=LANES, grids=True), **assign_shared_storage(program)}


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


def unsplit(plan: "Plan", why: str) -> "Plan":
    """The plan with every pipeline's loads whole (the backend's fallback when splitting them costs
    registers: backend.py, HipBackend.compile)."""
    scheds = [{**s, "prefetch": "whole", "prefetch_why": why} if s.get("prefetch") == "split" else s
              for s in plan.schedules]
    return Plan(**{**asdict(plan), "schedules": scheds})


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
    lay = layouts(program, waves)
    for op in program.body.walk():
        if op.opcode == "pipeline":
            s, why = pipeline_schedule(op, waves, requested, lay)
            split, split_why = split_prefetch(op)
            if options.prefetch == "split" and not split:
                raise UnsupportedError(f"prefetch 'split' cannot run this pipeline: {split_why}")
            if options.prefetch == "whole" and split:
                split, split_why = False, "requested"
            scheds.append({"pipeline": op.results[0].id if op.results else None, "stages": op.attrs["stages"],
                           "schedule": s, "why": why, "prefetch": "split" if split else "whole",
                           "prefetch_why": split_why})
    scratch = scratch_bytes(program, waves)
    arena = resources.arena_bytes(program)
    # an upper bound: the compiler drops an arena (or scratch) no code reaches
    lds = resources.shared_bytes(arena, scratch)
    return Plan(target.arch, waves, waves * LANES, scratch, arena, lds, scheds, options.block_remap)


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

    def __init__(self, plan: Plan, program: Program):
        self.plan = plan
        self._cursors: dict[int, tuple[str, Value]] = {}    # load op id -> (cursor name, step value)
        self._split = False                                 # the pipeline being emitted splits its loads
        pipes = [op for op in program.body.walk() if op.opcode == "pipeline"]
        self._schedule = {id(op): s["schedule"] for op, s in zip(pipes, plan.schedules)}
        self._prefetch = {id(op): s.get("prefetch") == "split" for op, s in zip(pipes, plan.schedules)}

    def num_threads(self, program: Program) -> int:
        return self.plan.threads

    def kernel_qualifiers(self, num_threads: int) -> str:
        # clang ignores launch_bounds for AMD; this attribute is what bounds registers and is checked
        return f"extern \"C\" __global__ __attribute__((amdgpu_flat_work_group_size(1, {num_threads})))"

    def smem_arena(self, shared_bytes: int) -> str:
        return f"HK_SMEM_ARENA(hk_smem, {max(shared_bytes, 16)});"

    # ---- pipeline load cursors (hk_hip/global_shared.h: make_cursor / load(dst, cursor, i, ...))
    def op_pipeline(self, op: Op) -> None:
        self._cursors = {}
        self._split = self._prefetch.get(id(op), False)
        self._split_tiles: list[str] = []
        for k, (g2s, (dim, ix0, step)) in enumerate(cursor_loads(op).items()):
            st, gl = g2s.operands[:2]
            name = f"hk_cur{self.pipeline_uid(op)}_{k}"
            start = ", ".join("0" if v is None else str(v) if isinstance(v, int) else self.name(v) for v in ix0)
            tile = self.ctype(st.type, st)
            # not const: a split pipeline's cursor holds the staged registers between issue and commit
            self.line(f"auto {name} = hk::make_cursor<{tile}, {dim}>({self.name(gl)}, {start});")
            self._cursors[id(g2s)] = (name, step)
            self._split_tiles.append(tile)
        try:
            super().op_pipeline(op)
        finally:
            self._cursors = {}
            self._split = False

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
                  and all(x is step or x not in inner for x in p.operands)):
                walked.append(d)
                start.append(next(x for x in p.operands if x is not step))
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
