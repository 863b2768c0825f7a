"""Op cases: every opcode of the interface x dtypes x shapes (ragged ones, multi-block grids).

Each family builds small kernels with factories (cached, so each traces once per signature) and
cases whose expected values are float64 (or int64) torch math on the same inputs.
"""
from __future__ import annotations

import functools
import operator

import torch

import hk_portable as hk
from hk_portable.interface import GL, RT, RV, ST, f32, i32
from hk_portable.interface.numerics import MASK32, dropout_keep, nan_ignoring_max, nan_ignoring_min

from .cases import (ALL_DTYPES, FLOAT_DTYPES, TORCH, Case, Check, Setup, cdiv, f64, guard_mask, padded, poisoned,
                    rand_float, rand_int, round_to)
from .tolerances import bound_for

SHAPES_2D = ((37, 70), (64, 32))         # ragged over a 2x3 grid of 32x32 tiles; aligned over 2x1
SHAPES_1D = ((37,), (1,))
BM = BN = 32
# Wide tiles (few rows, whole 16-byte chunks on every lane of a block): the shapes a backend may lay out
# as strips (the cuda layout pass does with 4 warps: warp-rows x warps-per-row 2x2, 1x4, 4x1); on a tensor
# that is ragged in both dims.
WIDE_TILES = ((2, 1024), (1, 2048), (16, 512))
WIDE_SHAPE = (37, 1100)


def _tile_tag(tile) -> str:
    return f"_t{tile[0]}x{tile[1]}" if tile != (BM, BN) else ""


def _sid(shape) -> str:
    return "x".join(map(str, shape))


def _case(family: str, name: str, dtype: str, shape, make, tol: str | None = None, **kw) -> Case:
    return Case(id=f"op/{family}/{name}/{dtype}/{_sid(shape)}", kind="op", name=tol or name, make=make, **kw)


def _values(gen, shape, dtype, lo=0.1, hi=4.0, signed=True, int_hi=50_000) -> torch.Tensor:
    """Random test values of `dtype` (ints: magnitudes 1..int_hi)."""
    if dtype == "i32":
        return rand_int(gen, shape, 1, int_hi, signed)
    return rand_float(gen, shape, dtype, lo, hi, signed)


def _expect(label, output, value, dtype: str, tol: str, **kw) -> Check:
    """A check of `output` against float64/int64 math `value`, rounded to dtype for the exact tier."""
    bound = bound_for(tol, dtype)
    expected = round_to(value, TORCH[dtype]) if bound.exact else f64(value)
    return Check(label, output, expected, bound, **kw)


def _guarded(view_shape, dtype: str, pad: int = 3) -> torch.Tensor:
    """A poisoned buffer larger than the output in every dim; the kernel gets its top-left view."""
    return poisoned(tuple(n + pad for n in view_shape), dtype)


def _view(buf: torch.Tensor, shape) -> torch.Tensor:
    return buf[tuple(slice(0, n) for n in shape)]


def _exact_with_guard(label, output, buf: torch.Tensor, view_value: torch.Tensor, dtype: str, tol: str) -> Check:
    """Exact check of a guarded buffer: the view holds round(view_value), the rest is still poison."""
    expected = buf.clone()
    _view(expected, view_value.shape).copy_(round_to(view_value, TORCH[dtype]) if view_value.dtype in
                                            (torch.float64, torch.int64) else view_value)
    bound = bound_for(tol, dtype)
    assert bound.exact, f"{tol}/{dtype} is not exact"
    return Check(f"{label} (and the guard around it)", output, expected, bound)


def _grid(shape, bm=BM, bn=BN):
    return (cdiv(shape[0], bm), cdiv(shape[1], bn)) if len(shape) == 2 else (cdiv(shape[0], bm),)


# ============================================================================================ unary
UNARY_F64 = {
    "neg": torch.neg, "abs": torch.abs, "relu": lambda x: x.clamp_min(0), "exp": torch.exp, "exp2": torch.exp2,
    "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}
UNARY_RANGE = {"exp": (0.01, 8.0, True), "exp2": (0.01, 12.0, True), "log": (0.01, 100.0, False),
               "log2": (0.01, 100.0, False), "sqrt": (0.01, 100.0, False), "rsqrt": (0.01, 100.0, False),
               "tanh": (0.01, 5.0, True), "sigmoid": (0.01, 10.0, True)}
INT_UNARY = ("neg", "abs", "relu")


@functools.cache
def _unary_kernel(op: str, space: str):
    fn = getattr(hk, op)
    if space == "rt":
        @hk.kernel(name=f"unary_{op}")
        def k(x: GL[2], y: GL[2], *, BM: hk.const = BM, BN: hk.const = BN):
            m, n = hk.block_idx(0), hk.block_idx(1)
            hk.store(y, fn(hk.load(RT[x.dtype, BM, BN], x, (m, n))), (m, n))
    else:
        @hk.kernel(name=f"unary_{op}_rv")
        def k(x: GL[1], y: GL[1], *, BM: hk.const = BM):
            m = hk.block_idx(0)
            hk.store(y, fn(hk.load(RV[x.dtype, BM], x, (m,))), (m,))
    return k


def _unary_case(op, dtype, shape, space):
    def make(gen):
        lo, hi, signed = UNARY_RANGE.get(op, (0.1, 4.0, True))
        x = _values(gen, shape, dtype, lo, hi, signed)
        expected = UNARY_F64[op](x.to(torch.int64) if dtype == "i32" else f64(x))
        kern = _unary_kernel(op, space)
        return Setup({"x": x}, {"y": poisoned(shape, dtype)},
                     lambda t, be: kern(t["x"], t["y"], grid=_grid(shape), backend=be),
                     [_expect("y", "y", expected, dtype, op)])
    return _case("unary" if space == "rt" else "unary_rv", op, dtype, shape, make, tol=op)


def unary_cases() -> list[Case]:
    out = []
    for op in UNARY_F64:
        for dtype in FLOAT_DTYPES + (("i32",) if op in INT_UNARY else ()):
            out += [_unary_case(op, dtype, s, "rt") for s in SHAPES_2D]
            out.append(_unary_case(op, dtype, SHAPES_1D[0], "rv"))
    return out


# =========================================================================================== binary
BINARY_FN = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
             "maximum": hk.maximum, "minimum": hk.minimum}
BINARY_F64 = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "maximum": torch.maximum, "minimum": torch.minimum}
BINARY_FORMS = ("tile", "scalar_right", "scalar_left", "runtime", "row", "col")
PY_CONST = {"float": 1.375, "int": 7}


def _binary_body(op, form, kind, a_gl, b_gl, y, s):
    f = BINARY_FN[op]
    m, n = hk.block_idx(0), hk.block_idx(1)
    a = hk.load(RT[a_gl.dtype, BM, BN], a_gl, (m, n))
    if form == "tile":
        r = f(a, hk.load(RT[a_gl.dtype, BM, BN], b_gl, (m, n)))
    elif form == "scalar_right":
        r = f(a, PY_CONST[kind])
    elif form == "scalar_left":
        r = f(PY_CONST[kind], a)
    elif form == "runtime":
        r = f(a, s)
    elif form == "row":                    # b is a vector of length M: b[:, None]
        r = f(a, hk.load(RV[a_gl.dtype, BM], b_gl, (m,))[:, None])
    else:                                  # b is a vector of length N: b[None, :]
        r = f(a, hk.load(RV[a_gl.dtype, BN], b_gl, (n,))[None, :])
    hk.store(y, r, (m, n))


@functools.cache
def _binary_kernel(op: str, form: str, kind: str):
    if kind == "int":
        def k(a: GL[2], b: GL, y: GL[2], s: int):
            _binary_body(op, form, kind, a, b, y, s)
    else:
        def k(a: GL[2], b: GL, y: GL[2], s: float):
            _binary_body(op, form, kind, a, b, y, s)
    return hk.kernel(k, name=f"binary_{op}_{form}")


