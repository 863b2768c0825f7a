"""verify(program): check every op of a Program against the opcode table (opcodes.py).

Generic checks come from each op's table entry: the opcode exists; operand count and types; result
count and types; attribute names, types and values; where the op may appear; regions, their
arguments and what they yield (`for`/`pipeline` regions yield the carry's types); every value used
where it is visible (defined earlier in the same region or an enclosing one, exactly once).
What the entry cannot say as data (a result type that follows from the operands, shapes that must
agree) is the opcode's rule below, registered with @rule: every opcode of the table has one.

The tracer runs verify at the end of every trace and the launch path before a backend's check, so a
backend may rely on every Program it sees being well formed.
"""
from __future__ import annotations

from typing import Callable

from . import dtypes as D
from .errors import TraceError
from .ir import GlobalType, Op, Program, Region, SharedBufType, TileType, Value, op_text
from .opcodes import NOT_IN_PIPELINE_LOAD, TABLE, TOP_LEVEL, OpSpec, RegionSpec


class VerifyError(TraceError):
    """A Program breaks a rule of the opcode table; the message names the op and the rule."""


RULES: dict[str, Callable[["_Verifier", Op], None]] = {}


def rule(*opcodes: str):
    """Register the opcode-specific checks of `opcodes` (beyond what their table entries say)."""
    def register(fn):
        for o in opcodes:
            assert o not in RULES, f"two verifier rules for {o!r}"
            RULES[o] = fn
        return fn
    return register


def verify(program: Program) -> None:
    """Raise VerifyError, naming the op and the rule it breaks, unless `program` is well formed."""
    _Verifier(program).run()


