"""One C-style emitter for CUDA and HIP (the tinygrad pattern: a shared renderer, small per-vendor
subclasses). Each IR op becomes one call into the backend's device library (`hk::` namespace,
specified in DEVICE_API.md); the device library owns layouts, instructions and schedules. Each opcode
of the table (interface/opcodes.py) has one rule here, `op_<opcode>`, checked when this module loads.

The emitter's own decisions are few and vendor-neutral:
  * which axis each register vector (RV) is aligned with, and which layout each register value takes
    (layouts.py: the fragment layout, or a strip where the backend offers one and nothing needs the
    fragment), from its uses;
  * where block barriers go around shared-memory writes outside pipelines;
  * the shared-memory arena: one byte array, each buffer at a 128-byte aligned offset (resources.py).
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from dataclasses import dataclass, field

from ..interface import dtypes as D
from ..interface import opcodes
from ..interface.errors import UnsupportedError
from ..interface.ir import GlobalType, Op, Program, Region, ScalarType, SharedBufType, TileType, Value
from . import patterns
from .layouts import COL, FRAGMENT, ROW, assign_layouts, assign_shared_storage, assign_vector_axes  # noqa: F401 - re-exported
from .resources import SMEM_ALIGN, arena_layout  # noqa: F401 - SMEM_ALIGN: re-exported for emitters

CTYPE = {"bf16": "hk::bf16", "f16": "hk::f16", "f32": "float", "fp8e4m3": "hk::fp8e4m3",
         "fp8e5m2": "hk::fp8e5m2", "i32": "int", "bool": "bool"}
UNARY_FN = {op: f"hk::op_{op}" for op in ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh",
                                           "sigmoid", "relu", "not")}
BINARY_FN = {op: f"hk::op_{op}" for op in ("add", "sub", "mul", "div", "maximum", "minimum", "and", "or",
                                            "lt", "le", "gt", "ge", "eq", "ne")}


def source_fingerprint(*paths: Path) -> str:
    """A short hash of the files that shape a backend's generated code (its device library, its emitter
    subclass) together with this shared emitter: part of every compile cache key."""
    h = hashlib.sha256()
    for p in (*paths, Path(__file__)):
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


@dataclass
class EmittedKernel:
    source: str
    kernel_name: str
    shared_bytes: int
    num_threads: int
    params: list[tuple[str, object]]          # (name, IR type) in ABI order
    vector_axes: dict[int, str] = field(default_factory=dict)
    extras: dict = field(default_factory=dict)  # backend facts the launch needs beyond params (e.g. TMA maps)


# -------------------------------------------------------------------------------------- emitter
class CStyleEmitter:
    """Program -> C++ source. Subclasses set the vendor hooks below."""
    lanes = 32

    # ---- vendor hooks
    def prelude(self, program: Program, num_threads: int, shared_bytes: int) -> str:
        raise NotImplementedError

    smem_align = SMEM_ALIGN         # where each shared buffer starts (a backend may need more)
    strip_layouts = False           # whether the device library implements layouts.Strip
    narrow_strips = False           # whether it implements narrow strips (layouts.Strip.lr: rows under a warp)
    grid_layouts = False            # ... and layouts.WaveGrid accumulators
    col_major_shared = False        # ... and column-major shared tiles (layouts.assign_shared_storage)
    tfrag_layouts = False           # ... and layouts.TFragment (transposed-fragment mma accumulators)

    def fuses_masks(self, v: Value) -> bool:
        """Whether the library's hk::where_at / causal_at / bounds_at evaluate masks at the positions of v's
        layout (patterns.fused_masks: a select then evaluates its mask tree where it writes)."""
        return False

    def kernel_qualifiers(self, num_threads: int) -> str:
        return "extern \"C\" __global__"

    def smem_arena(self, shared_bytes: int) -> str:
        return f"HK_SMEM_ARENA(hk_smem, {max(shared_bytes, 16)});"

    def num_threads(self, program: Program) -> int:
        """Threads that run the Program's ops (what the layouts and the device library divide work over)."""
        return program.num_warps * self.lanes

    def block_threads(self, program: Program) -> int:
        """Threads the block launches with: a backend's schedule may add warps of its own (a producer)."""
        return self.num_threads(program)

    def extra_params(self) -> list[str]:
        """Kernel parameters after the Program's (declarations), known once the body is emitted."""
        return []

    def launch_extras(self) -> dict:
        return {}

    def shared_storage(self, program: Program) -> dict:
        """Shared buffers stored other than row-major (when the library takes col_major_shared)."""
        return assign_shared_storage(program)

    def arena(self, program: Program, buffers: list[Value]) -> tuple[list[int], int]:
        """(offset of each shared buffer, arena bytes): program order, no two buffers overlapping (a backend
        that knows when buffers are dead may overlap them)."""
        return arena_layout((v.type for v in buffers), self.smem_align)

    def pipeline_template_args(self, op: Op) -> str:
        """Template arguments of `hk::pipeline<...>` (a backend may append its schedule choice)."""
        return str(op.attrs["stages"])

    # ---- driver
    def register_layouts(self, program: Program) -> dict:
        """Every register value's layout (layouts.assign_layouts with what this library implements); a backend whose
        plan already holds them returns those, so the layout pass runs once."""
        return assign_layouts(program, self.num_threads(program) // self.lanes, self.strip_layouts, self.lanes,
                              self.axes, self.grid_layouts, self.tfrag_layouts, self.narrow_strips)

    def emit(self, program: Program) -> EmittedKernel:
        self.p = program
        self.axes = assign_vector_axes(program)
        self.layouts = self.register_layouts(program)
        if self.col_major_shared:
            self.layouts.update(self.shared_storage(program))
        self.producers = {r: o for o in program.body.walk() for r in o.results}    # value -> the op making it
        self.fused = patterns.fused_masks(program, self.fuses_masks)    # mask-tree op -> its select
        self.lines: list[str] = []
        self.indent = 1
        buffers = [op.result for op in program.shared_buffers()]
        offsets, shared = self.arena(program, buffers)
        self.smem_offsets: dict[Value, int] = dict(zip(buffers, offsets))
        nt = self.block_threads(program)
        params = [(prm.name, prm.type) for prm in program.params]
        self.line(self.smem_arena(shared))
        self.region(program.body)
        sig = ", ".join([f"{self.ctype(v.type, v)} {self.name(v)}" for v in program.body.args]
                        + self.extra_params())
        body = "\n".join(self.lines)
        kname = program.symbol                  # never the raw name: see interface/names.py
        src = (f"{self.prelude(program, nt, shared)}\n"
               f"// ---- kernel {kname}: program {program.hash[:16]}\n"
               f"{self.kernel_qualifiers(nt)} void {kname}({sig}) {{\n{body}\n}}\n")
        return EmittedKernel(src, kname, shared, nt, params, {v.id: a for v, a in self.axes.items()},
                             self.launch_extras())

    # ---- helpers
    def line(self, s: str) -> None:
        self.lines.append("  " * self.indent + s)

    @staticmethod
    def name(v: Value) -> str:
        return f"v{v.id}"

    def ctype(self, t, v: Value | None = None) -> str:
        if isinstance(t, ScalarType):
            return CTYPE[t.dtype.name]
        if isinstance(t, GlobalType):
            return f"hk::gl<{CTYPE[t.dtype.name]}, {t.rank}>"
        lay = self.layouts.get(v, FRAGMENT).template_arg() if v is not None else ""
        lay = f", {lay}" if lay else ""
        if isinstance(t, SharedBufType):
            return f"hk::sbuf<{CTYPE[t.dtype.name]}, {t.shape[0]}, {t.shape[1]}, {t.stages}{lay}>"
        if t.space == "rt":
            return f"hk::rt<{CTYPE[t.dtype.name]}, {t.shape[0]}, {t.shape[1]}{lay}>"
        if t.space == "st":
            return f"hk::st<{CTYPE[t.dtype.name]}, {t.shape[0]}, {t.shape[1]}{lay}>"
        ax = self.axes.get(v, ROW) if v is not None else ROW
        return f"hk::rv<{CTYPE[t.dtype.name]}, {t.shape[0]}, hk::{ax}{lay}>"

    @staticmethod
    def literal(x, dtype: D.DType) -> str:
        if not dtype.is_float:
            return f"{int(x)}"
        x = float(x)
        if math.isnan(x):
            return "HK_NAN"
        if math.isinf(x):
            return "HK_INF" if x > 0 else "(-HK_INF)"
        return f"{x.hex()}f" if x != int(x) or abs(x) >= 2**24 else f"{x!r}f"

    def decl(self, v: Value) -> str:
        return f"{self.ctype(v.type, v)} {self.name(v)}"

    def args(self, vals) -> str:
        return ", ".join(self.name(v) for v in vals)

    # ---- regions and ops
    def region(self, reg: Region, in_pipeline_load: bool = False) -> None:
        self.emit_ops(reg.ops, in_pipeline_load)

    def emit_ops(self, ops, in_pipeline_load: bool = False) -> None:
        ops = list(ops)
        for k, op in enumerate(ops):
            fn = getattr(self, "op_" + op.opcode, None)
            if fn is None:
                raise UnsupportedError(f"the C++ emitter has no rule for opcode '{op.opcode}'")
            self.before_op(op)
            if opcodes.writes_shared(op.opcode) and not in_pipeline_load:
                # shared writes outside a pipeline: barrier before (earlier reads done) and after (visible)
                self.line("hk::sync();")
                fn(op)
                if not self.publishes(op, ops[k + 1] if k + 1 < len(ops) else None):
                    self.line("hk::async_wait_all(); hk::sync();")
            else:
                fn(op)
            self.after_op(op)

    def before_op(self, op: Op) -> None:
        """Called before each op is emitted (a backend that leaves work in flight waits for it here)."""

    def after_op(self, op: Op) -> None:
        """Called after each op is emitted."""

    def publishes(self, write: Op, after: Op | None) -> bool:
        """Whether `after`, emitted right after the shared write `write`, makes that write visible to every thread
        itself (its own fence and barrier before it reads), so the write needs no barrier of its own. None here."""
        return False

    def _result(self, op: Op, expr_stmt: str) -> None:
        """`T v = ...;` for scalars, or `T v; call(v, ...);` for tiles (expr_stmt has {dst})."""
        v = op.result
        self.line(f"{self.decl(v)};")
        self.line(expr_stmt.format(dst=self.name(v)))

    def op_scalar_const(self, op):
        t = op.result.type
        self.line(f"const {self.decl(op.result)} = {self.literal(op.attrs['value'], t.dtype)};")

    def op_block_idx(self, op):
        self.line(f"const int {self.name(op.result)} = hk::block_idx<{op.attrs['axis']}>();")

    def op_num_blocks(self, op):
        self.line(f"const int {self.name(op.result)} = hk::num_blocks<{op.attrs['axis']}>();")

    def op_global_dim(self, op):
        self.line(f"const int {self.name(op.result)} = {self.name(op.operands[0])}.shape[{op.attrs['index']}];")

    def op_scalar_binary(self, op):
        a, b = (self.name(v) for v in op.operands)
        k, t = op.attrs["op"], op.result.type.dtype
        if t is D.i32:
            expr = {"add": f"hk::iadd({a}, {b})", "sub": f"hk::isub({a}, {b})", "mul": f"hk::imul({a}, {b})",
                    "floordiv": f"hk::floordiv({a}, {b})", "mod": f"hk::floormod({a}, {b})",
                    "min": f"({a} < {b} ? {a} : {b})", "max": f"({a} > {b} ? {a} : {b})"}[k]
        else:
            expr = {"add": f"{a} + {b}", "sub": f"{a} - {b}", "mul": f"{a} * {b}", "div": f"hk::fdiv({a}, {b})",
                    "min": f"hk::fminf_({a}, {b})", "max": f"hk::fmaxf_({a}, {b})"}[k]
        self.line(f"const {self.decl(op.result)} = {expr};")

    def op_scalar_cast(self, op):
        x = self.name(op.operands[0])
        expr = f"hk::f32_to_i32({x})" if op.attrs["dtype"] == "i32" else f"(float){x}"
        self.line(f"const {self.decl(op.result)} = {expr};")

    def op_alloc_shared(self, op):
        self.line(f"{self.decl(op.result)}(hk_smem + {self.smem_offsets[op.result]});")

    def op_shared_stage(self, op):
        buf, s = op.operands
        self.line(f"{self.decl(op.result)} = {self.name(buf)}.stage({self.name(s)});")

    def op_fill(self, op):
        self._result(op, f"hk::fill({{dst}}, {self.literal(op.attrs['value'], op.result.type.dtype)});")

    def op_splat(self, op):
        self._result(op, f"hk::fill({{dst}}, {self.name(op.operands[0])});")

    def op_broadcast(self, op):
        self._result(op, f"hk::broadcast({{dst}}, {self.name(op.operands[0])});")

    def op_global_to_register(self, op):
        fill = self.literal(op.attrs["fill"], D.f32)
        gl, *idx = op.operands
        self._result(op, f"hk::load({{dst}}, {self.name(gl)}, {fill}, {self.args(idx)});")

    def op_global_to_scalar(self, op):
        gl, *idx = op.operands
        self.line(f"const int {self.name(op.result)} = hk::load_scalar({self.name(gl)}, {op.attrs['fill']}, "
                  f"{self.args(idx)});")

    def op_global_to_shared(self, op):
        st, gl, *idx = op.operands
        fill = self.literal(op.attrs["fill"], D.f32)
        self.line(f"hk::load({self.name(st)}, {self.name(gl)}, {fill}, {self.args(idx)});")

    def op_shared_to_register(self, op):
        self._result(op, f"hk::load({{dst}}, {self.name(op.operands[0])});")

    def op_register_to_shared(self, op):
        self.line(f"hk::store({self.name(op.operands[0])}, {self.name(op.operands[1])});")

    def op_register_to_global(self, op):
        gl, src, *idx = op.operands
        self.line(f"hk::store({self.name(gl)}, {self.name(src)}, {self.args(idx)});")

    op_shared_to_global = op_register_to_global        # hk::store takes an rt, rv or st source

    def op_atomic_add(self, op):
        gl, src, *idx = op.operands
        self.line(f"hk::atomic_add({self.name(gl)}, {self.name(src)}, {self.args(idx)});")

    def mma_template_args(self, op: Op) -> str:
        """Template arguments of `hk::mma<...>` (a backend may append its schedule's choice for this op)."""
        return ", ".join("true" if op.attrs[k] else "false" for k in ("trans_a", "trans_b"))

    def op_mma(self, op):
        a, b, c = op.operands
        self._result(op, f"hk::mma<{self.mma_template_args(op)}>({{dst}}, {self.name(a)}, {self.name(b)}, "
                         f"{self.name(c)});")

    def op_unary(self, op):
        if op in self.fused:                     # evaluated inside its select (fused_masks)
            return
        self._result(op, f"hk::unary<{UNARY_FN[op.attrs['op']]}>({{dst}}, {self.name(op.operands[0])});")

    def op_binary(self, op):
        if op in self.fused:
            return
        a, b = op.operands
        self._result(op, f"hk::binary<{BINARY_FN[op.attrs['op']]}>({{dst}}, {self.name(a)}, {self.name(b)});")

    op_compare = op_binary

    def op_where(self, op):
        m, a, b = op.operands
        if self.producer_of(m) not in self.fused:
            return self._result(op, f"hk::where({{dst}}, {self.args(op.operands)});")
        self.line(f"{self.decl(op.result)};")
        self.line(f"hk::where_at({self.name(op.result)}, [&](int r, int c) {{ return {self._mask_expr(m)}; }}, "
                  f"{self.name(a)}, {self.name(b)});")

    def _mask_expr(self, v: Value) -> str:
        """A fused mask tree as a C++ expression of the position (r, c); its leaves are causal_at/bounds_at."""
        o = self.producer_of(v)
        if o.opcode in patterns.MASK_LEAVES:
            return f"{self.name(v)}.at(r, c)"
        if o.opcode == "unary":
            return f"!{self._mask_expr(o.operands[0])}"
        join = " && " if o.attrs["op"] == "and" else " || "
        return f"({self._mask_expr(o.operands[0])}{join}{self._mask_expr(o.operands[1])})"

    def producer_of(self, v: Value) -> Op | None:
        return self.producers.get(v)

    def op_cast(self, op):
        self._result(op, f"hk::cast({{dst}}, {self.name(op.operands[0])});")

    def op_reduce(self, op):
        k = {"max": "hk::op_maximum", "min": "hk::op_minimum", "sum": "hk::op_add"}[op.attrs["op"]]
        ax = ROW if op.attrs["axis"] == "row" else COL
        self._result(op, f"hk::reduce<{k}, hk::{ax}>({{dst}}, {self.name(op.operands[0])});")

    def op_causal_mask(self, op):
        if op in self.fused:                     # a predicate the select evaluates (fused_masks)
            return self.line(f"const auto {self.name(op.result)} = hk::causal_at({self.args(op.operands)});")
        self._result(op, f"hk::causal_mask({{dst}}, {self.args(op.operands)});")

    def op_bounds_mask(self, op):
        if op in self.fused:
            return self.line(f"const auto {self.name(op.result)} = hk::bounds_at({self.args(op.operands)});")
        self._result(op, f"hk::bounds_mask({{dst}}, {self.args(op.operands)});")

    def op_dropout_mask(self, op):
        self._result(op, f"hk::dropout_mask({{dst}}, {self.args(op.operands)});")

    # ---- structured control flow
    def _carry_vars(self, op: Op, inits) -> list[str]:
        """A loop's carried variables, each initialised from its init."""
        for r, init in zip(op.results, inits):
            self.line(f"{self.decl(r)} = {self.name(init)};")
        return [self.name(r) for r in op.results]

    def _ref_decl(self, v) -> str:
        """The declaration of `v` as a reference."""
        return self.decl(v).replace(" " + self.name(v), " &" + self.name(v))

    def _bind_args(self, args, carry_names) -> None:
        for a, n in zip(args, carry_names):
            self.line(f"{self._ref_decl(a)} = {n};")

    def _yield(self, reg: Region, carry_names: list[str]) -> None:
        args = set(reg.args)
        if any(y in args for y in reg.yields):
            # a yield that is itself a carry argument would be clobbered by sequential assignment
            for k, y in enumerate(reg.yields):
                self.line(f"auto hk_tmp{k} = {self.name(y)};")
            for k, n in enumerate(carry_names):
                self.line(f"{n} = hk_tmp{k};")
        else:
            for y, n in zip(reg.yields, carry_names):
                if self.name(y) != n:
                    self.line(f"{n} = {self.name(y)};")

    def op_for(self, op):
        lo, hi, *inits = op.operands
        (reg,) = op.regions
        carry = self._carry_vars(op, inits)
        i = self.name(reg.args[0])
        self.line(f"for (int {i} = {self.name(lo)}; {i} < {self.name(hi)}; ++{i}) {{")
        self.indent += 1
        self._bind_args(reg.args[1:], carry)
        self.region(reg)
        self._yield(reg, carry)
        self.indent -= 1
        self.line("}")

    def op_pipeline(self, op):
        n, *inits = op.operands
        lreg, creg = op.regions
        carry = self._carry_vars(op, inits)
        uid = self.pipeline_uid(op)
        self.load_lambda(f"hk_load{uid}", lreg)
        self.compute_lambda(f"hk_compute{uid}", creg, carry)
        self.line(f"hk::pipeline<{self.pipeline_template_args(op)}>({self.name(n)}, hk_load{uid}, hk_compute{uid});")

    @staticmethod
    def pipeline_uid(op: Op) -> int:
        return op.results[0].id if op.results else id(op) % 100000

    def load_lambda(self, name: str, lreg: Region, extra_params: str = "") -> None:
        """`auto name = [&](int i, int s<extra>) { load region };` (no barriers inside: the schedule's)."""
        li, ls = (self.name(a) for a in lreg.args[:2])
        self.line(f"auto {name} = [&](int {li}, int {ls}{extra_params}) {{")
        self.indent += 1
        self.region(lreg, in_pipeline_load=True)
        self.indent -= 1
        self.line("};")

    def compute_lambda(self, name: str, creg: Region, carry: list[str]) -> None:
        ci, cs = (self.name(a) for a in creg.args[:2])
        self.line(f"auto {name} = [&](int {ci}, int {cs}) {{")
        self.indent += 1
        self._bind_args(creg.args[2:], carry)
        self.compute_region(creg)
        self._yield(creg, carry)
        self.indent -= 1
        self.line("};")

    def compute_region(self, creg: Region) -> None:
        """A pipeline's compute region, inside its lambda (a backend may order or bracket its ops)."""
        self.region(creg)


# one emitter rule per opcode of the table (`op_<opcode>`): importing this module fails if one is missing
opcodes.rules(CStyleEmitter, who="the C++ emitter (codegen/cstyle.py)")