def _binary_case(op, form, dtype, shape):
    is_int = dtype == "i32"

    def make(gen):
        a = _values(gen, shape, dtype)
        b_shape = {"row": shape[:1], "col": shape[1:]}.get(form, shape)
        b = _values(gen, b_shape, dtype, *((0.5, 4.0) if op == "div" else (0.1, 4.0)))
        s = int(rand_int(gen, (), 1, 1000)) if is_int else float(rand_float(gen, (), "f32", 0.5, 4.0))
        conv = (lambda x: x.to(torch.int64)) if is_int else f64
        const = conv(round_to(torch.tensor(float(PY_CONST["int" if is_int else "float"]), dtype=torch.float64),
                              TORCH[dtype]))
        srt = conv(round_to(torch.tensor(float(s), dtype=torch.float64), TORCH[dtype]))
        lhs, rhs = {"tile": (conv(a), conv(b)), "scalar_right": (conv(a), const), "scalar_left": (const, conv(a)),
                    "runtime": (conv(a), srt), "row": (conv(a), conv(b)[:, None]),
                    "col": (conv(a), conv(b)[None, :])}[form]
        kern = _binary_kernel(op, form, "int" if is_int else "float")
        return Setup({"a": a, "b": b}, {"y": poisoned(shape, dtype)},
                     lambda t, be: kern(t["a"], t["b"], t["y"], s, grid=_grid(shape), backend=be),
                     [_expect("y", "y", BINARY_F64[op](lhs, rhs), dtype, op)])
    return _case(f"binary_{form}", op, dtype, shape, make, tol=op)


@functools.cache
def _binary_rv_kernel(op: str):
    @hk.kernel(name=f"binary_{op}_rv")
    def k(a: GL[1], b: GL[1], y: GL[1]):
        m = hk.block_idx(0)
        va, vb = hk.load(RV[a.dtype, BM], a, (m,)), hk.load(RV[b.dtype, BM], b, (m,))
        hk.store(y, BINARY_FN[op](va, vb), (m,))
    return k


def _binary_rv_case(op, dtype, shape):
    def make(gen):
        a, b = _values(gen, shape, dtype), _values(gen, shape, dtype, *((0.5, 4.0) if op == "div" else (0.1, 4.0)))
        conv = (lambda x: x.to(torch.int64)) if dtype == "i32" else f64
        kern = _binary_rv_kernel(op)
        return Setup({"a": a, "b": b}, {"y": poisoned(shape, dtype)},
                     lambda t, be: kern(t["a"], t["b"], t["y"], grid=_grid(shape), backend=be),
                     [_expect("y", "y", BINARY_F64[op](conv(a), conv(b)), dtype, op)])
    return _case("binary_rv", op, dtype, shape, make, tol=op)


def binary_cases() -> list[Case]:
    out = []
    for op in BINARY_FN:
        for dtype in FLOAT_DTYPES + (() if op == "div" else ("i32",)):
            for form in BINARY_FORMS:
                out += [_binary_case(op, form, dtype, s) for s in SHAPES_2D]
            out.append(_binary_rv_case(op, dtype, SHAPES_1D[0]))
    return out


# ==================================================================== comparisons, logic, where
CMP_FN = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
          "ne": operator.ne}
CMP_CONST = 0.5


@functools.cache
def _select_kernel(what: str):
    """y = where(mask, a, b) with the mask made by `what` (a comparison or a logical combination)."""
    @hk.kernel(name=f"select_{what}")
    def k(a: GL[2], b: GL[2], y: GL[2]):
        m, n = hk.block_idx(0), hk.block_idx(1)
        ta, tb = hk.load(RT[a.dtype, BM, BN], a, (m, n)), hk.load(RT[b.dtype, BM, BN], b, (m, n))
        zero = 0 if a.dtype is i32 else 0.0
        mask = {"and": lambda: (ta > zero) & (tb > zero), "or": lambda: (ta > zero) | (tb > zero),
                "not": lambda: ~(ta > tb)}.get(what, None)
        if mask is not None:
            keep = mask()
        elif what.endswith("_scalar"):
            keep = CMP_FN[what[:-7]](ta, 0 if a.dtype is i32 else CMP_CONST)
        else:
            keep = CMP_FN[what](ta, tb)
        hk.store(y, hk.where(keep, ta, tb), (m, n))
    return k


def _select_expected(what, a, b, dtype):
    zero = torch.zeros((), dtype=a.dtype)
    if what == "and":
        return (a > zero) & (b > zero)
    if what == "or":
        return (a > zero) | (b > zero)
    if what == "not":
        return ~(a > b)
    if what.endswith("_scalar"):
        c = 0 if dtype == "i32" else float(round_to(torch.tensor(CMP_CONST, dtype=torch.float64), TORCH[dtype]))
        return CMP_FN[what[:-7]](a, torch.tensor(c, dtype=a.dtype))
    return CMP_FN[what](a, b)


def _select_case(what, dtype, shape, family, tol):
    def make(gen):
        a = _values(gen, shape, dtype)
        b = torch.where(torch.rand(shape, generator=gen) < 0.3, a, _values(gen, shape, dtype))  # ties for eq/le
        conv = (lambda x: x.to(torch.int64)) if dtype == "i32" else f64
        keep = _select_expected(what, conv(a), conv(b), dtype)
        kern = _select_kernel(what)
        return Setup({"a": a, "b": b}, {"y": poisoned(shape, dtype)},
                     lambda t, be: kern(t["a"], t["b"], t["y"], grid=_grid(shape), backend=be),
                     [_expect("y", "y", torch.where(keep, conv(a), conv(b)), dtype, tol)])
    return _case(family, what, dtype, shape, make, tol=tol)


WHERE_FORMS = ("tile_scalar", "scalar_tile", "runtime_tile")


@functools.cache
def _where_kernel(form: str, kind: str):
    def body(a_gl, b_gl, y, s):
        m, n = hk.block_idx(0), hk.block_idx(1)
        ta, tb = hk.load(RT[a_gl.dtype, BM, BN], a_gl, (m, n)), hk.load(RT[b_gl.dtype, BM, BN], b_gl, (m, n))
        keep = ta > tb
        c = PY_CONST[kind]
        r = {"tile_scalar": lambda: hk.where(keep, ta, c), "scalar_tile": lambda: hk.where(keep, c, tb),
             "runtime_tile": lambda: hk.where(keep, s, tb)}[form]()
        hk.store(y, r, (m, n))

    if kind == "int":
        def k(a: GL[2], b: GL[2], y: GL[2], s: int):
            body(a, b, y, s)
    else:
        def k(a: GL[2], b: GL[2], y: GL[2], s: float):
            body(a, b, y, s)
    return hk.kernel(k, name=f"where_{form}")


def _where_case(form, dtype, shape):
    is_int = dtype == "i32"

    def make(gen):
        a, b = _values(gen, shape, dtype), _values(gen, shape, dtype)
        s = int(rand_int(gen, (), 1, 1000)) if is_int else float(rand_float(gen, (), "f32", 0.5, 4.0))
        conv = (lambda x: x.to(torch.int64)) if is_int else f64
        rnd = lambda v: conv(round_to(torch.tensor(float(v), dtype=torch.float64), TORCH[dtype]))  # noqa: E731
        c = rnd(PY_CONST["int" if is_int else "float"])
        keep = conv(a) > conv(b)
        expected = {"tile_scalar": lambda: torch.where(keep, conv(a), c),
                    "scalar_tile": lambda: torch.where(keep, c, conv(b)),
                    "runtime_tile": lambda: torch.where(keep, rnd(s), conv(b))}[form]()
        kern = _where_kernel(form, "int" if is_int else "float")
        return Setup({"a": a, "b": b}, {"y": poisoned(shape, dtype)},
                     lambda t, be: kern(t["a"], t["b"], t["y"], s, grid=_grid(shape), backend=be),
                     [_expect("y", "y", expected, dtype, "where")])
    return _case("where", form, dtype, shape, make, tol="where")


