"""Layout assignment: the pass that gives every register tile (RT) and register vector (RV) of a Program a
distribution over the block's warps and lanes (DESIGN.md §3, "assign layouts").

Two layouts exist:

- `Fragment`: the matrix instruction's fragment layout (rows of a tile dealt to the warps in 16-row
  blocks; inside a block the lane map of mma.sync m16n8k16 / the MFMA). Every tile can take it, and an
  mma operand, accumulator or a tile moved to or from shared memory must.
- `Strip(wr, wc)`: rows over `wr` warp-rows, each row cut into 8-element chunks dealt round robin to the
  lanes (32 on NVIDIA, 64 on AMD) of `wc` warps (wr * wc = the block's warps). A lane's chunk is 16
  contiguous bytes of a 16-bit tensor, so loads and stores are whole vectors and a warp touches whole lines;
  a row is reduced with lane shuffles (DPP on AMD) plus, when wc > 1, one exchange through shared memory.
  Any row count works, which is what a memory-bound kernel (a norm over one row per block) needs.
  A *narrow* strip (`lr` > 0, where the backend implements it: cuda) is for rows too short for a warp:
  each row is dealt to `lr` lanes (a power of two below the warp), so a warp holds lanes / lr rows and the
  block's thread-rows are warps * lanes / lr; warp-columns are 1. Rotary's 64-element half rows (8 lanes a
  row, 4 rows a warp) and attention backward's rowsum(dO o O) over 128-element rows are the cases. A row
  reduction stays inside the row's lane group (shuffles over lr lanes); components with a column reduction,
  or with a row reduction and a vector spread back over a tile (the norms: they spilled), do not take it.

A backend may offer two more for mma accumulators (`WaveGrid`: a warp grid over the tile; `TFragment`: the
fragment layout of the transpose, for components holding a register A operand, see `tfrag_components`).

Values are joined into components that must share a layout (operands and result of an elementwise op,
a reduction's tile and vector, a broadcast's vector and tile, a loop's init, carry, yield and result).
A component that touches an mma or shared memory is pinned to `Fragment`; a free component takes a
`Strip` when the backend offers it and one divides every tile of the component evenly, else `Fragment`.
Because `Fragment` takes every use, no two uses of one value ever disagree, so no conversion op is needed
yet. The vector axes (ROW/COL) are a separate small pass, `assign_vector_axes`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..interface import opcodes
from ..interface.errors import UnsupportedError
from ..interface.ir import Op, Program, TileType, Value

ROW, COL = "ROW", "COL"
CHUNK = 8                   # elements per lane chunk of a strip (16 bytes of a 16-bit tensor)

# the matrix instruction's layout: what an mma's operands and accumulator and a copy to or from shared memory take
PINNED_TO_FRAGMENT = opcodes.CONTRACTION_OPS | opcodes.moves_between("register", "shared")
# ops whose register operands and results share one layout: elementwise ones, and a reduction's tile and vector,
# a broadcast's vector and tile
SHARE_A_LAYOUT = opcodes.ELEMENTWISE_OPS | opcodes.ALONG_AXIS_OPS


@dataclass(frozen=True)
class Fragment:
    def template_arg(self) -> str:
        return ""

    def __str__(self) -> str:
        return "fragment"


@dataclass(frozen=True)
class Strip:
    wr: int                 # warp-rows: row r lives in warp-row r % wr
    wc: int                 # warps across a row: chunk q lives in lane q % lanes of warp (q // lanes) % wc
    lr: int = 0             # narrow strip: lanes per row (< a warp; wc == 1); 0: whole warps across a row

    def template_arg(self) -> str:
        return f"hk::strip<{self.wr}, {self.lr}>" if self.lr else f"hk::strip<{self.wr}>"

    def __str__(self) -> str:
        narrow = f", lanes-per-row={self.lr}" if self.lr else ""
        return f"strip(warp-rows={self.wr}, warps-per-row={self.wc}{narrow}, chunk={CHUNK})"


FRAGMENT = Fragment()


@dataclass(frozen=True)
class WaveGrid:
    """An mma accumulator over a wm x wn grid of warps: warp w holds the row blocks of grid row w // wn
    and the column blocks of grid column w % wn (16x16 blocks in the fragment's lane map), so each warp
    reads only its rows of A and its columns of B instead of all of B."""
    wm: int
    wn: int

    def template_arg(self) -> str:
        return f"hk::grid<{self.wm}, {self.wn}>"

    def __str__(self) -> str:
        return f"wave grid ({self.wm} x {self.wn} warps)"


@dataclass(frozen=True)
class ColMajor:
    """Shared-memory storage of a tile with its columns contiguous (the transpose of the default row-major
    storage): what a matrix operand whose K runs down the tile's rows needs to be read k-contiguous."""
    def template_arg(self) -> str:
        return "hk::colmajor"

    def __str__(self) -> str:
        return "column-major storage (k-contiguous mma reads)"


COL_MAJOR = ColMajor()


@dataclass(frozen=True)
class TFragment:
    """The fragment layout of the tile's transpose: rows in 16-row blocks dealt to the warps as Fragment, but
    inside a block element (i, j) sits where the fragment layout keeps (j, i) -- a lane holds consecutive
    columns of one row. An mma into such an accumulator computes its transpose (operands swapped: Sᵀ = K·Qᵀ),
    which leaves a register A operand (attention's P) in the lane map of the other operand of the next
    mma, read in place instead of gathered, and row reductions inside a lane plus one exchange across lane
    groups. Offered by a backend whose library implements it (hip: `tfrag_components`)."""
    def template_arg(self) -> str:
        return "hk::tfrag"

    def __str__(self) -> str:
        return "transposed fragment"


TFRAG = TFragment()


class _UnionFind:
    def __init__(self):
        self.parent: dict[Value, Value] = {}

    def find(self, v: Value) -> Value:
        while self.parent.get(v, v) is not v:
            v = self.parent[v]
        return v

    def union(self, a: Value, b: Value) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb


def is_tile(v: Value, *spaces: str) -> bool:
    return isinstance(v.type, TileType) and v.type.space in spaces


def _carry_links(op: Op):
    """(init, region arg, yield, result) links of a loop's carried values."""
    for reg in op.regions:
        if op.opcode == "for":
            inits, args = op.operands[2:], reg.args[1:]
        elif op.opcode == "pipeline":
            inits, args = op.operands[1:], reg.args[2:] if reg.name == "compute" else []
        else:
            inits, args = [], []
        yield from zip(inits, args)
        for y, r, a in zip(reg.yields, op.results, args):
            yield y, r
            yield y, a


def all_values(program: Program):
    for op in program.body.walk():
        yield from list(op.operands) + list(op.results) + [a for r in op.regions for a in r.args]


# ------------------------------------------------------------------------------------ vector axes
def assign_vector_axes(program: Program) -> dict[Value, str]:
    """Give every RV value an axis: ROW (one value per tile row) or COL (per tile column).

    Axes come from reductions (row_*/col_*) and broadcasts, and flow through elementwise ops, where,
    loop carries and yields. An RV used as both is rejected (a conversion is not implemented)."""
    uf = _UnionFind()
    fixed: list[tuple[Value, str, Op]] = []
    for op in program.body.walk():
        rvs = [v for v in list(op.operands) + list(op.results) if is_tile(v, "rv")]
        if op.opcode == "reduce":
            fixed.append((op.result, ROW if op.attrs["axis"] == "row" else COL, op))
        elif op.opcode == "broadcast":
            fixed.append((op.operands[0], ROW if op.attrs["axis"] == "row" else COL, op))
        elif op.opcode in opcodes.ELEMENTWISE_OPS:
            for v in rvs[1:]:
                uf.union(rvs[0], v)
        for a, b in _carry_links(op):
            if is_tile(a, "rv"):
                uf.union(a, b)
    axis: dict[Value, str] = {}
    for v, ax, op in fixed:
        root = uf.find(v)
        if axis.get(root, ax) != ax:
            raise UnsupportedError(f"register vector %{v.id} ({v.type}) is used both as a row and a column "
                                   f"vector (at '{op.opcode}'); compute it twice or store and reload it")
        axis[root] = ax
    return {v: axis.get(uf.find(v), ROW) for v in all_values(program) if is_tile(v, "rv")}


# ------------------------------------------------------------------------------------ tile layouts
# what a wave-grid accumulator may meet besides its mma: ops that touch each element where it lies (hk_hip's grid
# tiles have loads, stores, fills, elementwise arithmetic and a vector's broadcast; no masks or reductions). Not
# compare or where either: the grid was made for gemm's epilogue, which selects nothing, and selects are not tried
# in it.
GRID_OPS = (opcodes.UNIFORM_OPS | opcodes.ELEMENTWISE_OPS | opcodes.moves_between("register", "global")
            | opcodes.CONTRACTION_OPS | opcodes.CONTROL_OPS | {"broadcast"}) - {"compare", "where"}
# what a register vector joined to a wave grid may meet: a load, fills, elementwise arithmetic on vectors and its
# broadcast onto the tile (an epilogue's bias or per-column scale); hk_hip's grid vectors have no store and no
# reduction makes one
GRID_VECTOR_OPS = (opcodes.UNIFORM_OPS | opcodes.ELEMENTWISE_OPS | opcodes.moves("global", "register")
                   | {"broadcast"}) - {"compare", "where"}


def _shared_operand_mma(op: Op) -> bool:
    return op.opcode == "mma" and all(is_tile(v, "st") for v in op.operands[:2])


def _components(program: Program, grids: bool = False) -> tuple[_UnionFind, set[Value]]:
    """Join values that must share a layout; return the union-find and the values pinned to Fragment.
    With `grids`, an mma whose A and B are shared tiles joins its accumulator and result instead of
    pinning them (they may take a WaveGrid)."""
    uf, pinned = _UnionFind(), set()
    for op in program.body.walk():
        tiles = [v for v in list(op.operands) + list(op.results) if is_tile(v, "rt", "rv")]
        if grids and _shared_operand_mma(op):
            uf.union(op.operands[2], op.result)
        elif op.opcode in PINNED_TO_FRAGMENT:
            pinned.update(tiles)
        elif op.opcode in SHARE_A_LAYOUT:
            for v in tiles[1:]:
                uf.union(tiles[0], v)
        for a, b in _carry_links(op):
            if is_tile(a, "rt", "rv"):
                uf.union(a, b)
    return uf, pinned


def _strip_for(members: list[Value], axes: dict[Value, str], warps: int, lanes: int,
               narrow: bool = False, refused: bool = False) -> Strip | None:
    """The strip with the most warp-rows (rows stay inside a warp: row reductions need no shared memory)
    that divides every tile of the component into whole chunks; failing that, with `narrow` and a component
    _narrow_refused does not refuse (`refused`), the narrow strip with the most lanes per row that does;
    None if there is none or no tile."""
    rows = {v.type.shape[0] for v in members if v.type.space == "rt"}
    cols = {v.type.shape[1] for v in members if v.type.space == "rt"}
    if not rows:
        return None
    rows |= {v.type.shape[0] for v in members if v.type.space == "rv" and axes.get(v) == ROW}
    cols |= {v.type.shape[0] for v in members if v.type.space == "rv" and axes.get(v) == COL}
    wr = warps
    while wr >= 1:
        wc = warps // wr
        if warps % wr == 0 and all(r % wr == 0 for r in rows) and all(c % (CHUNK * lanes * wc) == 0 for c in cols):
            return Strip(wr, wc)
        wr //= 2
    if narrow and not refused:
        lr = lanes // 2
        while lr >= 1:
            thread_rows = warps * (lanes // lr)
            if all(r % thread_rows == 0 for r in rows) and all(c % (CHUNK * lr) == 0 for c in cols):
                return Strip(warps, 1, lr)
            lr //= 2
    return None


def _grid_for(members: list[Value], uses: dict[Value, set[str]], warps: int,
              axes: dict[Value, str]) -> WaveGrid | None:
    """The wave grid for a component of mma accumulators (rt tiles met only by GRID_OPS, and the register vectors
    broadcast onto them, met only by GRID_VECTOR_OPS) that divides every tile and vector into whole 16-element
    blocks per warp and reads the fewest operand rows and columns per warp (R/wm + C/wn); None when no grid beats
    the fragment layout (one warp column)."""
    tiles = [v for v in members if v.type.space == "rt"]
    vectors = [v for v in members if v.type.space == "rv"]
    if len(tiles) + len(vectors) < len(members) or any(uses.get(v, set()) - GRID_OPS for v in tiles) \
            or any(uses.get(v, set()) - GRID_VECTOR_OPS for v in vectors):
        return None
    if not any("mma" in uses.get(v, set()) for v in members):
        return None
    shapes = {v.type.shape for v in tiles}
    rows = {v.type.shape[0] for v in vectors if axes.get(v) == ROW}
    cols = {v.type.shape[0] for v in vectors if axes.get(v) == COL}
    best = None
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if all(r % (16 * wm) == 0 and c % (16 * wn) == 0 for r, c in shapes) and \
                all(r % (16 * wm) == 0 for r in rows) and all(c % (16 * wn) == 0 for c in cols):
            cost = max(r // wm + c // wn for r, c in shapes)
            if best is None or cost < best[0]:
                best = (cost, WaveGrid(wm, wn))
    return best[1] if best is not None and best[1].wn > 1 else None


def _narrow_refused(program: Program, uf: _UnionFind) -> set[Value]:
    """Values whose component (in `uf`, the layout pass's) may not take a narrow strip: those of a column reduction,
    and of a row reduction in a component that also spreads a vector over a tile (assign_layouts says why)."""
    reduced, spread, out = set(), set(), set()
    for op in program.body.walk():
        regs = [v for v in (*op.operands, *op.results) if is_tile(v, "rt", "rv")]
        if op.opcode == "reduce":
            (out if op.attrs["axis"] != "row" else reduced).update(regs)
        elif op.opcode == "broadcast":
            spread.update(regs)
    roots = {uf.find(v) for v in reduced} & {uf.find(v) for v in spread}
    return out | {v for v in reduced | spread if uf.find(v) in roots}


def _uses(program: Program) -> dict[Value, set[str]]:
    """The opcodes that define or use each tile value."""
    out: dict[Value, set[str]] = {}
    for op in program.body.walk():
        for v in list(op.operands) + list(op.results):
            out.setdefault(v, set()).add(op.opcode)
        for r in op.regions:
            for a in r.args:
                out.setdefault(a, set()).add(op.opcode)
            for y in r.yields:
                out.setdefault(y, set()).add(op.opcode)
    return out


def assign_layouts(program: Program, warps: int, strips: bool, lanes: int = 32,
                   axes: dict[Value, str] | None = None,
                   grids: bool = False, tfrags: bool = False,
                   narrow: bool = False) -> dict[Value, Fragment | Strip | WaveGrid]:
    """Every RT and RV value's layout for a block of `warps` warps/waves of `lanes` lanes. `strips`: whether
    the backend's library implements Strip; `narrow`: whether it implements narrow strips (Strip.lr) and
    row reductions over them;
    `grids`: whether it implements WaveGrid accumulators; `tfrags`: whether it implements TFragment
    (tfrag_components); `axes`: assign_vector_axes(program), if the caller has it."""
    axes = assign_vector_axes(program) if axes is None else axes
    uf, pinned = _components(program, grids)
    uses = _uses(program) if grids else {}
    # a narrow strip takes a row reduction whose vector is not spread back over tiles (rowsum(dO o O) stored as is),
    # not column reductions: the norms (mean and variance broadcast back onto the row) spilled 24-252 bytes at 255
    # registers on sm_80 and sm_90a in narrow strips (2026-12-07), where the fragment layout spilled nothing
    no_narrow = _narrow_refused(program, uf) if narrow else set()
    values = {v for v in all_values(program) if is_tile(v, "rt", "rv")}
    groups: dict[Value, list[Value]] = {}
    for v in values:
        groups.setdefault(uf.find(v), []).append(v)
    out: dict[Value, Fragment | Strip | WaveGrid] = {}
    for members in groups.values():
        layout = None
        if any(v in pinned for v in members):
            pass
        elif grids and any("mma" in uses.get(v, set()) for v in members):
            layout = _grid_for(members, uses, warps, axes)    # an accumulator: a grid or the fragment layout
        elif strips:
            layout = _strip_for(members, axes, warps, lanes, narrow, any(v in no_narrow for v in members))
        for v in members:
            out[v] = layout or FRAGMENT
    if tfrags:
        for members in tfrag_components(program):
            if all(out.get(v, FRAGMENT) is FRAGMENT for v in members):
                out.update({v: TFRAG for v in members})
    return out


# what a transposed-fragment component may meet: elementwise ops, row reductions, broadcasts, masks made where each
# element lies, stores (global or shared), loads of vectors (hk_hip has no transposed-fragment tile load), loop
# carries, and the two kinds of mma below. Not atomic_add or dropout masks: not implemented for the layout.
TFRAG_OPS = (opcodes.UNIFORM_OPS | opcodes.ELEMENTWISE_OPS | opcodes.ALONG_AXIS_OPS | opcodes.POSITIONAL_OPS
             | opcodes.moves("register", ("global", "shared")) | opcodes.moves("global", "register")
             | opcodes.CONTRACTION_OPS | opcodes.CONTROL_OPS) - {"atomic_add", "dropout_mask"}
TFRAG_VECTOR_ONLY = opcodes.moves("global", "register")     # a vector's load (a tile's is not implemented)
TFRAG_MMA_DTYPES = ("bf16", "f16")


def _tfrag_mma_kind(op: Op) -> str | None:
    """'st': both operands shared tiles (the accumulator computes its transpose); 'rt_a': a register A, not
    transposed, times a shared B (A read in place as the other operand's fragment); None: neither, or an
    operand dtype the transposed form does not take (fp8 pairs name their formats by position)."""
    a, b = op.operands[:2]
    if a.type.dtype.name not in TFRAG_MMA_DTYPES or b.type.dtype.name not in TFRAG_MMA_DTYPES:
        return None
    if is_tile(a, "st") and is_tile(b, "st"):
        return "st"
    if is_tile(a, "rt") and is_tile(b, "st") and not op.attrs["trans_a"]:
        return "rt_a"
    return None


def tfrag_components(program: Program) -> list[list[Value]]:
    """The register values that take TFragment: components (joined through elementwise ops, row broadcasts
    and reductions, loop carries, and both kinds of `_tfrag_mma_kind` mma: accumulator, result and a register
    A) that hold a register A operand of an mma ('rt_a', the gather this layout removes), meet only TFRAG_OPS
    (reductions along rows; broadcasts of row vectors and of column vectors, attention_bwd's lse and delta along
    the columns of Sᵀ; loads of vectors, not of tiles; stores to global or shared), and whose tiles are whole
    16x16 blocks."""
    uf, bad, has_rt_a = _UnionFind(), set(), set()
    # a fill is one value per (type, constant, region) (ops._full), so every zero accumulator of one shape in a
    # loop body is the same value: an mma does not join its component through one that several mmas start from
    # (the emitter makes the fill afresh where the layouts differ: HipEmitter._acc_name)
    accs = Counter(op.operands[2] for op in program.body.walk() if op.opcode == "mma")
    fills = {op.result for op in program.body.walk() if op.opcode == "fill" and accs[op.result] > 1}
    for op in program.body.walk():
        tiles = [v for v in list(op.operands) + list(op.results) if is_tile(v, "rt", "rv")]
        if op.opcode == "mma":
            kind = _tfrag_mma_kind(op)
            if kind is None:
                bad.update(v for v in tiles if v not in fills)
            else:
                joined = [v for v in tiles if not (v is op.operands[2] and v in fills)]
                for v in joined[1:]:
                    uf.union(joined[0], v)
                if kind == "rt_a":
                    has_rt_a.add(op.operands[0])
        elif op.opcode in SHARE_A_LAYOUT:
            if op.opcode in opcodes.ALONG_AXIS_OPS and op.opcode != "broadcast" and op.attrs["axis"] != "row":
                bad.update(tiles)       # a reduction down the columns (a broadcast of a column vector is fine)
            for v in tiles[1:]:
                uf.union(tiles[0], v)
        elif op.opcode not in TFRAG_OPS or (op.opcode in TFRAG_VECTOR_ONLY and any(is_tile(r, "rt") for r in op.results)):
            bad.update(tiles)
        for a, b in _carry_links(op):
            if is_tile(a, "rt", "rv"):
                uf.union(a, b)
    groups: dict[Value, list[Value]] = {}
    for v in all_values(program):
        if is_tile(v, "rt", "rv"):
            groups.setdefault(uf.find(v), [])
            if v not in groups[uf.find(v)]:
                groups[uf.find(v)].append(v)
    out = []
    for members in groups.values():
        whole = all(v.type.shape[0] % 16 == 0 and (v.type.space == "rv" or v.type.shape[1] % 16 == 0)
                    for v in members)
        if whole and not any(v in bad for v in members) and any(v in has_rt_a for v in members):
            out.append(members)
    return out


# ------------------------------------------------------------------------------- shared storage
def shared_buffer_uses(program: Program) -> tuple[dict[Value, list[Value]], list[tuple[Op, int, Value]]]:
    """(each shared buffer's stage views, every use of a buffer or of a stage of it as (op, operand index,
    buffer)): what a storage decision about a whole buffer reads. Taking a stage view is not a use."""
    producers = {r: op for op in program.body.walk() for r in op.results}
    stages: dict[Value, list[Value]] = {}
    uses: list[tuple[Op, int, Value]] = []
    for op in program.body.walk():
        if op.opcode == "shared_stage":
            stages.setdefault(op.operands[0], []).append(op.result)
        for i, v in enumerate(op.operands):
            src = producers.get(v)
            if src is None or src.opcode not in opcodes.SHARED_VIEW_OPS:
                continue
            if op.opcode == "shared_stage" and i == 0:
                continue
            uses.append((op, i, v if src.opcode == "alloc_shared" else src.operands[0]))
    return stages, uses


def with_stages(ok: dict[Value, bool], stages: dict[Value, list[Value]], what) -> dict:
    """{buffer and each of its stage views: what} for the buffers `ok` accepts."""
    out = {}
    for buf, good in ok.items():
        if good:
            out[buf] = what
            out.update({st: what for st in stages.get(buf, [])})
    return out


def assign_shared_storage(program: Program) -> dict[Value, ColMajor]:
    """The shared buffers (and their stage views) stored column-major: those whose only uses are copies in
    from global memory and mma operands that read K down the tile's rows (B not transposed: [K, N]; A
    transposed: [K, M]). Stored transposed on the way in, such a tile gives the mma k-contiguous
    fragments (vector reads) instead of one 16-bit gather per element. Buffers with any other use keep
    row-major storage."""
    stages, uses = shared_buffer_uses(program)
    ok: dict[Value, bool] = {}
    for op, i, buf in uses:
        k_down_rows = op.opcode == "mma" and ((i == 1 and not op.attrs["trans_b"]) or
                                              (i == 0 and op.attrs["trans_a"]))
        if k_down_rows:
            ok.setdefault(buf, True)
        elif not (op.opcode == "global_to_shared" and i == 0):
            ok[buf] = False
    return with_stages(ok, stages, COL_MAJOR)


def strip_reduce_scratch(op: Op, layout: Strip, warps: int) -> int:
    """Shared bytes a reduction over a strip tile exchanges between warps, as both libraries lay it out: one
    f32 partial per warp and row slot (row: when a row spans warps), or per warp-row and column (col: when
    the rows span warp-rows); 0 when the reduction stays inside each warp."""
    rows, cols = op.operands[0].type.shape
    if op.attrs["axis"] == "row":
        return warps * (rows // layout.wr) * 4 if layout.wc > 1 else 0
    return layout.wr * cols * 4 if layout.wr > 1 else 0


def all_strips(layouts: dict[Value, Fragment | Strip]) -> bool:
    """Whether a Program has register tiles and every register value is in a strip: a memory-bound kernel laid
    out for whole-vector accesses (what a backend's configuration choice looks for)."""
    regs = {v: x for v, x in layouts.items() if is_tile(v, "rt", "rv")}
    return any(v.type.space == "rt" for v in regs) and all(isinstance(x, Strip) for x in regs.values())


def all_grids(program: Program, layouts: dict) -> bool:
    """Whether a Program has mma ops and every mma accumulator is in a wave grid (what the hip backend's
    configuration choice looks for: tiles large enough to share operand reads across warps)."""
    accs = [op.operands[2] for op in program.body.walk() if op.opcode == "mma"]
    return bool(accs) and all(isinstance(layouts.get(v), WaveGrid) for v in accs)


def all_wide_accumulators(program: Program, layouts: dict, warps: int) -> bool:
    """Whether every mma accumulator is in a wave grid, or in TFragment with two or more 16-row blocks per
    warp (each shared operand fragment a warp reads feeds two or more MMAs): what the hip backend's
    configuration choice looks for."""
    accs = [op.operands[2] for op in program.body.walk() if op.opcode == "mma"]
    if not accs:
        return False
    for v in accs:
        lay = layouts.get(v)
        if isinstance(lay, TFragment):
            if v.type.shape[0] // 16 < 2 * warps:
                return False
        elif not isinstance(lay, WaveGrid):
            return False
    return True


def describe(program: Program, layouts: dict[Value, Fragment | Strip | ColMajor]) -> list[str]:
    """One line per value that is not in the default layout (register values: Fragment; shared tiles:
    row-major), and a count of the register values that are."""
    lines, frag = [], 0
    for v in sorted(layouts, key=lambda v: v.id):
        if isinstance(layouts[v], Fragment):
            frag += 1
        else:
            lines.append(f"%{v.id} {v.type}: {layouts[v]}")
    return [f"{frag} register values in the fragment layout"] + lines
