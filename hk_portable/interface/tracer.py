"""Tracing: kernel bodies run once with proxy values and record Ops into a Program.

Proxies (Scalar, Tile, SharedBuf, GlobalArg) overload Python operators; the ops module builds on
`emit`. Misuse that would silently compute the wrong thing is an error at trace time:
Python `if`/`while` on a traced value, and values that leak out of the loop body that made them
(which is what rebinding an outer variable inside a loop body does). Every opcode emitted is one of
the table (opcodes.py), and every traced Program is verified against it (verify.py) before it is returned.
"""
from __future__ import annotations

import contextvars
from typing import Any

from . import dtypes as D
from . import opcodes
from .errors import TraceError
from .ir import GlobalType, Op, Param, Program, Region, ScalarType, SharedBufType, TileType, Value
from .verify import verify

_BUILDER: contextvars.ContextVar["Builder | None"] = contextvars.ContextVar("hk_builder", default=None)


class Builder:
    def __init__(self):
        self.next_id = 0
        self.body = Region("body")
        self.region = self.body
        self.cse: dict[tuple, Value] = {}

    def new_value(self, type) -> Value:
        v = Value(self.next_id, type, self.region)
        self.next_id += 1
        return v

    def emit(self, opcode: str, operands=(), result_types=(), attrs=None, regions=()) -> Op:
        if opcode not in opcodes.TABLE:
            raise TraceError(f"unknown opcode '{opcode}': hk_portable/interface/opcodes.py lists the opcodes")
        operands = tuple(operands)
        for v in operands:
            if not v.region.encloses(self.region):
                raise TraceError(
                    f"value %{v.id} ({v.type}) was made inside a loop or pipeline body ('{v.region.name}') and "
                    f"is used outside it by '{opcode}'. A loop body must return its new values as the carry "
                    f"(hk.fori_loop(lo, hi, body, carry) / hk.pipeline(..., carry=...)), not rebind or "
                    f"append to variables outside the loop.")
        op = Op(opcode, operands, tuple(self.new_value(t) for t in result_types), dict(attrs or {}), tuple(regions))
        self.region.ops.append(op)
        return op

    def push(self, name: str, arg_types) -> Region:
        reg = Region(name, parent=self.region)
        self.region = reg
        reg.args = [self.new_value(t) for t in arg_types]
        return reg

    def pop(self, reg: Region) -> None:
        assert self.region is reg
        self.region = reg.parent


def builder() -> Builder:
    b = _BUILDER.get()
    if b is None:
        raise TraceError("hk operations can only be used inside an @hk.kernel body while it is traced")
    return b


def emit(opcode: str, operands=(), result_types=(), attrs=None, regions=()) -> Op:
    return builder().emit(opcode, [unwrap(o) for o in operands], result_types, attrs, regions)


def emit1(opcode: str, operands, result_type, attrs=None):
    return wrap(emit(opcode, operands, [result_type], attrs).result)


def unwrap(x) -> Value:
    if isinstance(x, Value):
        return x
    if isinstance(x, Proxy):
        return x.value
    raise TypeError(f"expected a traced value, got {x!r}")


def wrap(v: Value):
    t = v.type
    if isinstance(t, ScalarType):
        return Scalar(v)
    if isinstance(t, TileType):
        return Tile(v)
    if isinstance(t, SharedBufType):
        return SharedBuf(v)
    if isinstance(t, GlobalType):
        return GlobalArg(v)
    raise AssertionError(t)


# ------------------------------------------------------------------------------------------- proxies
class Proxy:
    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value

    @property
    def type(self):
        return self.value.type

    def __bool__(self):
        raise TraceError(
            f"Python control flow (if/while/and/or/not) on a traced value ({self.type}) is not allowed: "
            "its value is only known when the kernel runs. Use hk.where(mask, a, b) or a mask "
            "(hk.causal_mask, hk.bounds_mask) for data-dependent choices, hk.fori_loop for data-dependent "
            "trip counts, or make the value an hk.const to specialise on it.")

    def __iter__(self):
        raise TraceError(f"a traced value ({self.type}) cannot be iterated in Python; use hk.fori_loop")

    def __index__(self):
        raise TraceError(f"a traced value ({self.type}) cannot be used as a Python int (range, indexing); "
                         "use hk.fori_loop for runtime trip counts or make it an hk.const")

    __int__ = __index__

    def __float__(self):
        raise TraceError(f"a traced value ({self.type}) cannot be used as a Python float")

    def __hash__(self):
        return id(self)


