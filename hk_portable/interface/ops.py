"""The tile operations kernels are written with. Each function checks its operands and emits one or a
few IR ops; the opcodes, their operands and rules are the table in hk_portable.interface.opcodes, and
their semantics are defined by the reference backend (backends/reference/interpreter.py)."""
from __future__ import annotations

import builtins
import inspect
from typing import Callable, Sequence

from . import dtypes as D
from . import opcodes
from .errors import TraceError
from .ir import ScalarType, SharedBufType, TileType
from .tracer import (GlobalArg, Scalar, SharedBuf, Tile, _Broadcast, as_scalar, builder, emit, emit1,
                     unwrap, wrap)

UNARY = opcodes.UNARY
BINARY_ARITH = opcodes.BINARY_ARITH
BINARY_CMP = opcodes.COMPARE
BINARY_LOGIC = opcodes.BINARY_LOGIC
REDUCE = opcodes.REDUCE


# --------------------------------------------------------------------------------------- helpers
def _tile(x, what: str, spaces=("rt", "rv")) -> Tile:
    if isinstance(x, SharedBuf) and "st" in spaces:
        if x.stages != 1:
            raise TypeError(f"{what}: a shared buffer with {x.stages} stages needs a stage index, buf[s]")
        return x[0]
    if not isinstance(x, Tile) or x.space not in spaces:
        got = x.type if isinstance(x, (Tile, Scalar, SharedBuf, GlobalArg)) else repr(x)
        raise TypeError(f"{what}: expected a {'/'.join(s.upper() for s in spaces)} tile, got {got}")
    return x


def _shape_tuple(t: TileType) -> str:
    return f"{t.space.upper()}[{t.dtype}, {', '.join(map(str, t.shape))}]"


def _full(ttype: TileType, value) -> Tile:
    """A constant tile (python number) or a splat of a traced scalar."""
    if isinstance(value, Scalar):
        s = value
        if ttype.dtype.is_float and s.dtype is not D.f32:
            s = s.to(D.f32)
        return emit1("splat", (s,), ttype)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"fill value must be a number or a traced scalar, got {value!r}")
    v = float(value) if ttype.dtype.is_float else int(value)
    b = builder()
    key = ("fill", str(ttype), repr(v), id(b.region))
    if key not in b.cse:
        b.cse[key] = b.emit("fill", (), [ttype], {"value": v}).result
    return wrap(b.cse[key])


def _coerce_pair(a, b, op: str) -> tuple[Tile, Tile]:
    """Bring two operands of a binary op to one tile type: scalars splat, v[:, None] broadcasts."""
    tiles = [x for x in (a, b) if isinstance(x, Tile)]
    if not tiles:
        raise TypeError(f"'{op}' needs at least one tile operand")
    ref = tiles[0].type
    if ref.space == "st":
        raise TypeError(f"'{op}': shared tiles (ST) are memory; load them into registers first "
                        "(hk.load(RT[...], st))")

    def conv(x) -> Tile:
        if isinstance(x, Tile):
            return x
        if isinstance(x, _Broadcast):
            if ref.space != "rt":
                raise TypeError(f"'{op}': v[:, None] / v[None, :] broadcast against an RT, not {ref}")
            n = ref.rows if x.axis == "row" else ref.cols
            if x.vec.shape[0] != n:
                raise TypeError(f"'{op}': a {x.axis} vector of length {x.vec.shape[0]} cannot broadcast over "
                                f"{_shape_tuple(ref)} ({'rows' if x.axis == 'row' else 'cols'} = {n})")
            if x.vec.dtype is not ref.dtype:
                raise TypeError(f"'{op}': vector dtype {x.vec.dtype} differs from tile dtype {ref.dtype}; "
                                "cast one with .to(dtype)")
            return emit1("broadcast", (x.vec,), ref, {"axis": x.axis})
        if isinstance(x, (int, float, Scalar)) and not isinstance(x, bool):
            return _full(ref, x)
        raise TypeError(f"'{op}': cannot combine {ref} with {x!r}")

    ta, tb = conv(a), conv(b)
    if ta.type != tb.type:
        raise TypeError(f"'{op}': operand types differ: {ta.type} vs {tb.type}. Binary ops take tiles of one "
                        "shape and dtype; use .to(dtype) to cast, v[:, None]/v[None, :] to broadcast a vector")
    return ta, tb