# ------------------------------------------------------------------------------------------ the walk
class _Verifier:
    def __init__(self, program: Program):
        self.p = program
        self.scopes: list[set[Value]] = []          # the values visible here: one set per enclosing region
        self.defined: set[int] = set()              # value ids defined so far (each exactly once)
        self.producer: dict[Value, Op] = {}
        self.where: list[str] = []                  # region names from the kernel body inwards
        self.load_stage: Value | None = None        # the stage argument of the pipeline load region we are in
        self.load_stages = 0

    def run(self) -> None:
        p = self.p
        if len(p.params) != len(p.body.args):
            raise VerifyError(f"kernel '{p.name}': {len(p.params)} parameters but {len(p.body.args)} body arguments")
        for prm, a in zip(p.params, p.body.args):
            if prm.type != a.type:
                raise VerifyError(f"kernel '{p.name}': parameter {prm.name} is {prm.type} but its value %{a.id} "
                                  f"is {a.type}")
        self.region(p.body, None)

    # ---- regions
    def region(self, reg: Region, owner: Op | None) -> None:
        self.where.append(reg.name)
        self.scopes.append(set())
        for a in reg.args:
            self.define(a, owner)
        for op in reg.ops:
            self.op(op)
        for k, y in enumerate(reg.yields):
            if not self.visible(y):
                self.fail(owner, f"^{reg.name} yields %{y.id}, which is not defined before the yield in this "
                                 "region or one enclosing it")
        self.scopes.pop()
        self.where.pop()

    def define(self, v: Value, op: Op | None) -> None:
        if v.id in self.defined:
            self.fail(op, f"value %{v.id} is defined twice")
        self.defined.add(v.id)
        self.scopes[-1].add(v)
        if op is not None:
            self.producer[v] = op

    def visible(self, v: Value) -> bool:
        return any(v in s for s in self.scopes)

    # ---- one op
    def op(self, op: Op) -> None:
        spec = TABLE.get(op.opcode)
        if spec is None:
            self.fail(op, f"unknown opcode '{op.opcode}' (hk_portable/interface/opcodes.py lists them)")
        for k, v in enumerate(op.operands):
            if not self.visible(v):
                self.fail(op, f"operand {k} (%{v.id}) is not visible here: it must be defined earlier in this "
                              "region or in one enclosing it (a loop's values leave it only as its carry)")
        self.operands(op, spec)
        self.results(op, spec)
        self.attrs(op, spec)
        self.placement(op, spec)
        RULES[op.opcode](self, op)
        self.regions(op, spec)
        for r in op.results:
            self.define(r, op)

    def operands(self, op: Op, spec: OpSpec) -> None:
        n, fixed = len(op.operands), spec.fixed_operands
        if n < fixed or (n > fixed and not spec.variadic):
            want = f"at least {fixed}" if spec.variadic else f"{fixed}"
            self.fail(op, f"takes {want} operand(s) ({', '.join(map(str, spec.operands))}), got {n}")
        for k, v in enumerate(op.operands):
            o = spec.operands[min(k, len(spec.operands) - 1)]
            if not o.type.matches(v.type):
                self.fail(op, f"operand {k} ({o.name}) is {v.type}; it must be {o.type}")

    def results(self, op: Op, spec: OpSpec) -> None:
        if spec.carry_results:
            want = [v.type for v in self.inits(op, spec)]
            got = [r.type for r in op.results]
            if got != want:
                self.fail(op, f"results must be the carry's types ({_types(want)}), got ({_types(got)})")
            return
        if len(op.results) != len(spec.results):
            self.fail(op, f"makes {len(spec.results)} result(s), got {len(op.results)}")
        for k, (r, t) in enumerate(zip(op.results, spec.results)):
            if not t.matches(r.type):
                self.fail(op, f"result {k} is {r.type}; it must be {t}")

    def attrs(self, op: Op, spec: OpSpec) -> None:
        names = {a.name for a in spec.attrs}
        for extra in sorted(set(op.attrs) - names):
            self.fail(op, f"has no attribute '{extra}' (its attributes: {', '.join(sorted(names)) or 'none'})")
        for a in spec.attrs:
            if a.name not in op.attrs:
                self.fail(op, f"needs attribute '{a.name}' ({a})")
            if not a.accepts(op.attrs[a.name]):
                self.fail(op, f"attribute {a.name}={op.attrs[a.name]!r} is not allowed; it must be {a}")

    def placement(self, op: Op, spec: OpSpec) -> None:
        if spec.placement == TOP_LEVEL and len(self.where) != 1:
            self.fail(op, f"may appear only at the top level of the kernel, not in ^{self.where[-1]}")
        if self.load_stage is None:
            return
        if spec.placement == NOT_IN_PIPELINE_LOAD:
            self.fail(op, "may not appear in a pipeline's load region (it writes global memory: do that in "
                          "compute or after the pipeline)")
        if spec.effects.writes_shared:
            self.stage_write(op)

    def stage_write(self, op: Op) -> None:
        """In a pipeline's load region a shared write goes to buf[s]: s the region's stage argument and
        buf a buffer with the pipeline's number of stages (so loads may run ahead of computes)."""
        view = self.producer.get(op.operands[0])
        ok = (view is not None and view.opcode == "shared_stage" and view.operands[1] is self.load_stage
              and view.operands[0].type.stages == self.load_stages)
        if not ok:
            self.fail(op, f"in a pipeline's load region shared memory is written only as buf[s], with s the "
                          f"stage argument (%{self.load_stage.id}) and buf of exactly stages={self.load_stages}")

    def inits(self, op: Op, spec: OpSpec) -> tuple[Value, ...]:
        return op.operands[spec.fixed_operands:]

    def regions(self, op: Op, spec: OpSpec) -> None:
        names = [r.name for r in op.regions]
        want = [r.name for r in spec.regions]
        if names != want:
            self.fail(op, f"has regions ({', '.join(names)}); it must have ({', '.join(want)})")
        carry = [v.type for v in self.inits(op, spec)]
        for reg, rs in zip(op.regions, spec.regions):
            self.region_signature(op, reg, rs, carry)
            saved = self.load_stage, self.load_stages
            if op.opcode == "pipeline" and reg.name == "load":
                self.load_stage, self.load_stages = reg.args[1], op.attrs["stages"]
            try:
                self.region(reg, op)
            finally:
                self.load_stage, self.load_stages = saved

    def region_signature(self, op: Op, reg: Region, rs: RegionSpec, carry: list) -> None:
        lead = len(rs.args)
        args = [a.type for a in reg.args]
        if len(args) != lead + (len(carry) if rs.carries else 0) or not all(
                t.matches(a) for t, a in zip(rs.args, args)) or (rs.carries and args[lead:] != carry):
            want = [str(t) for t in rs.args] + ([str(t) for t in carry] if rs.carries else [])
            self.fail(op, f"^{reg.name} takes arguments ({', '.join(want)}), got ({_types(args)})")
        got = [y.type for y in reg.yields]
        if not rs.carries and got:
            self.fail(op, f"^{reg.name} yields nothing, got ({_types(got)})")
        if rs.carries and got != carry:
            self.fail(op, f"^{reg.name} must yield the carry's types ({_types(carry)}), yields ({_types(got)})")

    # ---- errors
    def fail(self, op: Op | None, why: str):
        where = "^" + "/^".join(self.where) if self.where else "the kernel"
        what = f"op '{op_text(op)}'" if op is not None else "the kernel body"
        ident = f"'{op.opcode}'" + (f" (result %{op.results[0].id})" if op is not None and op.results else "") \
            if op is not None else ""
        raise VerifyError(f"kernel '{self.p.name}': {ident + ': ' if ident else ''}{why}\n  at {what} in {where}")


