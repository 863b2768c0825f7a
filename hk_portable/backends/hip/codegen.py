"""Program -> header-free HIP C++: the shared C-style emitter plus this backend's prelude (the device library
inlined), the launch bound and the library forms of what the plan chose. schedule.make_plan decides everything
(waves, schedules, layouts, the arena, preloads, fused and interleaved ops, gfx942's fp8 storage); the emitter
reads the `Plan` and its `Lowering` and decides nothing. (The shared driver, CStyleEmitter.emit, still assigns
register layouts and finds fused masks itself; the hooks here hand it the plan's shared storage, arena and mask
layouts, so it reaches the same answers.)
"""
from __future__ import annotations

from pathlib import Path

from ...codegen import library
from ...codegen.cstyle import BINARY_FN, CTYPE, UNARY_FN, CStyleEmitter, EmittedKernel
from ...codegen.layouts import FRAGMENT, ColMajor
from ...codegen.patterns import MASK_LEAVES
from ...interface import dtypes as D
from ...interface.ir import Op, Program, Region, SharedBufType, Value
from . import archs
from .patterns import where_at_takes
from .schedule import Plan

HEADER = Path(__file__).with_name("include") / "hk_hip.h"
LIBRARY = library.DeviceLibrary(HEADER, Path(__file__))
header_text = LIBRARY.text              # the device library inlined: the prelude of every kernel
library_hash = LIBRARY.fingerprint      # part of the compile cache key


