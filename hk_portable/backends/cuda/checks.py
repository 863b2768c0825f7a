"""What the cuda device library takes, checked before any code is emitted: tile and vector shapes in its fragment
layouts, mma operands it can load, accumulators that fit in registers, shared memory within the target. Each
refusal is an UnsupportedError naming the value and the rule (a configuration choice then skips the candidate)."""
from __future__ import annotations

from ...codegen import resources
from ...codegen.cstyle import COL, ROW
from ...codegen.layouts import Strip, assign_vector_axes
from ...interface.backend import Target
from ...interface.errors import UnsupportedError
from ...interface.ir import Program, TileType
from .footprint import BUFFER_ALIGN, base_slack, layouts, num_warps, scratch_bytes


def _where(op) -> str:
    return f"'{op.opcode}'" + (f" ({op.attrs['op']})" if "op" in op.attrs else "")


def check(program: Program, target: Target) -> None:
    """UnsupportedError naming the value and the rule when the library cannot take this Program."""
    axes = assign_vector_axes(program)
    lay = layouts(program, num_warps(program, target))
    seen: set[int] = set()
    for op in program.body.walk():
        vals = list(op.operands) + list(op.results) + [a for r in op.regions for a in r.args]
        for v in vals:
            if v.id in seen or not isinstance(v.type, TileType):
                continue
            seen.add(v.id)
            t = v.type
            if isinstance(lay.get(v), Strip):
                continue                                # a strip holds whole chunks by construction
            if t.space == "rt" and (t.rows % 16 or t.cols % 8):
                raise UnsupportedError(
                    f"cuda ({target.arch}): register tile %{v.id} {t} at {_where(op)} must have a multiple of 16 rows "
                    f"and of 8 columns (the mma.sync m16n8k16 fragment layout); pick tile sizes like 16/32/64")
            if t.space == "rv":
                ax = axes.get(v, ROW)
                if ax == ROW and t.shape[0] % 16:
                    raise UnsupportedError(
                        f"cuda ({target.arch}): row vector %{v.id} {t} at {_where(op)} must have a multiple of 16 "
                        "elements (one per row of a register tile)")
                if ax == COL and t.shape[0] % 8:
                    raise UnsupportedError(
                        f"cuda ({target.arch}): column vector %{v.id} {t} at {_where(op)} must have a multiple of 8 "
                        "elements (one per column of a register tile)")
        if op.opcode == "mma":
            _check_mma(op, target)
            _check_accumulator(op, num_warps(program, target), target)
    _check_resources(program, target)


def _check_mma(op, target: Target) -> None:
    a, b, _ = (v.type for v in op.operands)
    ta = op.attrs["trans_a"]
    k = a.rows if ta else a.cols
    m = a.cols if ta else a.rows
    kstep = 32 if a.dtype.name.startswith("fp8") else 16      # mma.sync m16n8k32 (fp8), m16n8k16
    if k % kstep or m % 16:
        raise UnsupportedError(f"cuda ({target.arch}): mma needs M to be a multiple of 16 and K of {kstep} "
                               f"(mma.sync m16n8k{kstep}), got op(a) {m}x{k} from {a}")
    for name, t in (("a", a), ("b", b)):
        if t.space == "st" and (t.cols * t.dtype.bits // 8) % 16:
            raise UnsupportedError(f"cuda ({target.arch}): mma operand {name} {t} needs rows of whole 16-byte "
                                   "chunks for ldmatrix (a multiple of 8 columns)")
        if t.space == "st" and t.rows % 8:
            raise UnsupportedError(f"cuda ({target.arch}): mma operand {name} {t} needs a multiple of 8 rows")


MAX_ACC_PER_LANE = 128     # f32 accumulator registers per thread that still leave room for the operands


def _check_accumulator(op, warps: int, target: Target) -> None:
    """An mma accumulator in the fragment layout (16-row blocks dealt to warps) that holds more than
    MAX_ACC_PER_LANE f32 per thread would live in local memory: refuse it (a configuration choice then
    skips the candidate)."""
    rows, cols = op.operands[2].type.shape
    per_lane = -(-(-(-rows // 16)) // warps) * 16 * cols // 32
    if per_lane > MAX_ACC_PER_LANE:
        raise UnsupportedError(
            f"cuda ({target.arch}): the mma accumulator {op.operands[2].type} over {warps} warps holds {per_lane} "
            f"f32 per thread, more than the {MAX_ACC_PER_LANE} that leave registers for its operands (it would "
            "spill); use a smaller block or more warps")


def _check_resources(program: Program, target: Target) -> None:
    shared = resources.arena_bytes(program, BUFFER_ALIGN)
    total = resources.shared_bytes(shared, scratch_bytes(program, num_warps(program, target))) + base_slack(target)
    if total > target.max_shared_bytes:
        raise UnsupportedError(
            f"cuda ({target.arch}): kernel '{program.name}' needs {total} bytes of shared memory "
            f"({shared} for its buffers + {total - resources.scratch_offset(shared)} scratch), over the target's "
            f"{target.max_shared_bytes} bytes; use smaller tiles or fewer stages")