def _types(ts) -> str:
    return ", ".join(map(str, ts))


# --------------------------------------------------------------------------------- opcode rules
@rule("block_idx", "num_blocks", "alloc_shared", "causal_mask", "bounds_mask", "dropout_mask", "for")
def _table_says_it_all(v: _Verifier, op: Op) -> None:
    """Operand, result, attribute and region types are the whole contract of these opcodes."""


@rule("scalar_const")
def _scalar_const(v: _Verifier, op: Op) -> None:
    x, dt = op.attrs["value"], op.result.type.dtype
    if (dt == D.i32) != isinstance(x, int):
        v.fail(op, f"value {x!r} does not match the result type {dt} (an int for i32, a float for f32)")
    if dt == D.i32 and not -2**31 <= x < 2**31:
        v.fail(op, f"value {x} does not fit in int32")


@rule("global_dim")
def _global_dim(v: _Verifier, op: Op) -> None:
    rank = op.operands[0].type.rank
    if not 0 <= op.attrs["index"] < rank:
        v.fail(op, f"index {op.attrs['index']} is out of range for a rank-{rank} tensor")


@rule("scalar_binary")
def _scalar_binary(v: _Verifier, op: Op) -> None:
    a, b = (x.type for x in op.operands)
    k = op.attrs["op"]
    _same(v, op, a, b, op.result.type)
    if k in ("floordiv", "mod") and a.dtype != D.i32:
        v.fail(op, f"'{k}' takes i32 scalars, got {a}")
    if k == "div" and a.dtype != D.f32:
        v.fail(op, f"'div' takes f32 scalars (i32 operands are converted first), got {a}")


@rule("scalar_cast")
def _scalar_cast(v: _Verifier, op: Op) -> None:
    src, dst = op.operands[0].type, op.result.type
    if dst.dtype.name != op.attrs["dtype"] or src == dst:
        v.fail(op, f"converts {src} to {op.attrs['dtype']}: the result must be {op.attrs['dtype']} and differ "
                   f"from the operand, got {dst}")


@rule("shared_stage")
def _shared_stage(v: _Verifier, op: Op) -> None:
    buf: SharedBufType = op.operands[0].type
    _expect(v, op, op.result.type, TileType("st", buf.dtype, buf.shape), "a stage view of the buffer")


def _index_count(v: _Verifier, op: Op, gl: GlobalType, index, tile: TileType | None) -> None:
    if len(index) != gl.rank:
        v.fail(op, f"needs one index per dimension of the rank-{gl.rank} tensor, got {len(index)}")
    if tile is not None and len(tile.shape) > gl.rank:
        v.fail(op, f"a {len(tile.shape)}-D tile does not fit a rank-{gl.rank} tensor")


@rule("global_to_register")
def _global_to_register(v: _Verifier, op: Op) -> None:
    gl, *index = op.operands
    _index_count(v, op, gl.type, index, op.result.type)


@rule("global_to_scalar")
def _global_to_scalar(v: _Verifier, op: Op) -> None:
    gl, *index = op.operands
    _index_count(v, op, gl.type, index, None)
    if not -2**31 <= op.attrs["fill"] < 2**31:
        v.fail(op, f"fill {op.attrs['fill']} does not fit in int32")


@rule("global_to_shared")
def _global_to_shared(v: _Verifier, op: Op) -> None:
    st, gl, *index = op.operands
    _index_count(v, op, gl.type, index, st.type)
    if st.type.dtype != gl.type.dtype:
        v.fail(op, f"copies raw elements: the tensor's dtype {gl.type.dtype} must be the tile's {st.type.dtype}")


@rule("shared_to_register")
def _shared_to_register(v: _Verifier, op: Op) -> None:
    st = op.operands[0].type
    _expect(v, op, op.result.type, st.with_(space="rt"), "the shared tile's dtype and shape in registers")


@rule("register_to_shared")
def _register_to_shared(v: _Verifier, op: Op) -> None:
    st, rt = (x.type for x in op.operands)
    _expect(v, op, rt, st.with_(space="rt"), "a register tile of the shared tile's dtype and shape (operand 1)")


@rule("register_to_global", "shared_to_global", "atomic_add")
def _to_global(v: _Verifier, op: Op) -> None:
    gl, src, *index = op.operands
    _index_count(v, op, gl.type, index, src.type)


@rule("fill")
def _fill(v: _Verifier, op: Op) -> None:
    x, dt = op.attrs["value"], op.result.type.dtype
    if dt.is_float != isinstance(x, float):
        v.fail(op, f"value {x!r} does not match {op.result.type} (a float for float tiles, an int otherwise)")