def select_cases() -> list[Case]:
    out = []
    for dtype in FLOAT_DTYPES + ("i32",):
        for shape in SHAPES_2D:
            out += [_select_case(c, dtype, shape, "cmp", "cmp") for c in CMP_FN]
            out += [_select_case(c + "_scalar", dtype, shape, "cmp", "cmp") for c in ("lt", "ge")]
            out += [_select_case(w, dtype, shape, "logical", "logical") for w in ("and", "or", "not")]
            out += [_where_case(f, dtype, shape) for f in WHERE_FORMS]
    return out


# ============================================================================================= casts
CAST_FLOATS = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2")
_FINITE_MAX = {"bf16": 3e38, "f16": 60000.0, "f32": 3e38, "fp8e4m3": 448.0, "fp8e5m2": 57344.0}


@functools.cache
def _cast_kernel(dst: str):
    @hk.kernel(name=f"cast_to_{dst}")
    def k(x: GL[2], y: GL[2], *, DST: hk.const = dst):
        m, n = hk.block_idx(0), hk.block_idx(1)
        hk.store(y, hk.load(RT[x.dtype, BM, BN], x, (m, n)).to(DST), (m, n))
    return k


def _cast_inputs(gen, shape, src: str, dst: str) -> torch.Tensor:
    """Values of src that exercise dst's rounding, its subnormals and (fp8) its saturation."""
    if src == "i32":
        return rand_int(gen, shape, 1, 1000 if dst.startswith("fp8") else 2**24)
    hi = min(_FINITE_MAX[src], {"fp8e4m3": 600.0, "fp8e5m2": 70000.0, "f16": 60000.0}.get(dst, 50000.0))
    lo = 0.001 if dst.startswith("fp8") or src.startswith("fp8") else 0.01
    return rand_float(gen, shape, src, lo, hi)


def _cast_case(src, dst, shape):
    def make(gen):
        x = _cast_inputs(gen, shape, src, dst)
        value = torch.trunc(f64(x)).to(torch.int64) if dst == "i32" else f64(x)
        kern = _cast_kernel(dst)
        return Setup({"x": x}, {"y": poisoned(shape, dst)},
                     lambda t, be: kern(t["x"], t["y"], grid=_grid(shape), backend=be),
                     [_expect("y", "y", value, dst, "cast")])
    return _case("cast", f"{src}_to_{dst}", dst, shape, make, tol="cast")


def cast_cases() -> list[Case]:
    pairs = [(s, d) for s in CAST_FLOATS for d in CAST_FLOATS if s != d]
    pairs += [(s, "i32") for s in CAST_FLOATS] + [("i32", d) for d in CAST_FLOATS]
    return [_cast_case(s, d, SHAPES_2D[0]) for s, d in pairs]


# ============================================================================================= fills
FILL_KINDS = ("zeros", "full", "neg_inf", "splat")


@functools.cache
def _fill_kernel(kind: str, dtype: str, space: str):
    dt = TORCH[dtype]

    def tile(s):
        tt = RT[dtype, BM, BN] if space == "rt" else RV[dtype, BM]
        const = PY_CONST["int" if dtype == "i32" else "float"]
        return {"zeros": lambda: hk.zeros(tt), "full": lambda: hk.full(tt, const),
                "neg_inf": lambda: hk.neg_inf(tt), "splat": lambda: hk.full(tt, s)}[kind]()

    def body(y, s):
        idx = (hk.block_idx(0), hk.block_idx(1)) if space == "rt" else (hk.block_idx(0),)
        hk.store(y, tile(s), idx)

    if dt.is_floating_point:
        def k(y: GL, s: float):
            body(y, s)
    else:
        def k(y: GL, s: int):
            body(y, s)
    return hk.kernel(k, name=f"fill_{kind}_{space}")


def _fill_case(kind, dtype, shape):
    space = "rt" if len(shape) == 2 else "rv"

    def make(gen):
        is_int = dtype == "i32"
        s = int(rand_int(gen, (), 1, 1000)) if is_int else float(rand_float(gen, (), "f32", 0.5, 4.0))
        value = {"zeros": 0.0, "full": float(PY_CONST["int" if is_int else "float"]), "neg_inf": float("-inf"),
                 "splat": float(s)}[kind]
        buf = _guarded(shape, dtype)
        full = torch.full(shape, value, dtype=torch.float64)
        kern = _fill_kernel(kind, dtype, space)
        return Setup({}, {"y": buf}, lambda t, be: kern(_view(t["y"], shape), s, grid=_grid(shape), backend=be),
                     [_exact_with_guard("y", "y", buf, full.to(torch.int64) if is_int else full, dtype, "fill")])
    return _case(f"fill_{space}", kind, dtype, shape, make, tol="fill")


def fill_cases() -> list[Case]:
    out = []
    for dtype in ALL_DTYPES:
        for kind in FILL_KINDS:
            if kind == "neg_inf" and dtype not in FLOAT_DTYPES:
                continue          # -inf exists in bf16/f16/f32 only (e4m3 has no infinity)
            out += [_fill_case(kind, dtype, SHAPES_2D[0]), _fill_case(kind, dtype, SHAPES_1D[0])]
    return out


# ======================================================================================== reductions
RED_FN = {("row", "max"): hk.row_max, ("row", "min"): hk.row_min, ("row", "sum"): hk.row_sum,
          ("col", "max"): hk.col_max, ("col", "min"): hk.col_min, ("col", "sum"): hk.col_sum}
RED_SHAPES = {"row": ((37, 50), (20, 200)), "col": ((50, 70), (200, 20))}   # (M, N)


def _red_tiles(axis, shape):
    """Tiles that hold a whole row (row reductions) or a whole column (col reductions)."""
    M, N = shape
    return (BM, 64 if N <= 64 else 256) if axis == "row" else (64 if M <= 64 else 256, BN)


def _red_fill(op: str, dtype: str) -> float:
    big = 1e9 if dtype == "i32" else float("inf")      # out-of-bounds elements must not win
    return {"max": -big, "min": big, "sum": 0.0}[op]


@functools.cache
def _reduce_kernel(axis: str, op: str):
    @hk.kernel(name=f"{axis}_{op}")
    def k(x: GL[2], y: GL[1], *, TR: hk.const, TC: hk.const, FILL: hk.const):
        i = hk.block_idx(0)
        idx = (i, 0) if axis == "row" else (0, i)
        hk.store(y, RED_FN[axis, op](hk.load(RT[x.dtype, TR, TC], x, idx, fill=FILL)), (i,))
    return k


def _reduce_case(axis, op, dtype, shape, tile=None):
    def make(gen):
        x = _values(gen, shape, dtype, int_hi=50_000)
        dim = 1 if axis == "row" else 0
        conv = x.to(torch.int64) if dtype == "i32" else f64(x)
        value = {"max": lambda: conv.amax(dim), "min": lambda: conv.amin(dim), "sum": lambda: conv.sum(dim)}[op]()
        n_out, k_terms = (shape[0], shape[1]) if axis == "row" else (shape[1], shape[0])
        tr, tc = tile or _red_tiles(axis, shape)
        grid = (cdiv(n_out, tr if axis == "row" else tc),)
        tol = "sum" if op == "sum" else op
        kw = {"scale": f64(x).abs().sum(dim), "k": k_terms} if op == "sum" and dtype != "i32" else {}
        kern = _reduce_kernel(axis, op)
        consts = dict(TR=tr, TC=tc, FILL=_red_fill(op, dtype))
        return Setup({"x": x}, {"y": poisoned((n_out,), dtype)},
                     lambda t, be: kern(t["x"], t["y"], grid=grid, backend=be, **consts),
                     [_expect("y", "y", value, dtype, tol, **kw)])
    return _case("reduce", f"{axis}_{op}" + (_tile_tag(tile) if tile else ""), dtype, shape, make,
                 tol="sum" if op == "sum" else op)


# wide tiles holding whole rows (row reductions) or whole columns (col reductions) of a ragged tensor
WIDE_REDUCTIONS = (("row", (37, 1100), (2, 2048)), ("row", (37, 1100), (1, 2048)), ("row", (37, 1000), (16, 1024)),
                   ("col", (13, 1100), (16, 512)), ("col", (2, 1100), (2, 1024)))