class HipEmitter(CStyleEmitter):
    """Renders one program by its plan: every choice is read from the Plan (its schedules) and its Lowering."""
    strip_layouts = True
    grid_layouts = True
    col_major_shared = True
    tfrag_layouts = True

    def __init__(self, plan: Plan):
        self.plan = plan
        self.low = plan.lowering                             # what each op lowers to (schedule.Lowering)
        self.lanes = plan.wave_size
        self._cursors: dict[Op, tuple[str, Value]] = {}     # load op -> (cursor name, step value)
        self._split = False                                 # the pipeline being emitted splits its loads
        # the interleaved mmas (patterns.interleaved_pv) looked up by what op_* is handed: a compute step's
        # region (its ops hoisted), a lazy rescale (kept apart from its mma), P's conversion (branch-free)
        self._interleaved = plan.interleaved()
        self._orders = {id(d["pipeline"].regions[1]): d["order"] for d in self._interleaved.values() if d["order"]}
        self._split_rescales = {d["rescale"] for d in self._interleaved.values() if d["rescale"] is not None}
        self._select_casts = {m.operands[0] for m in self._interleaved}

    def shared_storage(self, program: Program) -> dict:
        return self.low.storage

    def fuses_masks(self, v: Value) -> bool:
        return where_at_takes(self.low.layouts, v)

    def op_unary(self, op: Op) -> None:
        if op.opcode == "unary" and op.attrs["op"] == "exp2" and op.result in self.low.lazy_rows:
            self._result(op, f"hk::exp2_lazy({{dst}}, {self.name(op.operands[0])});")   # lazy_rescales
            return
        super().op_unary(op)

    def op_compare(self, op: Op) -> None:
        if op not in self.low.lazy:
            super().op_compare(op)

    def op_reduce(self, op: Op) -> None:
        if op not in self.low.scaled:
            return super().op_reduce(op)
        x, c = self.low.scaled[op]
        self._result(op, f"hk::reduce_scaled({{dst}}, {self.name(x)}, {self.name(c)});")

    def op_where(self, op: Op) -> None:
        m, a, b = op.operands
        a_name = self.name(self.low.scaled[op][0] if op in self.low.scaled else a)   # masked_scales: x unscaled
        band = self._band_expr(m) if self.producer_of(m) in self.fused else None
        if band is None and op not in self.low.scaled:
            return super().op_where(op)
        self.line(f"{self.decl(op.result)};")
        if band is not None:
            self.line(f"hk::where_band({self.name(op.result)}, {band}, {a_name}, {self.name(b)});")
        elif self.producer_of(m) in self.fused:
            self.line(f"hk::where_at({self.name(op.result)}, [&](int r, int c) {{ return {self._mask_expr(m)}; }}, "
                      f"{a_name}, {self.name(b)});")
        else:
            self.line(f"hk::where({self.name(op.result)}, {self.name(m)}, {a_name}, {self.name(b)});")

    def _band_expr(self, v: Value) -> str | None:
        """A fused mask tree that is a conjunction of causal, negated causal and bounds masks as one
        hk::band_pred (masks.h where_band: an interval of columns per row); None for any other tree."""
        o = self.producer_of(v)
        if o.opcode in MASK_LEAVES:                  # masks.h: band() of a causal_at or bounds_at predicate
            return f"hk::band({self.name(v)})"
        if o.opcode == "unary" and o.attrs["op"] == "not":
            inner = self.producer_of(o.operands[0])
            return f"hk::anti_band({self.name(o.operands[0])})" if inner.opcode == "causal_mask" else None
        if o.opcode == "binary" and o.attrs["op"] == "and":
            x, y = (self._band_expr(w) for w in o.operands)
            return None if x is None or y is None else f"({x} & {y})"
        return None

    def arena(self, program: Program, buffers: list[Value]) -> tuple[list[int], int]:
        return [self.low.offsets[b] for b in buffers], self.plan.arena_bytes

    def num_threads(self, program: Program) -> int:
        return self.plan.threads

    def kernel_qualifiers(self, num_threads: int) -> str:
        # clang ignores launch_bounds for AMD; this attribute is what bounds registers and is checked
        return f"extern \"C\" __global__ __attribute__((amdgpu_flat_work_group_size(1, {num_threads})))"

    def smem_arena(self, shared_bytes: int) -> str:
        return f"HK_SMEM_ARENA(hk_smem, {max(shared_bytes, 16)});"

    # ---- pipeline load cursors (hk_hip/global_shared.h: make_cursor / load(dst, cursor, i, ...))
    def op_pipeline(self, op: Op) -> None:
        for b, p in self.low.preloads.items():
            if p is op:          # fragments in registers; the barrier frees the buffer's LDS for this pipeline
                self.line(f"const auto hk_pre{b.id} = hk::preload({self.name(b)}.stage(0));")
                self.line("hk::sync();")
        self._cursors = {}
        self._split = self.plan.schedule_of(op).prefetch == "split"
        self._split_tiles: list[str] = []
        for k, (g2s, (dim, ix0, step)) in enumerate(self.low.cursors[op].items()):
            st, gl = g2s.operands[:2]
            name = f"hk_cur{self.pipeline_uid(op)}_{k}"
            start = ", ".join("0" if v is None else str(v) if isinstance(v, int) else self.name(v) for v in ix0)
            tile = self.ctype(st.type, st)
            fill = self.literal(g2s.attrs["fill"], D.f32)     # a zero fill lets the range check pad ragged rows
            # not const: a split pipeline's cursor holds the staged registers between issue and commit
            self.line(f"auto {name} = hk::make_cursor<{tile}, {dim}>({self.name(gl)}, {fill}, {start});")
            self._cursors[g2s] = (name, step)
            self._split_tiles.append(tile)
        try:
            self._pipeline_body(op)
        finally:
            self._cursors = {}
            self._split = False

    def ctype(self, t, v: Value | None = None) -> str:
        if v is None or v not in self.low.fnuz:
            return super().ctype(t, v)
        base = self.layouts.get(v)
        tag = f"hk::fnuz<{base.template_arg() if isinstance(base, ColMajor) else 'hk::rowmajor'}>"
        dt, (r, c) = CTYPE[t.dtype.name], t.shape
        if isinstance(t, SharedBufType):
            return f"hk::sbuf<{dt}, {r}, {c}, {t.stages}, {tag}>"
        return f"hk::st<{dt}, {r}, {c}, {tag}>"

    def emit_ops(self, ops, in_pipeline_load: bool = False) -> None:
        if self.low.epilogues:                   # fused_epilogues: computed inside their store (op_register_to_global)
            ops = [o for o in ops if o not in self.low.epilogue_ops]
        super().emit_ops(ops, in_pipeline_load)

    def op_register_to_global(self, op: Op) -> None:
        run = self.low.epilogues.get(op)
        if run is None:
            return super().op_register_to_global(op)
        gl, x, *idx = op.operands
        made = {o.result for o in run}

        def at(v: Value) -> str:                 # element hk_e of v: a value made in the run, or a leaf tile's
            return f"{self.name(v)}_e" if v in made else f"{self.name(v)}.data[hk_e]"
        readers = []
        for o in run:
            if o.opcode == "global_to_register":
                g, *ix = o.operands
                self.line(f"const auto hk_rd{o.result.id} = hk::read_grid<{self.ctype(o.result.type, o.result)}>("
                          f"{self.name(g)}, {self.literal(o.attrs['fill'], D.f32)}, {self.args(ix)});")
                readers.append(f"hk_rd{o.result.id}.full()")
        self.line(f"hk::store_each<{self.ctype(x.type, x)}>({self.name(gl)}, {' && '.join(readers) or 'true'}, "
                  "[&](auto hk_mode, int hk_e, int hk_r, int hk_c) {")
        self.indent += 1
        for o in run:
            t = CTYPE[o.result.type.dtype.name]
            if o.opcode == "binary":
                a, b = (f"hk::calc({at(v)})" for v in o.operands)
                expr = f"hk::uncalc<{t}>({BINARY_FN[o.attrs['op']]}::apply({a}, {b}))"
            elif o.opcode == "unary":
                expr = f"hk::uncalc<{t}>({UNARY_FN[o.attrs['op']]}::apply(hk::calc({at(o.operands[0])})))"
            elif o.opcode == "cast":
                expr = f"hk::convert<{t}>({at(o.operands[0])})"
            elif o.opcode == "fill":
                expr = f"hk::convert<{t}>({self.literal(o.attrs['value'], o.result.type.dtype)})"
            elif o.opcode == "splat":
                expr = f"hk::convert<{t}>({self.name(o.operands[0])})"
            elif o.opcode == "broadcast":
                expr = f"hk::broadcast_at<{self.ctype(o.result.type, o.result)}>({self.name(o.operands[0])}, hk_e)"
            elif o.opcode == "global_to_register":
                expr = f"hk_rd{o.result.id}.get(hk_mode, hk_r, hk_c)"
            else:                                # patterns.EPILOGUE_OPS grew an op this has no form of
                raise AssertionError(f"store_each has no per-element form of {o.opcode!r}")
            self.line(f"const {t} {self.name(o.result)}_e = {expr};")
        self.line(f"return {at(x)};")
        self.indent -= 1
        self.line(f"}}, {self.args(idx)});")

    def op_global_to_register(self, op: Op) -> None:
        if op in self.low.folded_loads:
            return                               # loaded inside its one elementwise use (op_binary)
        super().op_global_to_register(op)

    def region(self, reg: Region, in_pipeline_load: bool = False) -> None:
        order = self._orders.get(id(reg))          # interleaved_pv: the lazy rescale hoisted
        self.emit_ops(order if order is not None else reg.ops, in_pipeline_load)

    def op_cast(self, op: Op) -> None:
        if op in self.low.nan_rows:              # nan_row_casts: no NaN arm, the mma's NaN rows set after it
            self._result(op, f"hk::cast_finite({{dst}}, {self.name(op.operands[0])});")
            return
        if op.result in self._select_casts:      # interleaved_pv: P's conversion in the MFMAs' basic block
            self._result(op, f"hk::cast_select({{dst}}, {self.name(op.operands[0])});")
            return
        super().op_cast(op)

    def op_binary(self, op: Op) -> None:
        if op in self._split_rescales:           # interleaved_pv: the lazy rescale apart from its mma
            x, v = self.low.lazy[op]
            self._result(op, f"hk::rescale_lazy({{dst}}, {self.name(x)}, {self.name(v)});")
            return
        if op in self.fused or op in self.low.lazy:
            return                               # evaluated inside its where / its mma (fused_masks, lazy_rescales)
        if op in self.low.scaled:                # folded_scales: the mul is skipped, the sub is one fma
            if op.attrs["op"] == "sub":
                x, c, v = self.low.scaled[op]
                self._result(op, f"hk::fms_rows({{dst}}, {self.name(x)}, {self.name(c)}, {self.name(v)});")
            return
        fused = self.low.fused_loads.get(op)
        if fused is None:
            return super().op_binary(op)
        ld, side = fused
        gl, *idx = ld.operands
        x = op.operands[1 - side]
        fill = self.literal(ld.attrs["fill"], D.f32)
        self._result(op, f"hk::load_binary<{BINARY_FN[op.attrs['op']]}, {'true' if side == 0 else 'false'}>"
                         f"({{dst}}, {self.name(x)}, {self.name(gl)}, {fill}, {self.args(idx)});")

    def op_mma(self, op: Op) -> None:
        self._op_mma(op)
        sums = self.low.nan_row_mmas.get(op)
        if sums is not None:                     # nan_row_casts: A was converted without the NaN arm
            self.line(f"hk::nan_rows({self.name(op.result)}, {self.name(sums)});")

    def _acc_name(self, op: Op) -> str:
        """The accumulator operand's name; a shared zero fill in another layout than the mma's (layouts.py
        tfrag_components) is made afresh in the mma's."""
        c = op.operands[2]
        fill = self.producer_of(c)
        if self.layouts.get(c, FRAGMENT) == self.layouts.get(op.result, FRAGMENT) or fill is None or \
                fill.opcode != "fill":
            return self.name(c)
        name = f"{self.name(c)}_{self.name(op.result)}"
        self.line(f"{self.ctype(op.result.type, op.result)} {name};")
        self.line(f"hk::fill({name}, {self.literal(fill.attrs['value'], c.type.dtype)});")
        return name

    def _op_mma(self, op: Op) -> None:
        a, bb, c = op.operands
        buf = self.low.preloaded_a.get(op)
        a_name = f"hk_pre{buf.id}" if buf is not None else self.name(a)
        quartered = op in self.low.quartered_mmas            # gfx942 fp8: the carry stays in the quartered domain
        if op in self._interleaved:                          # interleaved_pv: rescaled (if lazy) by op_binary
            self._result(op, f"hk::mma<{self.mma_template_args(op)}, true>({{dst}}, {a_name}, {self.name(bb)}, "
                             f"{self._acc_name(op)});")
            return
        scale = None if quartered else self.low.lazy.get(self.producer_of(c))
        if scale is not None:             # acc * rows[:, None] feeds only this mma: the rescale is skippable
            x, v = scale
            self._result(op, f"hk::mma_rescaled<{self.mma_template_args(op)}>({{dst}}, {a_name}, {self.name(bb)}, "
                             f"{self.name(x)}, {self.name(v)});")
        else:
            args = self.mma_template_args(op) + (", true" if quartered else "")
            self._result(op, f"hk::mma<{args}>({{dst}}, {a_name}, {self.name(bb)}, {self._acc_name(op)});")

    def _pipeline_body(self, op: Op) -> None:
        """cstyle's op_pipeline, with the quartered carries entering their domain before the loop and
        leaving it after."""
        n, *inits = op.operands
        lreg, creg = op.regions
        carry = self._carry_vars(op, inits)
        quartered = self.low.quartered.get(op, {})
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
        if op not in self._cursors:
            return super().op_global_to_shared(op)
        name, step = self._cursors[op]
        st, gl, *idx = op.operands
        fill = self.literal(op.attrs["fill"], D.f32)
        phase = "hk_phase" if self._split else "hk::phase::all{}"
        self.line(f"hk::load_step({phase}, {self.name(st)}, {name}, {self.name(step)}, {self.name(gl)}, {fill}, "
                  f"{self.args(idx)});")

    def pipeline_template_args(self, op: Op) -> str:
        sched = self.plan.schedule_of(op).schedule
        loads = f"hk::split<{', '.join(self._split_tiles)}>" if self._split else "hk::whole"
        return f"{op.attrs['stages']}, hk::sched::{sched}, {loads}"

    def prelude(self, program: Program, num_threads: int, shared_bytes: int) -> str:
        p = self.plan
        lines = [
            f"// generated by hk_portable's hip backend: kernel {program.symbol} for {p.arch}, {p.waves} waves "
            f"of {p.wave_size}, LDS {p.lds_bytes} B",
            f"#define HK_NUM_WARPS {p.waves}",
            f"#define HK_NUM_THREADS {num_threads}",
            f"#define HK_SCRATCH_BYTES {max(p.scratch_bytes, 16)}",
            f"#define HK_BLOCK_REMAP {1 if p.block_remap else 0}",
            f"#define HK_XCDS {archs.ARCHS[p.arch].xcds}",
            "#define HK_SMEM_ARENA(name, bytes) __shared__ __attribute__((aligned(128))) unsigned char name[bytes]",
            header_text(),
        ]
        return "\n".join(lines)


def emit(program: Program, plan: Plan) -> EmittedKernel:
    return HipEmitter(plan).emit(program)