def const_scalar(x, dtype=None) -> "Scalar":
    if isinstance(x, bool):
        raise TypeError("bool is not a scalar type of the interface; use an int")
    if dtype is None:
        dtype = D.i32 if isinstance(x, int) else D.f32
    if dtype is D.i32 and not -2**31 <= int(x) < 2**31:
        raise ValueError(f"integer constant {x} does not fit in int32")
    b = builder()
    val = int(x) if dtype is D.i32 else float(x)
    key = ("const", dtype.name, repr(val), id(b.region))
    if key not in b.cse:
        b.cse[key] = b.emit("scalar_const", (), [ScalarType(dtype)], {"value": val}).result
    return Scalar(b.cse[key])


def as_scalar(x, like: "Scalar | None" = None) -> "Scalar":
    if isinstance(x, Scalar):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        if like is not None and like.dtype is D.f32:
            return const_scalar(float(x), D.f32)
        return const_scalar(x)
    raise TypeError(f"expected an int/float scalar or a traced scalar, got {x!r}")


class Scalar(Proxy):
    """A traced i32 or f32 scalar (block indices, loop counters, shapes, runtime float arguments)."""
    __slots__ = ()

    @property
    def dtype(self):
        return self.type.dtype

    def _bin(self, other, op, swap=False):
        if isinstance(other, Tile):
            return NotImplemented
        o = as_scalar(other, like=self)
        a, b = (o, self) if swap else (self, o)
        if a.dtype is not b.dtype:
            # int op float promotes to f32 (as Python would)
            a, b = (a if a.dtype is D.f32 else a.to(D.f32)), (b if b.dtype is D.f32 else b.to(D.f32))
        if op in ("floordiv", "mod") and a.dtype is not D.i32:
            raise TypeError(f"scalar '{op}' needs int32 operands, got {a.dtype}")
        if op == "div" and a.dtype is D.i32:
            a, b = a.to(D.f32), b.to(D.f32)
        return emit1("scalar_binary", (a, b), ScalarType(a.dtype), {"op": op})

    __add__ = lambda s, o: s._bin(o, "add")
    __radd__ = lambda s, o: s._bin(o, "add", True)
    __sub__ = lambda s, o: s._bin(o, "sub")
    __rsub__ = lambda s, o: s._bin(o, "sub", True)
    __mul__ = lambda s, o: s._bin(o, "mul")
    __rmul__ = lambda s, o: s._bin(o, "mul", True)
    __floordiv__ = lambda s, o: s._bin(o, "floordiv")
    __rfloordiv__ = lambda s, o: s._bin(o, "floordiv", True)
    __mod__ = lambda s, o: s._bin(o, "mod")
    __rmod__ = lambda s, o: s._bin(o, "mod", True)
    __truediv__ = lambda s, o: s._bin(o, "div")
    __rtruediv__ = lambda s, o: s._bin(o, "div", True)

    def __neg__(self):
        return as_scalar(0, like=self) - self

    def _no_compare(self, other):
        raise TraceError("comparing traced scalars would need Python control flow on a runtime value; use "
                         "hk.min/hk.max for bounds, or masks and hk.where on tiles")

    __lt__ = __le__ = __gt__ = __ge__ = _no_compare

    def to(self, dtype) -> "Scalar":
        dtype = D.as_dtype(dtype)
        if dtype not in (D.i32, D.f32):
            raise TypeError(f"scalars are i32 or f32, not {dtype}")
        if dtype is self.dtype:
            return self
        return emit1("scalar_cast", (self,), ScalarType(dtype), {"dtype": dtype.name})

    def __repr__(self):
        return f"Scalar(%{self.value.id}: {self.type})"


class _Broadcast:
    """`v[:, None]` (axis='row': v runs along the rows) or `v[None, :]` (axis='col')."""

    def __init__(self, vec: "Tile", axis: str):
        self.vec, self.axis = vec, axis