def reduce_cases() -> list[Case]:
    return [_reduce_case(axis, op, dtype, shape)
            for (axis, op) in RED_FN for dtype in FLOAT_DTYPES + ("i32",) for shape in RED_SHAPES[axis]] + \
        [_reduce_case(axis, op, dtype, shape, tile) for axis, shape, tile in WIDE_REDUCTIONS
         for op in ("sum", "max") for dtype in ("f32", "bf16", "i32")]


# =============================================================================================== mma
MMA_FN = {(False, False): hk.mma_AB, (False, True): hk.mma_ABt, (True, False): hk.mma_AtB, (True, True): hk.mma_AtBt}
MMA_SHAPE = (40, 50, 70)                  # M, N, K: ragged over a 2x2 grid with 3 K tiles of 32


def _mma_operand(buf, gl, src: str, shape, idx):
    """One K step's operand: through shared memory (ST) or straight into registers (RT)."""
    if src == "st":
        hk.load(buf, gl, idx)
        return buf
    return hk.load(RT[gl.dtype, *shape], gl, idx)


@functools.cache
def _mma_kernel(ta: bool, tb: bool, src_a: str, src_b: str):
    @hk.kernel(name=f"mma_{'At' if ta else 'A'}{'Bt' if tb else 'B'}_{src_a}_{src_b}")
    def k(a: GL[2], b: GL[2], c: GL[2], d: GL[2], *, BM: hk.const = 32, BN: hk.const = 32, BK: hk.const = 32):
        m, n = hk.block_idx(0), hk.block_idx(1)
        a_shape, b_shape = ((BK, BM) if ta else (BM, BK)), ((BN, BK) if tb else (BK, BN))
        a_s = hk.shared(ST[a.dtype, *a_shape]) if src_a == "st" else None
        b_s = hk.shared(ST[b.dtype, *b_shape]) if src_b == "st" else None
        K = a.shape[0] if ta else a.shape[1]

        def step(kk, acc):
            av = _mma_operand(a_s, a, src_a, a_shape, (kk, m) if ta else (m, kk))
            bv = _mma_operand(b_s, b, src_b, b_shape, (n, kk) if tb else (kk, n))
            return MMA_FN[ta, tb](av, bv, acc)

        acc = hk.fori_loop(0, hk.cdiv(K, BK), step, hk.load(RT[f32, BM, BN], c, (m, n)))
        hk.store(d, acc, (m, n))
    return k


def fp8_codes(gen: torch.Generator, shape, dtype: str) -> torch.Tensor:
    """Uniformly random finite codes of an fp8 format: zeros of both signs, subnormals and the largest
    finite value all occur, so an mma case exercises every exponent a target's format mapping touches."""
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.int64)
    finite_mag = 0x7F if dtype == "fp8e4m3" else 0x7C          # e4m3: only 0x7F is NaN; e5m2: 0x7C+ inf/NaN
    codes = torch.where((codes & 0x7F) >= finite_mag, codes & 0xF0, codes)
    return codes.to(torch.uint8).view(TORCH[dtype])


def _operand_values(gen, shape, dtype: str) -> torch.Tensor:
    return fp8_codes(gen, shape, dtype) if dtype.startswith("fp8") else rand_float(gen, shape, dtype, 0.1, 2.0)


def _mma_case(ta, tb, src_a, src_b, dtype, dtype_b=None):
    M, N, K = MMA_SHAPE
    dtype_b = dtype_b or dtype

    def make(gen):
        a = _operand_values(gen, (K, M) if ta else (M, K), dtype)
        b = _operand_values(gen, (N, K) if tb else (K, N), dtype_b)
        c = rand_float(gen, (M, N), "f32", 0.1, 4.0)
        oa, ob = (f64(a).T if ta else f64(a)), (f64(b).T if tb else f64(b))
        value = f64(c) + oa @ ob
        scale = f64(c).abs() + oa.abs() @ ob.abs()
        kern = _mma_kernel(ta, tb, src_a, src_b)
        return Setup({"a": a, "b": b, "c": c}, {"d": poisoned((M, N), "f32")},
                     lambda t, be: kern(t["a"], t["b"], t["c"], t["d"], grid=_grid((M, N)), backend=be),
                     [_expect("d", "d", value, dtype, "mma", scale=scale, k=K)])
    form = f"{'At' if ta else 'A'}{'Bt' if tb else 'B'}"
    label = dtype if dtype_b == dtype else f"{dtype}x{dtype_b}"
    return _case("mma", f"{form}_{src_a}_{src_b}", label, MMA_SHAPE, make, tol="mma")


MMA_DTYPE_PAIRS = (("bf16", "bf16"), ("f16", "f16"), ("fp8e4m3", "fp8e4m3"), ("fp8e5m2", "fp8e5m2"),
                   ("fp8e4m3", "fp8e5m2"))


def mma_cases() -> list[Case]:
    return [_mma_case(ta, tb, sa, sb, da, db) for (ta, tb) in MMA_FN for sa in ("st", "rt") for sb in ("st", "rt")
            for da, db in MMA_DTYPE_PAIRS]


# ========================================================================================== movement
MOVE_SHAPES = ((37, 70), (1, 1), (64, 32))
MOVE_FILL = {"float": -2.5, "int": -7}          # exact in every dtype, and never a plausible input


@functools.cache
def _move_kernel(path: str):
    """Copies x to y along one movement path (y may be of another dtype: the store converts)."""
    @hk.kernel(name=f"move_{path}")
    def k(x: GL[2], y: GL[2], *, FILL: hk.const = 0.0, TILE: hk.const = None, TR: hk.const = BM,
          TC: hk.const = BN):
        m, n = hk.block_idx(0), hk.block_idx(1)
        tdt = TILE or x.dtype
        if path == "gl_st_rt":
            s = hk.shared(ST[x.dtype, BM, BN])
            hk.load(s, x, (m, n), fill=FILL)
            hk.store(y, hk.load(RT[x.dtype, BM, BN], s), (m, n))
        elif path == "gl_rt":
            hk.store(y, hk.load(RT[tdt, TR, TC], x, (m, n), fill=FILL), (m, n))
        elif path == "rt_st_gl":
            s = hk.shared(ST[x.dtype, BM, BN])
            hk.store(s, hk.load(RT[x.dtype, BM, BN], x, (m, n)))
            hk.store(y, s, (m, n))
        else:                                          # st_gl
            s = hk.shared(ST[x.dtype, BM, BN])
            hk.load(s, x, (m, n))
            hk.store(y, s, (m, n))
    return k


def _move_case(path, src, dst, shape, tile=None, padded_out=False, tile_shape=(BM, BN), x_view="contiguous"):
    """x (src) -> y (dst), through a register tile of dtype `tile` if given (a converting load) and of
    `tile_shape`. padded_out: y covers the whole grid, so the fill of out-of-bounds loads is seen;
    otherwise y is a view into a poisoned buffer, so a store past its edge is seen. x_view: x as given,
    as the transpose of a contiguous tensor (column stride != 1) or one column into a wider one (rows not
    16-byte aligned)."""
    tr, tc = tile_shape
    fill = MOVE_FILL["int" if src == "i32" else "float"]
    tol = "load" if padded_out or tile else "store"

    def make(gen):
        x = (rand_int(gen, shape, 1, 50_000) if src == "i32" else
             _cast_inputs(gen, shape, src, dst) if dst != src else rand_float(gen, shape, src, 0.05, 8.0))
        value = x.to(torch.int64) if src == "i32" else f64(x)
        if tile:                                   # the load rounds to the tile dtype
            value = round_to(value, TORCH[tile]).to(torch.float64)
        if dst == "i32" and value.is_floating_point():
            value = torch.trunc(value).to(torch.int64)
        grid = _grid(shape, tr, tc)
        consts = dict(FILL=float(fill), TILE=tile, TR=tr, TC=tc)
        kern = _move_kernel(path)
        stored, x_of = _stored_view(x, x_view)
        if padded_out:
            out_shape = (grid[0] * tr, grid[1] * tc)
            full = padded(value, out_shape, fill)
            return Setup({"x": stored}, {"y": poisoned(out_shape, dst)},
                         lambda t, be: kern(x_of(t["x"]), t["y"], grid=grid, backend=be, **consts),
                         [_expect("y", "y", full, dst, tol)])
        buf = _guarded(shape, dst)
        return Setup({"x": stored}, {"y": buf},
                     lambda t, be: kern(x_of(t["x"]), _view(t["y"], shape), grid=grid, backend=be, **consts),
                     [_exact_with_guard("y", "y", buf, value, dst, tol)])
    name = path + ("_fill" if padded_out else "") + (f"_via_{tile}" if tile else "") + \
        (f"_to_{dst}" if dst != src and not tile else "") + _tile_tag(tile_shape) + \
        (f"_{x_view}" if x_view != "contiguous" else "")
    return _case("move", name, src, shape, make, tol=tol)