# ------------------------------------------------------------------------------------------ control
def block_idx(axis: int) -> Scalar:
    """This block's index along grid axis 0, 1 or 2."""
    if axis not in (0, 1, 2):
        raise ValueError(f"block_idx(axis): axis must be 0, 1 or 2, got {axis!r}")
    return emit1("block_idx", (), ScalarType(D.i32), {"axis": axis})


def num_blocks(axis: int) -> Scalar:
    if axis not in (0, 1, 2):
        raise ValueError(f"num_blocks(axis): axis must be 0, 1 or 2, got {axis!r}")
    return emit1("num_blocks", (), ScalarType(D.i32), {"axis": axis})


def cdiv(a, b):
    """Ceiling division: works on Python ints and traced i32 scalars."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return (a + b - 1) // b


def min(a, b):
    if not isinstance(a, Scalar) and not isinstance(b, Scalar):
        return builtins.min(a, b)
    a, b = (as_scalar(a, b if isinstance(b, Scalar) else None), as_scalar(b, a if isinstance(a, Scalar) else None))
    return a._bin(b, "min")


def max(a, b):
    if not isinstance(a, Scalar) and not isinstance(b, Scalar):
        return builtins.max(a, b)
    a, b = (as_scalar(a, b if isinstance(b, Scalar) else None), as_scalar(b, a if isinstance(a, Scalar) else None))
    return a._bin(b, "max")


def _carry_list(carry) -> tuple[list, bool]:
    if isinstance(carry, (tuple, list)):
        return list(carry), True
    return [carry], False


def _check_carry(init: list, new, where: str) -> list:
    new_list, _ = _carry_list(new) if new is not None else ([], True)
    if len(new_list) != len(init):
        raise TraceError(f"{where} body returned {len(new_list)} value(s) but the carry has {len(init)}; return "
                         "the new carry (same structure as the initial one)")
    out = []
    for k, (a, b) in enumerate(zip(init, new_list)):
        if isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(a, Scalar):
            b = as_scalar(b, like=a)
        if not isinstance(b, (Tile, Scalar)):
            raise TraceError(f"{where} body returned {b!r} as carry element {k}; expected a traced value")
        if b.type != a.type:
            raise TraceError(f"{where} carry element {k} changed type from {a.type} to {b.type}; cast it back "
                             "(.to(dtype)) so every iteration carries the same types")
        out.append(b)
    return out


def _check_init(init: list, where: str) -> list:
    out = []
    for k, c in enumerate(init):
        if isinstance(c, (int, float)) and not isinstance(c, bool):
            c = as_scalar(c)
        if not isinstance(c, (Tile, Scalar)) or (isinstance(c, Tile) and c.space == "st"):
            raise TraceError(f"{where}: carry element {k} must be an RT, RV or scalar, got {c!r}")
        out.append(c)
    return out


def _check_arity(fn, n: int, what: str, form: str) -> None:
    """TraceError naming the callback when it cannot take n positional arguments (a body with the wrong
    arity would otherwise fail as a TypeError about a lambda)."""
    if not callable(fn):
        raise TraceError(f"{what} must be a function called as {form}, got {fn!r}")
    try:
        inspect.signature(fn).bind(*[None] * n)
    except TypeError:
        raise TraceError(f"{what} is called as {form}, here with {n} argument(s), but its signature is "
                         f"{getattr(fn, '__name__', fn)}{inspect.signature(fn)}") from None
    except ValueError:      # no signature to inspect (a builtin): the call itself will tell
        pass


def fori_loop(start, stop, body: Callable, carry=()):
    """for i in range(start, stop): carry = body(i, *carry); returns the final carry.

    Loop-carried state is explicit: the body must return the new carry. Rebinding an outer variable
    inside the body is caught (a value made in the body may not be used after the loop)."""
    init, is_seq = _carry_list(carry)
    init = _check_init(init, "fori_loop")
    start, stop = as_scalar(start), as_scalar(stop)
    if start.dtype is not D.i32 or stop.dtype is not D.i32:
        raise TypeError("fori_loop bounds must be int32")
    _check_arity(body, 1 + len(init), "fori_loop body", "body(i, *carry)")
    b = builder()
    reg = b.push("body", [ScalarType(D.i32)] + [c.type for c in init])
    try:
        new = body(wrap(reg.args[0]), *[wrap(a) for a in reg.args[1:]])
        reg.yields = [unwrap(v) for v in _check_carry(init, new, "fori_loop")]
    finally:
        b.pop(reg)
    op = b.emit("for", [start.value, stop.value] + [c.value for c in init], [c.type for c in init], regions=(reg,))
    outs = [wrap(v) for v in op.results]
    return tuple(outs) if is_seq else outs[0]


def range(*args):
    """A compile-time (unrolled) range: bounds must be Python ints or hk.const values.
    For runtime trip counts use hk.fori_loop, which makes loop-carried values explicit."""
    for a in args:
        if isinstance(a, Scalar):
            raise TraceError("hk.range needs compile-time bounds (ints / hk.const); the bound here is a runtime "
                             "value: use hk.fori_loop(start, stop, body, carry) instead")
    return builtins.range(*args)


def pipeline(n, load: Callable, compute: Callable, carry=(), stages: int = 2):
    """Run `n` iterations of load(i, s) then compute(i, s, *carry) -> new carry, with s = i % stages.

    load may only write shared buffers through `buf[s]` (buffers with exactly `stages` stages) and
    never global memory (the verifier's rule for a pipeline's load region, checked when tracing ends);
    compute reads stage s. Backends may overlap load(i+k) with compute(i) (cp.async rings, TMA +
    wgmma, AMD ping-pong); results never depend on the schedule beyond the ops' stated tolerance."""
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"pipeline(stages=...) must be a positive int, got {stages!r}")
    init, is_seq = _carry_list(carry)
    init = _check_init(init, "pipeline")
    n = as_scalar(n)
    b = builder()
    i32 = ScalarType(D.i32)
    _check_arity(load, 2, "pipeline load", "load(i, s)")
    _check_arity(compute, 2 + len(init), "pipeline compute", "compute(i, s, *carry)")
    lreg = b.push("load", [i32, i32])
    try:
        load(wrap(lreg.args[0]), wrap(lreg.args[1]))
    finally:
        b.pop(lreg)
    creg = b.push("compute", [i32, i32] + [c.type for c in init])
    try:
        new = compute(wrap(creg.args[0]), wrap(creg.args[1]), *[wrap(a) for a in creg.args[2:]])
        creg.yields = [unwrap(v) for v in _check_carry(init, new, "pipeline compute")]
    finally:
        b.pop(creg)
    op = b.emit("pipeline", [n.value] + [c.value for c in init], [c.type for c in init],
                {"stages": stages}, regions=(lreg, creg))
    outs = [wrap(v) for v in op.results]
    return tuple(outs) if is_seq else outs[0]


