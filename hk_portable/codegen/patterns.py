"""IR patterns that more than one emitter rewrites into one library call (each backend says which layouts
its library implements the rewrite for)."""
from __future__ import annotations

from typing import Callable

from ..interface import opcodes
from ..interface.ir import Op, Program, Value


def uses_and_producers(program: Program) -> tuple[dict[Value, list[Op]], dict[Value, Op]]:
    """({value: the ops that read it, a yield counting as a read by the region's op}, {value: its op})."""
    uses: dict[Value, list[Op]] = {}
    for op in program.body.walk():
        for v in op.operands:
            uses.setdefault(v, []).append(op)
        for r in op.regions:
            for y in r.yields:
                uses.setdefault(y, []).append(op)
    return uses, {r: o for o in program.body.walk() for r in o.results}


def folded_scales(program: Program, accepts: Callable[[Value], bool]) -> dict[Op, tuple]:
    """The scale of a softmax folded into its subtraction: for an f32 tile `s = x * c` (c a splat scalar, s in
    a layout the backend's library folds: `accepts(s)`) used only by a row max and by `s - v[:, None]` whose
    one use is exp2 (attention's `scores * scale_log2`, its running max and `exp2(scores - max)`),
    {mul op: (reduce op, sub op), reduce op: (x, c), sub op: (x, c, v)}. The emitter skips the mul, takes the
    max of x and scales it once (hk::reduce_scaled: for 0 < c < inf rounding is monotone, so max(x) * c is
    max(x * c) bit for bit; any other c takes the unfolded path) and makes the difference one fma
    (hk::fms_rows): x * c - v rounded once instead of twice. exp2's argument moves by at most half an ulp of
    x * c -- the one place a backend contracts, so only where exp2 (itself a few ulp from the reference's) is
    the only reader."""
    uses, producers = uses_and_producers(program)
    out: dict[Op, tuple] = {}
    for op in program.body.walk():
        if (op.opcode != "binary" or op.attrs["op"] != "mul" or op.result.type.dtype.name != "f32"
                or not accepts(op.result)):
            continue
        scaled, readers = _by_splat(op, producers), _softmax_readers(op.result, uses, producers)
        if scaled is None or readers is None:
            continue
        (x, c), (red, sub, v) = scaled, readers
        out.update({op: (red, sub), red: (x, c), sub: (x, c, v)})
    return out


def masked_scales(program: Program, accepts: Callable[[Value], bool]) -> dict[Op, tuple]:
    """folded_scales through a select that masks the scaled tile with -inf (attention's edge tiles):
    `w = where(mask, x * c, -inf)`, the mul read only by the select, w read as folded_scales' s is. The select
    takes x unscaled (-inf * c is -inf for the 0 < c < inf hk::reduce_scaled folds; any other c takes its unfolded
    path at run time, as for the unmasked fold). {mul: (reduce, sub), reduce: (w, c), sub: (w, c, v), where: (x,)}."""
    uses, producers = uses_and_producers(program)
    out: dict[Op, tuple] = {}
    for op in program.body.walk():
        if op.opcode != "where" or op.result.type.dtype.name != "f32" or not accepts(op.result):
            continue
        mul, fill = producers.get(op.operands[1]), producers.get(op.operands[2])
        if (mul is None or mul.opcode != "binary" or mul.attrs["op"] != "mul" or uses.get(mul.result) != [op]
                or fill is None or fill.opcode != "fill" or fill.attrs["value"] != float("-inf")):
            continue
        scaled, readers = _by_splat(mul, producers), _softmax_readers(op.result, uses, producers)
        if scaled is None or readers is None:
            continue
        (x, c), (red, sub, v) = scaled, readers
        out.update({mul: (red, sub), red: (op.result, c), sub: (op.result, c, v), op: (x,)})
    return out


def _by_splat(mul: Op, producers: dict) -> tuple[Value, Value] | None:
    """(x, c) for a mul of a tile x by a splat of the scalar c (either order, the first found), else None."""
    for x, s in (mul.operands, mul.operands[::-1]):
        sp = producers.get(s)
        if sp is not None and sp.opcode == "splat" and x is not s:
            return x, sp.operands[0]
    return None