def _stored_view(x: torch.Tensor, how: str):
    """(the tensor the runner moves to the device, how the kernel's argument is made from it) so that the
    argument is x with the strides `how` names, whatever the runner's copy does to strides."""
    if how == "transposed":
        return x.t().contiguous(), lambda t: t.t()
    if how == "offset":
        return torch.cat([x[:, :1], x], dim=1), lambda t: t[:, 1:]
    return x, lambda t: t


@functools.cache
def _rv_move_kernel(rank: int):
    if rank == 1:
        @hk.kernel(name="move_gl_rv")
        def k(x: GL[1], y: GL[1], *, FILL: hk.const = 0.0):
            m = hk.block_idx(0)
            hk.store(y, hk.load(RV[x.dtype, BM], x, (m,), fill=FILL), (m,))
    else:
        @hk.kernel(name="move_gl_rv_rows")
        def k(x: GL[2], y: GL[2], *, FILL: hk.const = 0.0):
            r, n = hk.block_idx(0), hk.block_idx(1)      # one row per block: leading dim in elements
            hk.store(y, hk.load(RV[x.dtype, BN], x, (r, n), fill=FILL), (r, n))
    return k


def _rv_move_case(dtype, shape):
    def make(gen):
        x = rand_int(gen, shape, 1, 50_000) if dtype == "i32" else rand_float(gen, shape, dtype, 0.05, 8.0)
        grid = (cdiv(shape[0], BM),) if len(shape) == 1 else (shape[0], cdiv(shape[1], BN))
        buf = _guarded(shape, dtype)
        kern = _rv_move_kernel(len(shape))
        return Setup({"x": x}, {"y": buf}, lambda t, be: kern(t["x"], _view(t["y"], shape), grid=grid, backend=be),
                     [_exact_with_guard("y", "y", buf, x, dtype, "load")])
    return _case("move", f"gl_rv_rank{len(shape)}", dtype, shape, make, tol="load")


@functools.cache
def _move_nd_kernel(rank: int):
    if rank == 3:
        @hk.kernel(name="move_rank3")
        def k(x: GL[3], y: GL[3]):
            m, h = hk.block_idx(0), hk.block_idx(1)
            hk.store(y, hk.load(RT[x.dtype, BM, 64], x, (h, m, 0)), (h, m, 0))
    else:
        @hk.kernel(name="move_rank4")
        def k(x: GL[4], y: GL[4]):
            m, h, b = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
            s = hk.shared(ST[x.dtype, BM, 64])
            hk.load(s, x, (b, h, m, 0))
            hk.store(y, hk.load(RT[x.dtype, BM, 64], s), (b, h, m, 0))
    return k


def _move_nd_case(dtype, shape):
    def make(gen):
        x = rand_int(gen, shape, 1, 50_000) if dtype == "i32" else rand_float(gen, shape, dtype, 0.05, 8.0)
        lead = shape[:-2]
        grid = (cdiv(shape[-2], BM),) + tuple(reversed(lead))
        buf = _guarded(shape, dtype, pad=2)
        kern = _move_nd_kernel(len(shape))
        return Setup({"x": x}, {"y": buf}, lambda t, be: kern(t["x"], _view(t["y"], shape), grid=grid, backend=be),
                     [_exact_with_guard("y", "y", buf, x, dtype, "load")])
    return _case("move", f"rank{len(shape)}", dtype, shape, make, tol="load")


def move_cases() -> list[Case]:
    out = []
    for dtype in ALL_DTYPES:
        for shape in MOVE_SHAPES:
            out.append(_move_case("gl_st_rt", dtype, dtype, shape, padded_out=True))
            out.append(_move_case("gl_rt", dtype, dtype, shape, padded_out=True))
            out += [_move_case(p, dtype, dtype, shape) for p in ("gl_rt", "rt_st_gl", "st_gl")]
        tile = "f32" if dtype != "f32" else "bf16"
        out.append(_move_case("gl_rt", dtype, tile, SHAPES_2D[0], tile=tile))
        out += [_rv_move_case(dtype, s) for s in ((37,), (1,), (5, 70))]
        out += [_move_nd_case(dtype, s) for s in ((3, 37, 40), (2, 3, 37, 40))]
    # stores that convert: an f32 register tile into a tensor of every dtype
    out += [_move_case("gl_rt", "f32", dst, SHAPES_2D[0]) for dst in ALL_DTYPES if dst != "f32"]
    # wide tiles: ragged both ways, loads that fill, converting loads, strided and unaligned sources
    for tile in WIDE_TILES:
        out += [_move_case("gl_rt", dt, dt, WIDE_SHAPE, tile_shape=tile) for dt in ("bf16", "f32", "i32")]
        out.append(_move_case("gl_rt", "bf16", "bf16", WIDE_SHAPE, tile_shape=tile, padded_out=True))
        out.append(_move_case("gl_rt", "bf16", "f32", WIDE_SHAPE, tile="f32", tile_shape=tile))
        out += [_move_case("gl_rt", "bf16", "bf16", WIDE_SHAPE, tile_shape=tile, x_view=v)
                for v in ("transposed", "offset")]
    return out


# ======================================================================================== atomic_add
@functools.cache
def _atomic_kernel(space: str):
    if space == "rt":
        @hk.kernel(name="atomic_add_rt")
        def k(x: GL[3], y: GL[2], *, TR: hk.const = BM, TC: hk.const = BN):
            m, n, g = hk.block_idx(0), hk.block_idx(1), hk.block_idx(2)
            hk.atomic_add(y, hk.load(RT[f32, TR, TC], x, (g, m, n)), (m, n))
    else:
        @hk.kernel(name="atomic_add_rv")
        def k(x: GL[2], y: GL[1], *, TR: hk.const = BM, TC: hk.const = BN):
            m, g = hk.block_idx(0), hk.block_idx(1)
            hk.atomic_add(y, hk.load(RV[f32, TR], x, (g, m)), (m,))
    return k


def _atomic_case(shape, groups: int, space: str, tile=(BM, BN)):
    """y (initial values, a view into a poisoned buffer) += sum over `groups` blocks per tile."""
    tr, tc = tile
    def make(gen):
        x = rand_float(gen, (groups,) + shape, "f32", 0.1, 4.0)
        init = rand_float(gen, shape, "f32", 0.1, 4.0)
        buf = _guarded(shape, "f32")
        _view(buf, shape).copy_(init)
        grid = _grid(shape, tr, tc) + (groups,) if space == "rt" else (cdiv(shape[0], tr), groups)
        value = f64(init) + f64(x).sum(0)
        kern = _atomic_kernel(space)
        launch = lambda t, be: kern(t["x"], _view(t["y"], shape), grid=grid, backend=be, TR=tr, TC=tc)  # noqa: E731
        if groups == 1:
            return Setup({"x": x}, {"y": buf}, launch, [_exact_with_guard("y", "y", buf, value, "f32", "atomic_add")])
        inside = ~guard_mask(buf.shape, shape)
        expected = torch.zeros(buf.shape, dtype=torch.float64)
        _view(expected, shape).copy_(value)
        scale = torch.zeros(buf.shape, dtype=torch.float64)
        _view(scale, shape).copy_(f64(init).abs() + f64(x).abs().sum(0))
        return Setup({"x": x}, {"y": buf}, launch,
                     [_expect("y", "y", expected, "f32", "atomic_add_accumulate", scale=scale, k=groups + 1,
                              select=inside),
                      Check("guard around y", "y", buf.clone(), bound_for("store", "f32"), select=~inside)])
    name = "atomic_add" if groups == 1 else "atomic_add_accumulate"
    return _case("atomic", f"{name}_{space}{_tile_tag(tile)}", "f32", shape, make, tol=name,
                 deterministic=groups == 1)