# ------------------------------------------------------------------------------------------- memory
def shared(ttype: TileType, stages: int = 1) -> SharedBuf:
    """Allocate a shared-memory tile ST[dtype, R, C], multi-buffered with `stages` copies."""
    if not isinstance(ttype, TileType) or ttype.space != "st":
        raise TypeError(f"hk.shared takes ST[dtype, R, C], got {ttype!r}")
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"hk.shared(stages=...) must be a positive int, got {stages!r}")
    b = builder()
    if b.region is not b.body:
        raise TraceError("hk.shared must be called at the top level of the kernel, not inside a loop")
    return wrap(b.emit("alloc_shared", (), [SharedBufType(ttype.dtype, ttype.shape, stages)]).result)


def _index(gl: GlobalArg, idx, ndim: int, what: str) -> list[Scalar]:
    if not isinstance(idx, (tuple, list)):
        idx = (idx,)
    if len(idx) != gl.rank:
        raise TypeError(f"{what}: index {tuple(idx)!r} has {len(idx)} entries but the tensor has rank {gl.rank}; "
                        f"give one entry per dimension (leading dims in elements, the last {ndim} in tiles)")
    if gl.rank < ndim:
        raise TypeError(f"{what}: a rank-{gl.rank} tensor cannot hold a {ndim}-D tile")
    return _i32_entries(idx, what)