def _softmax_readers(s: Value, uses: dict, producers: dict) -> tuple[Op, Op, Value] | None:
    """(row max op, sub op, v) where s is read only by a row max and by `s - v[:, None]` whose one use is exp2."""
    users = uses.get(s, [])
    red = [u for u in users if u.opcode == "reduce" and u.attrs["op"] == "max" and u.attrs["axis"] == "row"]
    sub = [u for u in users if u.opcode == "binary" and u.attrs["op"] == "sub" and u.operands[0] is s
           and u.operands[1] is not s]
    if len(users) != 2 or len(red) != 1 or len(sub) != 1:
        return None
    b, after = producers.get(sub[0].operands[1]), uses.get(sub[0].result, [])
    if (b is None or b.opcode != "broadcast" or b.attrs["axis"] != "row"
            or len(after) != 1 or after[0].opcode != "unary" or after[0].attrs["op"] != "exp2"):
        return None
    return red[0], sub[0], b.operands[0]


def use_counts(program: Program, carried: int = 1) -> dict[Value, int]:
    """How many times each value is read; a region's yield counts `carried` times (2: never 'used once')."""
    uses: dict[Value, int] = {}
    for op in program.body.walk():
        for v in op.operands:
            uses[v] = uses.get(v, 0) + 1
        for r in op.regions:
            for y in r.yields:
                uses[y] = uses.get(y, 0) + carried
    return uses


# the masks a select may evaluate at each element it writes: those the libraries have a predicate of
# (hk::causal_at, hk::bounds_at); dropout_mask has none
MASK_LEAVES = opcodes.POSITIONAL_OPS - {"dropout_mask"}


def fused_masks(program: Program, accepts: Callable[[Value], bool]) -> dict[Op, Op]:
    """{mask op: the where op it is evaluated in} for selects whose mask is a tree of causal/bounds masks
    joined by and/or/not, each node used once, every node and the select in a layout the backend's library
    evaluates positions of (`accepts`): the select evaluates the tree at each element it writes (hk::where_at),
    so no mask tile is ever held or packed (attention's edge blocks: on the H200 the packed 128x128 masks
    and their 64-bit comparisons cost three unmasked key blocks, perf-notes 2026-12-03 fifth session)."""
    uses = use_counts(program, carried=2)            # a carried value is never fused
    producers = {r: o for o in program.body.walk() for r in o.results}

    def tree(v: Value) -> list[Op] | None:
        o = producers.get(v)
        if o is None or uses.get(v, 0) != 1 or not accepts(v):
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
        if op.opcode == "where" and accepts(op.result):
            t = tree(op.operands[0])
            if t is not None:
                out.update({m: op for m in t})
    return out


TILE_INVARIANT_OPS = opcodes.GRID_INVARIANT_SCALAR_OPS


def tile_invariant(program: Program) -> list[Op]:
    """The body's top-level scalar ops no block index reaches (kernel arguments, shapes, constants, the grid's
    extents and arithmetic on them), in order: a persistent block computes them once, before its tile loop."""
    known, out = set(program.body.args), []
    for op in program.body.ops:
        if op.opcode in TILE_INVARIANT_OPS and all(v in known for v in op.operands):
            out.append(op)
            known.update(op.results)
    return out


def invariant_divisors(program: Program, invariant: set[Value]) -> list[Value]:
    """The tile-invariant, non-constant divisors of i32 floor divisions and modulos that are not invariant
    themselves (anywhere in the body), each once in order: a divider (hk_core/divider.h) built before the tile
    loop divides by it in a multiply-high (a constant divisor the compiler turns into one already)."""
    consts = {o.result for o in program.body.ops if o.opcode == "scalar_const"}
    out: list[Value] = []
    for op in program.body.walk():
        if (op.opcode == "scalar_binary" and op.attrs["op"] in ("floordiv", "mod")
                and op.result.type.dtype.name == "i32" and op.result not in invariant):
            d = op.operands[1]
            if d in invariant and d not in consts and d not in out:
                out.append(d)
    return out