def atomic_cases() -> list[Case]:
    return [_atomic_case(SHAPES_2D[0], 1, "rt"), _atomic_case(SHAPES_2D[0], 3, "rt"),
            _atomic_case(SHAPES_1D[0], 1, "rv"), _atomic_case(SHAPES_1D[0], 3, "rv")] + \
        [_atomic_case(WIDE_SHAPE, g, "rt", tile) for tile in WIDE_TILES for g in (1, 3)]


# =========================================================================================== scalars
SCALAR_I32 = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
              "mod": operator.mod, "min": hk.min, "max": hk.max}
SCALAR_F32 = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
              "min": hk.min, "max": hk.max}
SCALAR_PY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
             "mod": operator.mod, "div": operator.truediv, "min": min, "max": max}
SCALAR_BLOCKS = 3


@functools.cache
def _scalar_kernel(op: str, dtype: str):
    @hk.kernel(name=f"scalar_{op}_{dtype}")
    def k(y: GL[2], a: int, b: int, f: float, g: float):
        blk = hk.block_idx(0)
        if op == "int_div":                    # int / int is an f32 division
            r = (a + blk) / b
        elif op == "to_f32":
            r = (a + blk).to(f32)
        elif op == "to_i32":
            r = (f * 1000.0 + blk).to(i32)
        elif op == "shape":                     # dims, num_blocks and consts as scalars
            r = y.shape[0] * 1000 + y.shape[1] * 10 + hk.num_blocks(0) - blk
        elif dtype == "i32":
            r = SCALAR_I32[op](a + blk, b)
        else:
            r = SCALAR_F32[op](f + blk.to(f32), g)
        hk.store(y, hk.full(RV[y.dtype, 16], r), (blk, 0))
    return k


def _scalar_expected(op, dtype, a, b, f, g, blk) -> float | int:
    F = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731 - scalar f32 arithmetic is IEEE f32
    if op == "int_div":
        return float(F(float(a + blk)) / F(float(b)))
    if op == "to_f32":
        return float(F(float(a + blk)))
    if op == "to_i32":
        return int(torch.trunc(F(f) * F(1000.0) + F(float(blk))))
    if op == "shape":
        return SCALAR_BLOCKS * 1000 + 16 * 10 + SCALAR_BLOCKS - blk
    if dtype == "i32":
        v = SCALAR_PY[op](a + blk, b)
        return ((v + 2**31) % 2**32) - 2**31
    x = F(f) + F(float(blk))
    return float({"min": torch.minimum, "max": torch.maximum}.get(op, SCALAR_PY[op])(x, F(g)))


def _scalar_case(op, dtype):
    def make(gen):
        a = int(rand_int(gen, (), 1, 2**30))       # large enough that mul wraps around
        b = int(rand_int(gen, (), 1, 1000))
        f, g = (float(rand_float(gen, (), "f32", 0.1, 4.0)) for _ in range(2))
        y = poisoned((SCALAR_BLOCKS, 16), dtype)
        rows = [_scalar_expected(op, dtype, a, b, f, g, blk) for blk in range(SCALAR_BLOCKS)]
        value = torch.tensor(rows, dtype=torch.int64 if dtype == "i32" else torch.float64)[:, None].expand(-1, 16)
        kern = _scalar_kernel(op, dtype)
        return Setup({}, {"y": y}, lambda t, be: kern(t["y"], a, b, f, g, grid=(SCALAR_BLOCKS,), backend=be),
                     [_expect("y", "y", value, dtype, "scalar")])
    return _case("scalar", op, dtype, (SCALAR_BLOCKS,), make, tol="scalar")


def scalar_cases() -> list[Case]:
    out = [_scalar_case(op, "i32") for op in SCALAR_I32] + [_scalar_case(op, "f32") for op in SCALAR_F32]
    out += [_scalar_case("int_div", "f32"), _scalar_case("to_f32", "f32"), _scalar_case("to_i32", "i32"),
            _scalar_case("shape", "i32")]
    return out


# ============================================================================ scalars read from memory
SCALAR_LOAD_FILL = -7
SCALAR_LOAD_COLS = 6                     # what each block stores: the five reads and a tile index read


@functools.cache
def _scalar_load_kernel():
    """global_to_scalar: reads in bounds, past each edge (the fill, no memory touched), a data-dependent
    trip count and a loop index, as cu_seqlens and block tables are read."""
    @hk.kernel(name="scalar_load")
    def k(t: GL[2], lens: GL[1], y: GL[2], *, FILL: hk.const = SCALAR_LOAD_FILL):
        blk = hk.block_idx(0)
        rows, cols = t.shape[0], t.shape[1]
        reads = [hk.load_scalar(t, (blk, blk + 1), fill=FILL),          # in bounds
                 hk.load_scalar(t, (blk - 1, 0), fill=FILL),            # row -1 on block 0
                 hk.load_scalar(t, (blk, cols + blk), fill=FILL),       # past the last column
                 hk.load_scalar(t, (rows, 0), fill=FILL)]               # past the last row
        n = hk.load_scalar(lens, blk)                                   # a trip count read from memory
        reads.append(hk.fori_loop(0, n, lambda j, acc: acc + hk.load_scalar(t, (blk, j), fill=FILL), 0))
        reads.append(hk.load_scalar(lens, hk.load_scalar(lens, blk) - 3, fill=FILL))   # index read from memory
        for c, v in enumerate(reads):
            hk.store(y, hk.full(RV[i32, 16], v), (blk, c))          # 16 copies: a whole row vector
    return k


def _scalar_load_case(view: str):
    def make(gen):
        rows, cols = 5, 9
        t = rand_int(gen, (rows, cols), 1, 50_000)
        lens = torch.tensor([0, 3, cols, 1, 7], dtype=torch.int32)   # [0, cols]: every read of the loop in bounds
        expected = torch.zeros(rows, SCALAR_LOAD_COLS, dtype=torch.int64)
        F = SCALAR_LOAD_FILL
        for b in range(rows):
            n = int(lens[b])
            j = n - 3
            expected[b] = torch.tensor([int(t[b, b + 1]) if b + 1 < cols else F, int(t[b - 1, 0]) if b else F, F, F,
                                        sum(int(t[b, i]) for i in range(n)),
                                        int(lens[j]) if 0 <= j < rows else F])
        stored, t_of = _stored_view(t, view)
        kern = _scalar_load_kernel()
        expected = expected.repeat_interleave(16, dim=1)
        return Setup({"t": stored, "lens": lens}, {"y": poisoned((rows, SCALAR_LOAD_COLS * 16), "i32")},
                     lambda d, be: kern(t_of(d["t"]), d["lens"], d["y"], grid=(rows,), backend=be),
                     [_expect("y", "y", expected, "i32", "scalar")])
    return _case("scalar_load", "global_to_scalar" + (f"_{view}" if view != "contiguous" else ""), "i32", (5, 9),
                 make, tol="scalar")