def _i32_entries(idx, what: str) -> list[Scalar]:
    """An index's entries as i32 scalars (Python ints or traced i32 values); any other dtype is a TypeError."""
    out = []
    for k, x in enumerate(idx):
        s = as_scalar(x)
        if s.dtype is not D.i32:
            raise TypeError(f"{what}: index entry {k} must be int32, got {s.dtype}")
        out.append(s)
    return out


def _check_tile_fits(t: TileType, gl: GlobalArg, what: str) -> None:
    ndim = len(t.shape)
    if ndim > gl.rank:
        raise TypeError(f"{what}: a {ndim}-D tile needs a tensor of rank >= {ndim}, got rank {gl.rank}")


def load(dst, src, idx=(), fill: float = 0.0):
    """Move a tile. Forms:
      load(st, gl, idx)            GL -> ST (same dtype), returns None
      load(RT[...] | RV[...], gl, idx)   GL -> registers (converted to the tile dtype)
      load(RT[...], st)            ST -> RT
    `idx` has one entry per tensor dim: leading dims in elements, the tile's dims in tile units.
    Elements outside the tensor read `fill`."""
    if isinstance(dst, (Tile, SharedBuf)):
        st = _tile(dst, "load destination", ("st",))
        if not isinstance(src, GlobalArg):
            raise TypeError(f"load into a shared tile reads a tensor (GL), got {src!r}")
        if src.dtype is not st.dtype:
            raise TypeError(f"load GL -> ST copies raw elements: tensor dtype {src.dtype} must equal the shared "
                            f"tile dtype {st.dtype}")
        _check_tile_fits(st.type, src, "load")
        emit("global_to_shared", [st, src] + _index(src, idx, 2, "load"), (), {"fill": float(fill)})
        return None
    if isinstance(dst, TileType) and dst.space in ("rt", "rv"):
        if isinstance(src, GlobalArg):
            _check_tile_fits(dst, src, "load")
            index = _index(src, idx, len(dst.shape), "load")
            return emit1("global_to_register", [src] + index, dst, {"fill": float(fill)})
        st = _tile(src, "load source", ("st",))
        if dst.space != "rt" or st.shape != dst.shape or st.dtype is not dst.dtype:
            raise TypeError(f"load ST -> RT copies raw elements: it needs RT[{st.dtype}, {st.shape[0]}, "
                            f"{st.shape[1]}] (the shared tile's dtype and shape), got {dst}; cast after loading")
        return emit1("shared_to_register", (st,), dst)
    raise TypeError(f"load destination must be a shared tile or a register tile type (RT[...]/RV[...]), "
                    f"got {dst!r}")


def load_scalar(src, idx, fill: int = 0) -> Scalar:
    """One element of an int32 tensor as an i32 scalar: `src[idx]`, one index per dim, all in elements
    (a tile load's leading-dim convention). Every thread of the block reads the same element, so the
    value may be a loop bound, a tile index (cu_seqlens, a block table's page) or a mask offset. An index
    outside the tensor (negative, or >= the dim) reads `fill` and touches no memory."""
    if not isinstance(src, GlobalArg):
        raise TypeError(f"load_scalar reads a tensor argument (GL), got {src!r}")
    if src.dtype is not D.i32:
        raise TypeError(f"load_scalar reads int32 tensors, got {src.dtype}")
    if isinstance(fill, bool) or not isinstance(fill, int) or not -2**31 <= fill < 2**31:
        raise TypeError(f"load_scalar: fill must be an int in int32 range, got {fill!r}")
    if not isinstance(idx, (tuple, list)):
        idx = (idx,)
    if len(idx) != src.rank:
        raise TypeError(f"load_scalar: index {tuple(idx)!r} has {len(idx)} entries but the tensor has rank "
                        f"{src.rank}; give one entry per dimension (in elements)")
    index = _i32_entries(idx, "load_scalar")
    return emit1("global_to_scalar", [src] + index, ScalarType(D.i32), {"fill": fill})