@rule("splat")
def _splat(v: _Verifier, op: Op) -> None:
    s, t = op.operands[0].type, op.result.type
    if t.dtype.is_float and s.dtype != D.f32:
        v.fail(op, f"a float tile ({t}) is filled from an f32 scalar, got {s}")


@rule("broadcast")
def _broadcast(v: _Verifier, op: Op) -> None:
    vec, t = op.operands[0].type, op.result.type
    n = t.rows if op.attrs["axis"] == "row" else t.cols
    _expect(v, op, vec, TileType("rv", t.dtype, (n,)), f"a vector with one {t.dtype} per {op.attrs['axis']} "
                                                       "of the result")


@rule("unary")
def _unary(v: _Verifier, op: Op) -> None:
    t, k = op.operands[0].type, op.attrs["op"]
    _expect(v, op, op.result.type, t, "the operand's type")
    is_mask = t.dtype == D.bool_
    if is_mask != (k == "not"):
        v.fail(op, f"'{k}' takes {'a mask (bool tile)' if k == 'not' else 'a numeric tile'}, got {t}")
    if not is_mask and not t.dtype.is_float and k not in ("neg", "abs", "relu"):
        v.fail(op, f"'{k}' takes a float tile, got {t}")


@rule("binary")
def _binary(v: _Verifier, op: Op) -> None:
    a, b = (x.type for x in op.operands)
    k = op.attrs["op"]
    _same(v, op, a, b, op.result.type)
    if (a.dtype == D.bool_) != (k in ("and", "or")):
        v.fail(op, f"'{k}' takes {'masks (bool tiles)' if k in ('and', 'or') else 'numeric tiles'}, got {a}")
    if k == "div" and not a.dtype.is_float:
        v.fail(op, f"'div' takes float tiles, got {a}")


@rule("compare")
def _compare(v: _Verifier, op: Op) -> None:
    a, b = (x.type for x in op.operands)
    _expect(v, op, b, a, "operand 0's type (operand 1)")
    _expect(v, op, op.result.type, a.with_(dtype=D.bool_), "the operands' mask type")


@rule("where")
def _where(v: _Verifier, op: Op) -> None:
    m, a, b = (x.type for x in op.operands)
    _same(v, op, a, b, op.result.type, first=1)
    _expect(v, op, m, a.with_(dtype=D.bool_), "the values' mask type (operand 0)")


@rule("cast")
def _cast(v: _Verifier, op: Op) -> None:
    t = op.operands[0].type
    want = t.with_(dtype=D.by_name(op.attrs["dtype"]))
    if want == t:
        v.fail(op, f"casts {t} to its own dtype")
    _expect(v, op, op.result.type, want, f"the operand's space and shape in {op.attrs['dtype']}")


@rule("reduce")
def _reduce(v: _Verifier, op: Op) -> None:
    t = op.operands[0].type
    n = t.rows if op.attrs["axis"] == "row" else t.cols
    _expect(v, op, op.result.type, TileType("rv", t.dtype, (n,)), f"one {t.dtype} per {op.attrs['axis']} of x")


@rule("mma")
def _mma(v: _Verifier, op: Op) -> None:
    a, b, acc = (x.type for x in op.operands)
    (ar, ac), (br, bc) = a.shape, b.shape
    m, k = (ac, ar) if op.attrs["trans_a"] else (ar, ac)
    k2, n = (bc, br) if op.attrs["trans_b"] else (br, bc)
    fp8 = a.dtype.name.startswith("fp8") and b.dtype.name.startswith("fp8")
    if a.dtype != b.dtype and not fp8:
        v.fail(op, f"a and b must share a dtype (or both be fp8), got {a.dtype} and {b.dtype}")
    if k != k2:
        v.fail(op, f"inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}")
    if acc.shape != (m, n):
        v.fail(op, f"the accumulator must be {m}x{n}, got {acc}")
    _expect(v, op, op.result.type, acc, "the accumulator's type")


@rule("pipeline")
def _pipeline(v: _Verifier, op: Op) -> None:
    if op.attrs["stages"] < 1:
        v.fail(op, f"stages={op.attrs['stages']}; a pipeline has at least one stage")


def _expect(v: _Verifier, op: Op, got, want, what: str) -> None:
    if got != want:
        v.fail(op, f"expected {want} ({what}), got {got}")


def _same(v: _Verifier, op: Op, *types, first: int = 0) -> None:
    ref = types[0]
    for k, t in enumerate(types[1:], 1):
        if t != ref:
            role = f"operand {first + k}" if k < len(types) - 1 else "the result"
            v.fail(op, f"{role} is {t}; it must have the type of operand {first} ({ref})")