@functools.cache
def _page_gather_kernel():
    """A pipeline whose load region reads its tile index from a table (a paged KV cache's block table):
    block b sums the pages table[b, 0..n) of x; entries -1 and past the pages read the tile's fill."""
    @hk.kernel(name="scalar_load_pages")
    def k(x: GL[2], table: GL[2], y: GL[2], *, TR: hk.const = BM, TC: hk.const = BN):
        blk = hk.block_idx(0)
        buf = hk.shared(ST[x.dtype, TR, TC], stages=2)

        def load(j, s):
            hk.load(buf[s], x, (hk.load_scalar(table, (blk, j), fill=-1), 0))

        def compute(j, s, acc):
            return acc + hk.load(RT[x.dtype, TR, TC], buf[s])

        acc = hk.pipeline(table.shape[1], load, compute, carry=hk.zeros(RT[f32, TR, TC]), stages=2)
        hk.store(y, acc, (blk, 0))
    return k


def _page_gather_case():
    def make(gen):
        pages, blocks, per = 6, 3, 4
        x = rand_int(gen, (pages * BM, BN), 1, 100).to(torch.float32)     # integers: every sum is exact
        table = torch.tensor([[5, 0, 2, 2], [1, -1, 3, 7], [4, 3, 2, 1]], dtype=torch.int32)
        xp = f64(x).view(pages, BM, BN)
        value = torch.stack([sum((xp[p] for p in table[b].tolist() if 0 <= p < pages), torch.zeros(BM, BN,
                             dtype=torch.float64)) for b in range(blocks)]).reshape(blocks * BM, BN)
        kern = _page_gather_kernel()
        return Setup({"x": x, "table": table}, {"y": poisoned((blocks * BM, BN), "f32")},
                     lambda d, be: kern(d["x"], d["table"], d["y"], grid=(blocks,), backend=be),
                     [_expect("y", "y", value, "f32", "control")])
    return _case("scalar_load", "pages", "f32", (6 * BM, BN), make, tol="control")


def scalar_load_cases() -> list[Case]:
    return [_scalar_load_case("contiguous"), _scalar_load_case("transposed"), _page_gather_case()]


# =========================================================================== control: loops, pipelines
@functools.cache
def _loop_kernel(form: str):
    """Each block sums column tiles of its rows of x with a loop whose carries are explicit."""
    @hk.kernel(name=f"loop_{form}")
    def k(x: GL[2], s: GL[2], mx: GL[1], cnt: GL[1], lo: int, *, STAGES: hk.const = 1):
        m = hk.block_idx(0)
        n_tiles = hk.cdiv(x.shape[1], BN)
        init = (hk.zeros(RT[f32, BM, BN]), hk.neg_inf(RV[f32, BM]), 0)

        def add(t, j, acc, rmax, count):
            keep = hk.bounds_mask(t, m * BM, j * BN, x.shape[0], x.shape[1])     # padding must not win the max
            return acc + t, hk.maximum(rmax, hk.row_max(hk.where(keep, t, float("-inf")))), count + 1

        def add_tile(j, *carry):
            return add(hk.load(RT[f32, BM, BN], x, (m, j)), j, *carry)            # out of bounds reads 0

        if form == "carries":                  # tiles 0 .. n_tiles-1, starting from a runtime bound
            acc, rmax, count = hk.fori_loop(lo, lo + n_tiles, lambda j, *c: add_tile(j - lo, *c), init)
        elif form == "per_block_trips":        # block m sums tiles 0..m: trip counts differ per block
            acc, rmax, count = hk.fori_loop(0, hk.min(m + 1, n_tiles), add_tile, init)
        elif form == "nested":                 # an outer loop over two halves of the tiles
            half = hk.cdiv(n_tiles, 2)

            def outer(i, *c):
                inner = lambda j, *cc: add_tile(i * half + j, *cc)  # noqa: E731
                return hk.fori_loop(0, hk.min(half, n_tiles - i * half), inner, c)
            acc, rmax, count = hk.fori_loop(0, 2, outer, init)
        elif form == "zero_trips":             # hi < lo: the carry comes out unchanged
            acc, rmax, count = hk.fori_loop(lo, lo - 1, add_tile, init)
        else:                                  # a pipeline over the tiles with STAGES stage buffers
            buf = hk.shared(ST[f32, BM, BN], stages=STAGES)

            def load(j, st):
                hk.load(buf[st], x, (m, j))

            def compute(j, st, *carry):
                return add(hk.load(RT[f32, BM, BN], buf[st]), j, *carry)

            if form == "pipeline":
                n = n_tiles
            elif form == "pipeline_per_block":
                n = hk.min(m + 1, n_tiles)
            else:                              # pipeline_empty: zero iterations, known only at run time
                n = lo - lo
            acc, rmax, count = hk.pipeline(n, load, compute, carry=init, stages=STAGES)
        hk.store(s, acc, (m, 0))
        hk.store(mx, rmax, (m,))
        hk.store(cnt, hk.full(RV[i32, BM], count), (m,))
    return k


def _tiles_summed(form: str, block: int, n_tiles: int) -> int:
    if form in ("per_block_trips", "pipeline_per_block"):
        return min(block + 1, n_tiles)
    if form in ("zero_trips", "pipeline_empty"):
        return 0
    return n_tiles


def _loop_case(form, shape, stages=1):
    M, N = shape
    n_tiles, blocks = cdiv(N, BN), cdiv(M, BM)

    def make(gen):
        x = rand_float(gen, shape, "f32", 0.1, 4.0)
        lo = int(rand_int(gen, (), 1, 100))
        xp = padded(f64(x), (blocks * BM, n_tiles * BN), 0.0).view(blocks, BM, n_tiles, BN)
        sums, scales, maxes, counts = [], [], [], []
        for blk in range(blocks):
            t = _tiles_summed(form, blk, n_tiles)
            tiles = xp[blk, :, :t, :]
            sums.append(tiles.sum(1))
            scales.append(tiles.abs().sum(1))
            valid = tiles.reshape(BM, -1)[:, :min(t * BN, N)]        # global columns of the summed tiles
            maxes.append(valid.amax(1) if valid.shape[1] else torch.full((BM,), float("-inf"), dtype=torch.float64))
            counts.append(torch.full((BM,), t, dtype=torch.int64))
        s_val, s_scale = torch.cat(sums)[:M], torch.cat(scales)[:M]
        outputs = {"s": poisoned((M, BN), "f32"), "mx": poisoned((M,), "f32"), "cnt": poisoned((blocks * BM,), "i32")}
        kern = _loop_kernel(form)
        launch = lambda t, be: kern(t["x"], t["s"], t["mx"], t["cnt"], lo, grid=(blocks,), backend=be,  # noqa: E731
                                    STAGES=stages)
        return Setup({"x": x}, outputs, launch,
                     [_expect("tile sums (f32 carry)", "s", s_val, "f32", "sum", scale=s_scale, k=n_tiles),
                      _expect("row max (RV carry)", "mx", torch.cat(maxes)[:M], "f32", "max"),
                      _expect("trip count (scalar carry)", "cnt", torch.cat(counts), "i32", "control")])
    name = form + (f"_stages{stages}" if form.startswith("pipeline") else "")
    return _case("control", name, "f32", shape, make, tol="control")


def control_cases() -> list[Case]:
    forms = ("carries", "per_block_trips", "nested", "zero_trips")
    out = [_loop_case(f, s) for f in forms for s in ((37, 150), (32, 32))]
    out += [_loop_case("pipeline", (37, 150), st) for st in (1, 2, 3)]
    out += [_loop_case("pipeline_per_block", (100, 130), 2), _loop_case("pipeline_empty", (37, 70), 2)]
    return out


# ============================================================================================= masks
@functools.cache
def _mask_kernel(kind: str):
    @hk.kernel(name=f"mask_{kind}")
    def k(x: GL[2], y: GL[2], r0: int, c0: int, nr: int, nc: int, p: float, seed: int, off: int, *,
          P: hk.const = 0.0, SEED: hk.const = 0, OFFSET: hk.const = 0, TR: hk.const = BM, TC: hk.const = BN):
        m, n = hk.block_idx(0), hk.block_idx(1)
        t = hk.load(RT[f32, TR, TC], x, (m, n))
        rows, cols = m * TR + r0, n * TC + c0
        if kind == "causal":
            keep = hk.causal_mask(RT[f32, TR, TC], rows, cols)
        elif kind == "bounds":
            keep = hk.bounds_mask(t, rows, cols, nr, nc)
        elif kind == "dropout_const":          # 64-bit seed and offset, compile-time p
            keep = hk.dropout_mask(t, P, SEED, OFFSET, m * TR, n * TC, x.shape[1])
        else:                                  # runtime p, seed and offset (32-bit)
            keep = hk.dropout_mask(t, p, seed, off, m * TR, n * TC, x.shape[1])
        hk.store(y, hk.where(keep, t, float("-inf")), (m, n))
    return k