def store(dst, src, idx=()):
    """store(gl, rt|rv|st, idx): registers or shared -> GL, converting to the tensor dtype; elements
    outside the tensor are dropped.  store(st, rt): registers -> shared (same shape and dtype)."""
    if isinstance(dst, GlobalArg):
        t = _tile(src, "store source", ("rt", "rv", "st"))
        _check_tile_fits(t.type, dst, "store")
        opcode = "shared_to_global" if t.space == "st" else "register_to_global"
        emit(opcode, [dst, t] + _index(dst, idx, len(t.shape), "store"))
        return None
    st = _tile(dst, "store destination", ("st",))
    rt = _tile(src, "store source", ("rt",))
    if rt.shape != st.shape or rt.dtype is not st.dtype:
        raise TypeError(f"store RT -> ST needs equal shape and dtype: {rt.type} vs {st.type}")
    emit("register_to_shared", (st, rt))


def atomic_add(dst, src, idx=()):
    """dst[tile at idx] += src, atomically per element (f32 tensors); out-of-bounds elements dropped."""
    if not isinstance(dst, GlobalArg) or dst.dtype is not D.f32:
        raise TypeError(f"atomic_add needs an f32 tensor destination, got {dst!r}")
    t = _tile(src, "atomic_add source", ("rt", "rv"))
    if t.dtype is not D.f32:
        raise TypeError(f"atomic_add source must be f32, got {t.dtype}")
    emit("atomic_add", [dst, t] + _index(dst, idx, len(t.shape), "atomic_add"))


# ------------------------------------------------------------------------------------------- fills
def zeros(ttype: TileType) -> Tile:
    return full(ttype, 0.0 if ttype.dtype.is_float else 0)


def full(ttype: TileType, value) -> Tile:
    if not isinstance(ttype, TileType) or ttype.space not in ("rt", "rv"):
        raise TypeError(f"fills make RT/RV tiles, got {ttype!r}")
    if ttype.dtype is D.bool_:
        raise TypeError("fill a bool mask with a comparison instead")
    return _full(ttype, value)


def neg_inf(ttype: TileType) -> Tile:
    return full(ttype, float("-inf"))


# -------------------------------------------------------------------------------------- elementwise
def _unary(op: str, x) -> Tile:
    t = _tile(x, op)
    if not t.dtype.is_float and op not in ("neg", "abs", "relu"):
        raise TypeError(f"'{op}' needs a float tile, got {t.dtype}")
    if t.dtype is D.bool_:
        raise TypeError(f"'{op}' is not defined on masks")
    return emit1("unary", (t,), t.type, {"op": op})


def _make_unary(op):
    def f(x):
        return _unary(op, x)
    f.__name__ = op
    f.__doc__ = f"Elementwise {op} of an RT/RV (computed in f32 for 16-bit floats, rounded once)."
    return f


neg, abs, exp, exp2, log, log2, sqrt, rsqrt, tanh, sigmoid, relu = (_make_unary(o) for o in UNARY)


def binary(op: str, a, b) -> Tile:
    ta, tb = _coerce_pair(a, b, op)
    t = ta.type
    if op in BINARY_LOGIC:
        if t.dtype is not D.bool_:
            raise TypeError(f"'{op}' combines masks (bool tiles), got {t.dtype}")
        return emit1("binary", (ta, tb), t, {"op": op})
    if t.dtype is D.bool_:
        raise TypeError(f"'{op}' is not defined on masks; use & | ~")
    if op in BINARY_CMP:
        return emit1("compare", (ta, tb), t.with_(dtype=D.bool_), {"op": op})
    if op not in BINARY_ARITH:
        raise ValueError(f"unknown binary op {op!r}")
    if op == "div" and not t.dtype.is_float:
        raise TypeError("'div' needs float tiles")
    return emit1("binary", (ta, tb), t, {"op": op})


def maximum(a, b) -> Tile:
    return binary("maximum", a, b)


def minimum(a, b) -> Tile:
    return binary("minimum", a, b)