class Tile(Proxy):
    """A traced RT, RV or ST value. Arithmetic on RT/RV is elementwise; see hk_portable.interface.ops."""
    __slots__ = ()

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def shape(self):
        return self.type.shape

    @property
    def space(self):
        return self.type.space

    def __getitem__(self, key):
        if self.space == "rv":
            if key == (slice(None), None):
                return _Broadcast(self, "row")
            if key == (None, slice(None)):
                return _Broadcast(self, "col")
        raise TypeError("only v[:, None] (broadcast along the rows of a tile) and v[None, :] (along its columns) "
                        f"index a register vector; got {key!r} on {self.type}")

    def _op(self, other, op, swap=False):
        from . import ops
        return ops.binary(op, other, self) if swap else ops.binary(op, self, other)

    __add__ = lambda s, o: s._op(o, "add")
    __radd__ = lambda s, o: s._op(o, "add", True)
    __sub__ = lambda s, o: s._op(o, "sub")
    __rsub__ = lambda s, o: s._op(o, "sub", True)
    __mul__ = lambda s, o: s._op(o, "mul")
    __rmul__ = lambda s, o: s._op(o, "mul", True)
    __truediv__ = lambda s, o: s._op(o, "div")
    __rtruediv__ = lambda s, o: s._op(o, "div", True)
    __lt__ = lambda s, o: s._op(o, "lt")
    __le__ = lambda s, o: s._op(o, "le")
    __gt__ = lambda s, o: s._op(o, "gt")
    __ge__ = lambda s, o: s._op(o, "ge")
    __and__ = lambda s, o: s._op(o, "and")
    __or__ = lambda s, o: s._op(o, "or")

    def __eq__(self, o):  # noqa: D105 - elementwise, like torch
        return self._op(o, "eq")

    def __ne__(self, o):
        return self._op(o, "ne")

    __hash__ = Proxy.__hash__

    def __neg__(self):
        from . import ops
        return ops.neg(self)

    def __abs__(self):
        from . import ops
        return ops.abs(self)

    def __invert__(self):
        from . import ops
        return ops.logical_not(self)

    def to(self, dtype) -> "Tile":
        from . import ops
        return ops.cast(self, dtype)

    def __repr__(self):
        return f"Tile(%{self.value.id}: {self.type})"


class SharedBuf(Proxy):
    """A shared allocation; `buf[s]` is the ST view of stage s (s may be traced)."""
    __slots__ = ()

    @property
    def stages(self) -> int:
        return self.type.stages

    def __getitem__(self, s) -> Tile:
        if isinstance(s, int) and not 0 <= s < self.stages:
            raise IndexError(f"stage {s} out of range for a shared buffer with {self.stages} stage(s)")
        t = self.type
        return emit1("shared_stage", (self, as_scalar(s)), TileType("st", t.dtype, t.shape))

    def __repr__(self):
        return f"SharedBuf(%{self.value.id}: {self.type})"


class GlobalArg(Proxy):
    """A tensor argument. `.shape[i]` is a runtime i32 scalar; `.dtype` and `.rank` are static."""
    __slots__ = ()

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    @property
    def shape(self) -> "_Shape":
        return _Shape(self)

    def dim(self, i: int) -> Scalar:
        if not -self.rank <= i < self.rank:
            raise IndexError(f"dimension {i} out of range for a rank-{self.rank} tensor")
        i %= self.rank
        b = builder()
        key = ("dim", self.value.id, i)
        if key not in b.cse:
            # shapes are defined at the top level so they may be used anywhere
            saved, b.region = b.region, b.body
            try:
                b.cse[key] = b.emit("global_dim", (self.value,), [ScalarType(D.i32)], {"index": i}).result
            finally:
                b.region = saved
        return Scalar(b.cse[key])

    def __repr__(self):
        return f"GlobalArg(%{self.value.id}: {self.type})"


class _Shape:
    """`gl.shape`: indexing emits only the dimensions a kernel reads."""

    def __init__(self, gl: GlobalArg):
        self.gl = gl

    def __len__(self) -> int:
        return self.gl.rank

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self.gl.dim(k) for k in range(self.gl.rank)[i])
        return self.gl.dim(i)

    def __iter__(self):
        return (self.gl.dim(k) for k in range(self.gl.rank))


# ---------------------------------------------------------------------------------------- top level
def trace(fn, name: str, params: list[tuple[str, Any]], consts: dict[str, Any], num_warps: int) -> Program:
    """Run `fn` with proxies for `params` (name, IR type) and plain values for `consts`."""
    b = Builder()
    token = _BUILDER.set(b)
    try:
        b.body.args = [b.new_value(t) for _, t in params]
        proxies = {n: wrap(v) for (n, _), v in zip(params, b.body.args)}
        result = fn(**proxies, **consts)
        if result is not None:
            raise TraceError(f"kernel '{name}' returned {result!r}; kernels write their outputs with hk.store "
                             "and return nothing")
    finally:
        _BUILDER.reset(token)
    program = Program(name, [Param(n, t) for n, t in params], b.body, dict(consts), num_warps)
    verify(program)
    return program