def _mask_case(kind, shape, p=0.0, seed=0, offset=0, tile=(BM, BN)):
    M, N = shape

    def make(gen):
        x = rand_float(gen, shape, "f32", 0.1, 4.0)
        r0, c0 = int(rand_int(gen, (), 1, 9)), int(rand_int(gen, (), 1, 9))
        nr, nc = M - int(torch.randint(0, 5, (), generator=gen)), N - int(torch.randint(0, 5, (), generator=gen))
        seed_rt = int(rand_int(gen, (), 1, 2**31 - 1))
        off_rt = int(torch.randint(0, 2**31 - 1, (), generator=gen))
        i = torch.arange(M).view(-1, 1)
        j = torch.arange(N).view(1, -1)
        if kind == "causal":
            keep = (i + r0) >= (j + c0)
        elif kind == "bounds":
            keep = (i + r0 >= 0) & (i + r0 < nr) & (j + c0 >= 0) & (j + c0 < nc)
        elif kind == "dropout_const":
            keep = dropout_keep(p, seed, offset + i * N + j)
        else:
            keep = dropout_keep(p, seed_rt & MASK32, (off_rt & MASK32) + i * N + j)
        value = torch.where(keep, f64(x), float("-inf"))
        kern = _mask_kernel(kind)
        consts = dict(P=p, SEED=seed, OFFSET=offset, TR=tile[0], TC=tile[1])
        launch = lambda t, be: kern(t["x"], t["y"], r0, c0, nr, nc, p, seed_rt, off_rt,  # noqa: E731
                                    grid=_grid(shape, *tile), backend=be, **consts)
        return Setup({"x": x}, {"y": poisoned(shape, "f32")}, launch,
                     [_expect("where(mask, x, -inf)", "y", value, "f32", kind.split("_")[0] + "_mask")])
    name = kind + (f"_p{p:g}" if kind.startswith("dropout") else "") + _tile_tag(tile)
    return _case("mask", name, "f32", shape, make, tol=kind.split("_")[0] + "_mask")


def mask_cases() -> list[Case]:
    out = []
    for shape in SHAPES_2D:
        out += [_mask_case("causal", shape), _mask_case("bounds", shape)]
        for p in (0.0, 0.25, 0.9, 1.0):
            # an odd offset (groups of four straddle rows and tiles) whose indices cross 2^34, where the
            # element index and its Philox counter g div 4 both carry into their high words
            out.append(_mask_case("dropout_const", shape, p, seed=0x9E3779B97F4A7C15, offset=2**34 - 1001))
        out.append(_mask_case("dropout_runtime", shape, 0.5))
    for tile in WIDE_TILES:
        out += [_mask_case("causal", WIDE_SHAPE, tile=tile), _mask_case("bounds", WIDE_SHAPE, tile=tile),
                # odd offset: a lane's run of columns starts and ends mid-group; 2^34 crossed mid-tensor
                _mask_case("dropout_const", WIDE_SHAPE, 0.25, seed=0x9E3779B97F4A7C15, offset=2**34 - 20001,
                           tile=tile)]
    return out


# ========================================================================================= broadcast
@functools.cache
def _broadcast_kernel():
    @hk.kernel(name="broadcast")
    def k(x: GL[2], vr: GL[1], vc: GL[1], yr: GL[2], yc: GL[2], *, TR: hk.const = BM, TC: hk.const = BN):
        m, n = hk.block_idx(0), hk.block_idx(1)
        t = hk.load(RT[x.dtype, TR, TC], x, (m, n))
        keep = hk.causal_mask(t, m * TR, n * TC)
        hk.store(yr, hk.where(keep, t, hk.load(RV[x.dtype, TR], vr, (m,))[:, None]), (m, n))
        hk.store(yc, hk.where(keep, t, hk.load(RV[x.dtype, TC], vc, (n,))[None, :]), (m, n))
    return k


def _broadcast_case(dtype, shape, tile=(BM, BN)):
    M, N = shape

    def make(gen):
        x, vr, vc = (_values(gen, s, dtype) for s in (shape, (M,), (N,)))
        conv = (lambda v: v.to(torch.int64)) if dtype == "i32" else f64
        keep = torch.arange(M).view(-1, 1) >= torch.arange(N).view(1, -1)
        kern = _broadcast_kernel()
        return Setup({"x": x, "vr": vr, "vc": vc}, {"yr": poisoned(shape, dtype), "yc": poisoned(shape, dtype)},
                     lambda t, be: kern(t["x"], t["vr"], t["vc"], t["yr"], t["yc"], grid=_grid(shape, *tile),
                                        backend=be, TR=tile[0], TC=tile[1]),
                     [_expect("v[:, None]", "yr", torch.where(keep, conv(x), conv(vr)[:, None]), dtype, "broadcast"),
                      _expect("v[None, :]", "yc", torch.where(keep, conv(x), conv(vc)[None, :]), dtype, "broadcast")])
    return _case("broadcast", "row_and_col" + _tile_tag(tile), dtype, shape, make, tol="broadcast")


def broadcast_cases() -> list[Case]:
    return [_broadcast_case(dt, s) for dt in FLOAT_DTYPES + ("i32",) for s in SHAPES_2D] + \
        [_broadcast_case(dt, WIDE_SHAPE, tile) for dt in ("bf16", "f32", "i32") for tile in WIDE_TILES]


# ================================================================= NaN operands of maximum/minimum
# interface/numerics.py, "min/max and NaN": quiet NaNs of every sign and payload, signaling NaNs, signed
# zeros and infinities, each against each, in both operand positions.
NAN_MINMAX_BITS = (0x7FC00000, 0xFFC00000, 0x7FC12345, 0xFFC00ABC, 0x7FFFFFFF, 0x7F800001, 0xFF812345,
                   0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x3F800000, 0xC0200000, 0x00000001)
NAN_MINMAX_RULE = {"maximum": nan_ignoring_max, "minimum": nan_ignoring_min}


def _nan_minmax_inputs(shape) -> tuple[torch.Tensor, torch.Tensor]:
    bits = torch.tensor(NAN_MINMAX_BITS, dtype=torch.int64)
    n, k = shape[0] * shape[1], len(NAN_MINMAX_BITS)
    i = torch.arange(n)
    as_f32 = lambda b: ((b + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32).reshape(shape)  # noqa: E731
    return as_f32(bits[i % k]), as_f32(bits[(i // k) % k])


def _nan_minmax_case(op, shape):
    def make(gen):
        a, b = _nan_minmax_inputs(shape)
        kern = _binary_kernel(op, "tile", "float")
        return Setup({"a": a, "b": b}, {"y": poisoned(shape, "f32")},
                     lambda t, be: kern(t["a"], t["b"], t["y"], 0.0, grid=_grid(shape), backend=be),
                     [_expect("y", "y", NAN_MINMAX_RULE[op](a, b), "f32", op)])
    return _case("binary_nan", op, "f32", shape, make, tol=op)


def nan_minmax_cases() -> list[Case]:
    return [_nan_minmax_case(op, SHAPES_2D[0]) for op in NAN_MINMAX_RULE]


def cases() -> list[Case]:
    return (move_cases() + atomic_cases() + unary_cases() + binary_cases() + select_cases() + cast_cases()
            + fill_cases() + reduce_cases() + mma_cases() + scalar_cases() + scalar_load_cases() + control_cases()
            + mask_cases()
            + broadcast_cases() + nan_minmax_cases())