def logical_not(m) -> Tile:
    t = _tile(m, "logical_not")
    if t.dtype is not D.bool_:
        raise TypeError(f"'~' needs a mask (bool tile), got {t.dtype}")
    return emit1("unary", (t,), t.type, {"op": "not"})


def where(mask, a, b) -> Tile:
    """Elementwise select: a where mask is true, else b (a/b may be numbers or traced scalars)."""
    m = _tile(mask, "where mask")
    if m.dtype is not D.bool_:
        raise TypeError(f"where(mask, a, b): mask must be a bool tile (a comparison or a mask op), got {m.dtype}")
    tiles = [x for x in (a, b) if isinstance(x, Tile)]
    if not tiles:
        raise TypeError("where(mask, a, b): at least one of a, b must be a tile")
    ta, tb = _coerce_pair(a, b, "where")
    if ta.shape != m.shape:
        raise TypeError(f"where: mask shape {m.shape} differs from value shape {ta.shape}")
    return emit1("where", (m, ta, tb), ta.type)


def cast(x, dtype) -> Tile:
    """Convert elementwise; float -> narrower float rounds to nearest even (fp8: saturating to the
    format's finite max, as AMD/NVIDIA satfinite conversions do)."""
    t = _tile(x, "cast")
    dtype = D.as_dtype(dtype)
    if dtype is D.bool_ or t.dtype is D.bool_:
        raise TypeError("masks cannot be cast; use hk.where(mask, 1.0, 0.0)")
    if dtype is t.dtype:
        return t
    return emit1("cast", (t,), t.type.with_(dtype=dtype), {"dtype": dtype.name})


# ---------------------------------------------------------------------------------------- reductions
def _reduce(op: str, axis: str, x) -> Tile:
    t = _tile(x, f"{axis}_{op}", ("rt",))
    if t.dtype is D.bool_:
        raise TypeError("reductions take numeric tiles, not masks")
    n = t.type.rows if axis == "row" else t.type.cols
    return emit1("reduce", (t,), TileType("rv", t.dtype, (n,)), {"op": op, "axis": axis})


def row_max(x): return _reduce("max", "row", x)       # noqa: E704  max over columns, one value per row
def row_min(x): return _reduce("min", "row", x)       # noqa: E704
def row_sum(x): return _reduce("sum", "row", x)       # noqa: E704
def col_max(x): return _reduce("max", "col", x)       # noqa: E704  max over rows, one value per column
def col_min(x): return _reduce("min", "col", x)       # noqa: E704
def col_sum(x): return _reduce("sum", "col", x)       # noqa: E704


# ------------------------------------------------------------------------------------------------ mma
def mma(a, b, acc, *, trans_a: bool = False, trans_b: bool = False) -> Tile:
    """acc + op(a) @ op(b) with f32 accumulation; op(x) = x or xᵀ. a, b: RT or ST, both bf16, both f16,
    or both fp8 (e4m3 and e5m2 mix). Products are exact on every target and summed in f32 (sm_90a's fp8
    tensor cores keep about 14 bits: tolerances.FP8_SUM); how a target
    gets there for fp8 (natively, by an exact format mapping, or by exact widening) is its backend's
    table (docs/fp8.md)."""
    ta = _tile(a, "mma a", ("rt", "st"))
    tb = _tile(b, "mma b", ("rt", "st"))
    tc = _tile(acc, "mma acc", ("rt",))
    (ar, ac), (br, bc) = ta.shape, tb.shape
    m, k = (ac, ar) if trans_a else (ar, ac)
    k2, n = (bc, br) if trans_b else (br, bc)
    if k != k2:
        raise TypeError(f"mma: inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}")
    if tc.shape != (m, n) or tc.dtype is not D.f32:
        raise TypeError(f"mma: accumulator must be RT[f32, {m}, {n}], got {tc.type}")
    both_fp8 = ta.dtype in D.MMA_FP8_INPUTS and tb.dtype in D.MMA_FP8_INPUTS
    if not both_fp8 and (ta.dtype not in D.MMA_INPUTS or tb.dtype is not ta.dtype):
        raise TypeError(f"mma: a and b must both be bf16, both f16 or both fp8 (e4m3/e5m2), got {ta.dtype} "
                        f"and {tb.dtype}")
    return emit1("mma", (ta, tb, tc), tc.type, {"trans_a": trans_a, "trans_b": trans_b})


