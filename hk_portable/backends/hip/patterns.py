"""IR patterns hk_hip's library lowers in forms of its own: masks evaluated where a select writes, lazy rescales,
folded scales, the interleaved PV mma, pipeline load cursors and loads fused into their one use.

Each finder reads the layouts the plan chose; schedule.make_plan (the one module that decides) runs each once and
records what it found in the Plan, and codegen.HipEmitter renders those records without calling a finder again.
"""
from __future__ import annotations

from itertools import pairwise

from ...codegen import patterns as common
from ...codegen.layouts import TFragment, WaveGrid
from ...interface import opcodes
from ...interface.ir import Op, Program, Region, Value


# ------------------------------------------------------------------------------------------ fused masks
def where_at_takes(lay: dict, v: Value) -> bool:
    """Whether hk::where_at evaluates masks at the positions of v's layout: it is written for transposed-fragment
    tiles (attention's edge tiles: three 256x64 masks would be 96 VGPRs a lane, or as lane masks more SGPRs than
    there are)."""
    return isinstance(lay.get(v), TFragment)


def fused_masks(program: Program, lay: dict) -> dict[Op, Op]:
    """codegen.patterns.fused_masks for selects into the layouts hk::where_at takes here."""
    return common.fused_masks(program, lambda v: where_at_takes(lay, v))


def lazy_rescales(program: Program, lay: dict) -> dict[Op, tuple[Value, Value]]:
    """{mul op: (tile, row vector)} for the accumulator rescales of transposed-fragment mmas: an f32 tile times a
    row vector broadcast along its rows whose only use is the accumulator of an mma into a transposed fragment
    (attention's acc * alpha[:, None]). hk::mma_rescaled runs the mma on the unscaled accumulator when every
    factor the wave holds is 1 (no row's running max moved: x * 1 == x, bit for bit), the lazy rescale."""
    uses, producers = common.uses_and_producers(program)
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
    """codegen.patterns.folded_scales on transposed-fragment tiles (hk::reduce_scaled, hk::fms_rows there), and
    the same fold through a select that masks the scaled tile with -inf (attention's edge tiles):
    codegen.patterns.masked_scales."""
    tfrag = lambda v: isinstance(lay.get(v), TFragment)     # noqa: E731
    return {**common.folded_scales(program, tfrag), **common.masked_scales(program, tfrag)}


def nan_row_casts(program: Program, lay: dict) -> dict[Op, tuple[Op, Value]]:
    """{cast op: (mma op, row sums)} for the f32 -> bf16 conversions of a transposed-fragment tile P = exp2(x)
    whose one use is the A operand of an mma into a transposed fragment, when the same region sums P along its
    rows before that mma (attention's P, its row sum l and P @ V). hk::cast_finite converts without the NaN arm
    of round-to-nearest-even and hk::nan_rows sets the mma's rows whose sum is NaN to NaN afterwards: exp2 is
    never below 0, so a row's sum is NaN exactly when the row holds a NaN, and a NaN in row i of A makes row i of
    the product NaN, whatever else the row holds. The product is then what the exact conversion gives, NaN for
    NaN, with 3 VALU an element fewer on an arch that converts in software (the caller asks only there)."""
    uses, producers = common.uses_and_producers(program)
    tfrag = lambda v: isinstance(lay.get(v), TFragment)     # noqa: E731
    out: dict[Op, tuple[Op, Value]] = {}
    for reg in [program.body, *(r for o in program.body.walk() for r in o.regions)]:
        ops = list(reg.ops)
        at = {o: k for k, o in enumerate(ops)}
        for op in ops:
            if op.opcode != "cast" or op.result.type.dtype.name != "bf16":
                continue
            x = op.operands[0]
            p = producers.get(x)
            if (x.type.space != "rt" or x.type.dtype.name != "f32" or not tfrag(x) or not tfrag(op.result)
                    or p is None or p.opcode != "unary" or p.attrs["op"] != "exp2"):
                continue
            users = uses.get(op.result, [])
            if len(users) != 1 or users[0] not in at:
                continue
            m = users[0]
            if (m.opcode != "mma" or m.attrs["trans_a"] or m.operands[0] is not op.result
                    or any(v is op.result for v in m.operands[1:]) or not tfrag(m.result)
                    or m.result.type.dtype.name != "f32"):
                continue
            sums = [r for r in uses.get(x, []) if r in at and at[r] < at[m] and r.opcode == "reduce"
                    and r.attrs["op"] == "sum" and r.attrs["axis"] == "row" and r.operands[0] is x
                    and r.result.type.dtype.name == "f32" and tfrag(r.result)]
            if sums:
                out[op] = (m, sums[0].result)
    return out


# ------------------------------------------------------------------------------------ interleaved mma
def interleaved_pv(program: Program, lay: dict, lazy: dict[Op, tuple]) -> dict[Op, dict]:
    """The mmas of pipeline compute steps whose MFMAs hk_hip interleaves with the VALU work in front of them
    (mma.h, mma_tfrag_regs<IL = true>): an mma at the top level of a compute step into a transposed-fragment
    accumulator whose A is a 16-bit transposed-fragment register tile (attention's PV product, A = P). P's
    exp2, its bf16 conversion and its row sum are then in the mma's basic block, and sched_group_barriers
    issue them under the MFMAs of the k-steps before the columns they feed (HipKittens' MFMA/exp
    interleaving). Steps that apply masks (attention's edge tiles) are left as they are. The conversion of
    P is emitted branch-free (hk::cast_select). A lazy rescale of the accumulator (`lazy`: lazy_rescales) is a
    branch; it is hoisted, with the ops it needs, to just after the last op those need (`order`: the compute
    step's ops in emission order), so the branch comes before the work the MFMAs are interleaved with rather
    than between the two. {mma op: {"pipeline": its pipeline op, "order": [ops] or None (program order),
    "rescale": the lazy mul op or None}}."""
    out: dict[Op, dict] = {}
    producers = {r: o for o in program.body.walk() for r in o.results}
    for pipe in program.body.walk():
        if pipe.opcode != "pipeline":
            continue
        creg = pipe.regions[1]
        if any(o.opcode in common.MASK_LEAVES for o in creg.walk()):
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
            out[op] = {"pipeline": pipe, "order": _hoisted(creg, mul) if rescale is not None else None,
                       "rescale": rescale}
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


# ------------------------------------------------------------------------------------------------ loads
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


def fused_grid_loads(program: Program, lay: dict) -> dict[Op, tuple[Op, int]]:
    """Register loads of wave-grid tiles that the emitter folds into their one use, an elementwise binary op
    right after them in the same region (nothing in between): hk_hip's load_binary loads and combines element
    by element inside the load's mode branches (a second whole tile next to the accumulator spills: gemm_fp8's
    scale tiles). {binary op: (the load, the operand it was)}."""
    uses = common.use_counts(program)
    out: dict[Op, tuple[Op, int]] = {}
    for ops in [program.body.ops, *(reg.ops for o in program.body.walk() for reg in o.regions)]:
        for ld, nxt in pairwise(ops):
            if (ld.opcode == "global_to_register" and isinstance(lay.get(ld.result), WaveGrid)
                    and nxt.opcode == "binary" and uses.get(ld.result) == 1 and ld.result in nxt.operands
                    and nxt.operands[0] is not nxt.operands[1]
                    and ld.result.type == nxt.operands[1 - nxt.operands.index(ld.result)].type):
                out[nxt] = (ld, nxt.operands.index(ld.result))
    return out


# ------------------------------------------------------------------------------------------ fused epilogues
# what store_each computes per element (codegen.py HipEmitter.op_register_to_global): the grid tile's own ops
# (layouts.GRID_OPS: uniform, elementwise, loads from global memory) and a grid vector's broadcast; not compare or
# where, which make masks (grids take none)
EPILOGUE_OPS = (opcodes.UNIFORM_OPS | opcodes.ELEMENTWISE_OPS | opcodes.moves("global", "register")
                | {"broadcast"}) - {"compare", "where"}


def fused_epilogues(program: Program, lay: dict) -> dict[Op, list[Op]]:
    """Stores of wave-grid tiles with the elementwise ops that make the stored tile fused into them: the run of ops
    right before the store in its region (binary and unary arithmetic, casts, fills, broadcasts of grid vectors,
    loads of grid tiles from global memory) whose results are read only inside the run or by the store, all
    wave-grid tiles of the stored tile's shape. hk_hip's store_each computes each element from the run's leaves
    (the accumulator, the vectors, the tensors read) and stores it as it is made, so no whole tile of
    intermediate, loaded or converted values sits beside the accumulator (gemm_fp8's 256x256 block on gfx942
    spilled 67 VGPRs in its scale-and-cast epilogue; the GELU epilogue of the README's tutorial spilled its
    256x256 block on both archs). {store op: the run's ops in program order}."""
    users: dict[Value, list[Op]] = {}
    escaping: set[Value] = set()
    for op in program.body.walk():
        for v in op.operands:
            users.setdefault(v, []).append(op)
        for r in op.regions:
            escaping.update(r.yields)
    out: dict[Op, list[Op]] = {}
    for ops in [program.body.ops, *(reg.ops for o in program.body.walk() for reg in o.regions)]:
        for at, st in enumerate(ops):
            if st.opcode != "register_to_global":
                continue
            x = st.operands[1]
            grid = lay.get(x)
            if not isinstance(grid, WaveGrid) or x.type.space != "rt" or x.type.dtype.name == "bool":
                continue
            run: list[Op] = []
            for op in reversed(ops[:at]):
                r = op.result if len(op.results) == 1 else None
                if (r is None or not _epilogue_op(op, x, grid, lay) or r in escaping or not users.get(r)
                        or any(u is not st and u not in run for u in users[r])):
                    break
                run.append(op)
            if run and any(x in op.results for op in run):
                out[st] = run[::-1]
    return out


def _epilogue_op(op: Op, x: Value, grid: WaveGrid, lay: dict) -> bool:
    """An op store_each can evaluate per element: its result a wave-grid tile like x (any element dtype but bool),
    its tile operands such tiles, a broadcast's operand a vector of that grid."""
    if op.opcode not in EPILOGUE_OPS:
        return False
    r = op.result
    if r.type.space != "rt" or r.type.shape != x.type.shape or r.type.dtype.name == "bool" or lay.get(r) != grid:
        return False
    if op.opcode == "broadcast":
        v = op.operands[0]
        return v.type.space == "rv" and lay.get(v) == grid
    if op.opcode in opcodes.ELEMENTWISE_OPS:
        return all(getattr(v.type, "space", None) == "rt" and v.type.shape == x.type.shape and lay.get(v) == grid
                   and v.type.dtype.name != "bool" for v in op.operands)
    return True