def mma_AB(a, b, acc):   return mma(a, b, acc)                                  # noqa: E704
def mma_ABt(a, b, acc):  return mma(a, b, acc, trans_b=True)                    # noqa: E704
def mma_AtB(a, b, acc):  return mma(a, b, acc, trans_a=True)                    # noqa: E704
def mma_AtBt(a, b, acc): return mma(a, b, acc, trans_a=True, trans_b=True)      # noqa: E704


# ---------------------------------------------------------------------------------------------- masks
def _mask_type(ttype) -> TileType:
    if isinstance(ttype, Tile):
        ttype = ttype.type
    if not isinstance(ttype, TileType) or ttype.space != "rt":
        raise TypeError(f"masks are made for an RT shape: pass RT[...] or an RT tile, got {ttype!r}")
    return ttype.with_(dtype=D.bool_)


def _i32(x, what: str) -> Scalar:
    s = as_scalar(x)
    if s.dtype is not D.i32:
        raise TypeError(f"{what} must be int32, got {s.dtype}")
    return s


def causal_mask(like, row_offset=0, col_offset=0) -> Tile:
    """True where (row_offset + r) >= (col_offset + c): the keep-mask of causal attention."""
    return emit1("causal_mask", (_i32(row_offset, "row_offset"), _i32(col_offset, "col_offset")),
                 _mask_type(like))


def bounds_mask(like, row_offset, col_offset, n_rows, n_cols) -> Tile:
    """True where 0 <= row_offset + r < n_rows and 0 <= col_offset + c < n_cols."""
    ops_ = [_i32(row_offset, "row_offset"), _i32(col_offset, "col_offset"),
            _i32(n_rows, "n_rows"), _i32(n_cols, "n_cols")]
    return emit1("bounds_mask", ops_, _mask_type(like))


def dropout_mask(like, p, seed, offset, row_offset, col_offset, row_stride) -> Tile:
    """Keep-mask of dropout with probability p, from Philox4x32-10, identical on every backend.

    Element (r, c) has the 64-bit index g = offset + (row_offset + r) * row_stride + (col_offset + c);
    one call serves the four indices 4q..4q+3 (q = g div 4): x = philox4x32_10(counter=(lo32(q), hi32(q), 0, 0),
    key=(lo32(seed), hi32(seed)))[g mod 4]; keep iff (x >> 8) >= floor(p * 2**24) (docs/numerics.md).
    seed, offset are Python ints (compile-time, 64-bit) or int32 runtime scalars; p is a float (compile-time)
    or an f32 runtime scalar."""
    t = _mask_type(like)
    pv = as_scalar(p, like=as_scalar(0.0)) if not isinstance(p, Scalar) else p
    if pv.dtype is not D.f32:
        pv = pv.to(D.f32)
    seed_lo, seed_hi = _split64(seed, "seed")
    off_lo, off_hi = _split64(offset, "offset")
    operands = [pv, seed_lo, seed_hi, off_lo, off_hi, _i32(row_offset, "row_offset"),
                _i32(col_offset, "col_offset"), _i32(row_stride, "row_stride")]
    return emit1("dropout_mask", operands, t)


def _split64(x, what: str) -> tuple[Scalar, Scalar]:
    """A 64-bit value as two i32 words (lo, hi): a Python int, an int32 runtime scalar (hi = 0), or a
    (lo, hi) pair of int32 runtime scalars holding the two words' bit patterns."""
    if isinstance(x, Scalar):
        return _i32(x, what), as_scalar(0)
    if isinstance(x, tuple) and len(x) == 2:
        return _i32(x[0], what + " (low word)"), _i32(x[1], what + " (high word)")
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**64:
        raise TypeError(f"{what} must be an int in [0, 2**64) or an int32 runtime scalar, got {x!r}")
    lo, hi = x & 0xFFFFFFFF, x >> 32
    to_i32 = lambda w: w - 2**32 if w >= 2**31 else w  # noqa: E731 - the same bits as int32
    return as_scalar(to_i32(lo)), as_scalar(to_i32(hi))
