"""The opcode table: the one list of the Tile IR's opcodes and what each one takes and makes.

Every other place that knows opcodes reads this table: the tracer (emit refuses an unknown opcode),
the verifier (`verify.py` checks every op of a Program against its entry), the reference interpreter
and the C++ emitter (one `op_<name>` rule per opcode, checked when they are imported), and the
conformance runner (which capability a target must declare). Adding an opcode means one entry here
plus one rule per place that implements it; `tests/test_opcodes.py` fails until each exists.

Names say the data path where data moves (`global_to_shared`, `shared_to_register`, ...) and the
domain where the same operation exists twice (`scalar_binary` on i32/f32 scalars, `binary` on tiles).

An entry is plain data: `print(TABLE["mma"])`, or `python -m hk_portable.interface.opcodes` for all.
Its `role` says what the op does (elementwise, a mask from positions, a move and its path, ...); the opcode sets
the lowering decides by (SCALAR_OPS, ELEMENTWISE_OPS, moves(...)) are read off roles, types and effects at the end,
so a new opcode joins them by its entry alone.
What the table cannot say as data (a result type that follows from the operands, shapes that must
agree) is each opcode's rule in `verify.py`; the entry's `result_rule` says it in words.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from .ir import GlobalType, ScalarType, SharedBufType, TileType

# ------------------------------------------------------------------------------------ attribute values
UNARY = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "relu")
UNARY_INT = ("neg", "abs", "relu")                 # the unary ops also defined on i32 tiles
UNARY_MASK = ("not",)                              # the unary op on masks (bool tiles)
BINARY_ARITH = ("add", "sub", "mul", "div", "maximum", "minimum")
BINARY_LOGIC = ("and", "or")                       # on masks only
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
REDUCE = ("max", "min", "sum")
AXES = ("row", "col")
SCALAR_BINARY = ("add", "sub", "mul", "floordiv", "mod", "div", "min", "max")
SCALAR_DTYPES = ("i32", "f32")
VALUE_DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")   # every element type but bool
MMA_DTYPES = ("bf16", "f16", "fp8e4m3", "fp8e5m2")

# ----------------------------------------------------------------------------------- kinds of value
# The kind of a type: a scalar's dtype name, or the memory space of everything else.
I32, F32 = "i32", "f32"                  # scalars
GL, SMEM = "gl", "smem"                  # a global tensor argument, a shared allocation (all stages)
ST, RT, RV = "st", "rt", "rv"            # a shared tile view, a register tile, a register vector


def kind_of(t) -> str:
    if isinstance(t, ScalarType):
        return t.dtype.name
    if isinstance(t, GlobalType):
        return GL
    if isinstance(t, SharedBufType):
        return SMEM
    if isinstance(t, TileType):
        return t.space
    raise TypeError(f"not an IR type: {t!r}")


# ----------------------------------------------------------------------------------- what an op does
# One role per opcode (OpSpec.role): the facts the lowering's opcode sets are read from (see "roles" below).
SCALAR = "scalar"              # a scalar from scalars, the grid or a tensor's shape; touches no memory
SHARED_VIEW = "shared_view"    # names shared memory (a buffer, a stage's view of one); moves no data
MOVE = "move"                  # elements from one space to another (OpSpec.path), as they are or added in
UNIFORM = "uniform"            # a tile whose elements are all alike
POSITIONAL = "positional"      # element [r][c] from its position alone (masks)
ELEMENTWISE = "elementwise"    # element [r][c] from the operands' [r][c]
ALONG_AXIS = "along_axis"      # along rows or columns: a vector spread over a tile, a tile reduced to a vector
CONTRACTION = "contraction"    # sums of products over a shared dimension
CONTROL = "control"            # runs its regions
ROLES = (SCALAR, SHARED_VIEW, MOVE, UNIFORM, POSITIONAL, ELEMENTWISE, ALONG_AXIS, CONTRACTION, CONTROL)
SPACES = ("global", "shared", "register", "scalar")     # the ends of a move


@dataclass(frozen=True)
class TypeSpec:
    """The types one operand or result may have: its kinds and, for tiles/tensors/buffers, dtypes."""
    kinds: tuple[str, ...]
    dtypes: tuple[str, ...] | None = None      # None: any element type

    def matches(self, t) -> bool:
        try:
            kind = kind_of(t)
        except TypeError:
            return False
        if kind not in self.kinds:
            return False
        return self.dtypes is None or isinstance(t, ScalarType) or t.dtype.name in self.dtypes

    def __str__(self) -> str:
        dt = f"<{'|'.join(self.dtypes)}>" if self.dtypes is not None else ""
        return "|".join(self.kinds) + dt


@dataclass(frozen=True)
class Operand:
    name: str
    type: TypeSpec
    variadic: bool = False        # the last operand only: zero or more operands of this type

    def __str__(self) -> str:
        return f"{self.name}: {self.type}{'...' if self.variadic else ''}"


@dataclass(frozen=True)
class Attr:
    name: str
    types: tuple[type, ...]                  # exact Python types (bool is not an int here)
    values: tuple[Any, ...] | None = None    # the closed set of allowed values, if there is one

    def accepts(self, v) -> bool:
        return type(v) in self.types and (self.values is None or v in self.values)

    def __str__(self) -> str:
        if self.values is not None:
            return f"{self.name}={'|'.join(map(str, self.values))}"
        return f"{self.name}: {'|'.join(t.__name__ for t in self.types)}"


@dataclass(frozen=True)
class Effects:
    """What an op does to memory. Register tiles and scalars are SSA values: no effects."""
    reads: frozenset[str] = frozenset()      # of "global", "shared"
    writes: frozenset[str] = frozenset()
    of_regions: bool = False                 # a loop or pipeline: the effects of the ops in its regions

    @property
    def writes_global(self) -> bool:
        return "global" in self.writes

    @property
    def writes_shared(self) -> bool:
        return "shared" in self.writes

    def __str__(self) -> str:
        if self.of_regions:
            return "those of its regions"
        parts = [f"reads {s}" for s in sorted(self.reads)] + [f"writes {s}" for s in sorted(self.writes)]
        return ", ".join(parts) or "none"


def _effects(reads=(), writes=()) -> Effects:
    return Effects(frozenset(reads), frozenset(writes))


NO_EFFECTS = Effects()

# Where an op may appear. Every shared-memory write inside a pipeline's load region must also write
# a stage view `buf[s]` of that region's stage argument (checked for every op whose effects write
# shared memory), so that a backend may run loads ahead of computes.
ANYWHERE = "anywhere"
TOP_LEVEL = "top_level"                           # directly in the kernel body
NOT_IN_PIPELINE_LOAD = "not_in_pipeline_load"     # anywhere but in (or nested in) a pipeline's load region
PLACEMENTS = (ANYWHERE, TOP_LEVEL, NOT_IN_PIPELINE_LOAD)


@dataclass(frozen=True)
class RegionSpec:
    """A nested region: its leading arguments, then (if `carries`) one argument per carried value;
    a carrying region ends by yielding the new carry (the types of the op's `init` operands)."""
    name: str
    args: tuple[TypeSpec, ...]
    carries: bool

    def __str__(self) -> str:
        args = [str(a) for a in self.args] + (["carry..."] if self.carries else [])
        return f"^{self.name}({', '.join(args)})" + (" yields carry" if self.carries else "")


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    role: str                                   # one of ROLES
    operands: tuple[Operand, ...] = ()
    results: tuple[TypeSpec, ...] = ()
    result_rule: str = ""                       # in words; checked by the opcode's rule in verify.py
    attrs: tuple[Attr, ...] = ()
    effects: Effects = NO_EFFECTS
    placement: str = ANYWHERE
    capability: str | None = None               # what a target must declare (Target.capabilities)
    regions: tuple[RegionSpec, ...] = ()
    carry_results: bool = False                 # results: one per `init` operand, of its type
    path: tuple[str, str] | None = None         # a move's (source, destination), of SPACES

    @property
    def variadic(self) -> bool:
        return bool(self.operands) and self.operands[-1].variadic

    @property
    def fixed_operands(self) -> int:
        return len(self.operands) - self.variadic

    def attr(self, name: str) -> Attr | None:
        return next((a for a in self.attrs if a.name == name), None)

    def __str__(self) -> str:
        res = "carry..." if self.carry_results else ", ".join(map(str, self.results)) or "()"
        lines = [f"{self.name}({', '.join(map(str, self.operands))}) -> {res}", f"    {self.summary}"]
        if self.result_rule:
            lines.append(f"    result: {self.result_rule}")
        if self.attrs:
            lines.append(f"    attrs: {', '.join(map(str, self.attrs))}")
        for r in self.regions:
            lines.append(f"    region: {r}")
        lines.append(f"    role: {self.role}" + (f" ({self.path[0]} -> {self.path[1]})" if self.path else ""))
        lines.append(f"    effects: {self.effects}; placement: {self.placement}"
                     + (f"; needs capability '{self.capability}'" if self.capability else ""))
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the table
def _t(*kinds: str, dtypes=None) -> TypeSpec:
    return TypeSpec(tuple(kinds), tuple(dtypes) if dtypes is not None else None)


_I32, _F32, _SCALAR = _t(I32), _t(F32), _t(I32, F32)
_TILE = _t(RT, RV)
_VALUE_TILE = _t(RT, RV, dtypes=VALUE_DTYPES)
_MASK = _t(RT, dtypes=("bool",))
_CARRY = _t(RT, RV, I32, F32)
_INDEX = Operand("index", _I32, variadic=True)     # one i32 per tensor dim: leading dims in elements,
_FILL = Attr("fill", (float,))                      # the tile's dims in tile units
_ELEMENT_INDEX = Operand("index", _I32, variadic=True)   # one i32 per tensor dim, all in elements
_NUM = (int, float)

OPS: tuple[OpSpec, ...] = (
    # ---- scalars
    OpSpec("scalar_const", "an i32 or f32 constant", role=SCALAR, results=(_SCALAR,),
           result_rule="i32 for an int value, f32 for a float value", attrs=(Attr("value", _NUM),)),
    OpSpec("block_idx", "this block's index along a grid axis", role=SCALAR, results=(_I32,),
           attrs=(Attr("axis", (int,), (0, 1, 2)),)),
    OpSpec("num_blocks", "the number of blocks along a grid axis", role=SCALAR, results=(_I32,),
           attrs=(Attr("axis", (int,), (0, 1, 2)),)),
    OpSpec("global_dim", "a runtime dimension of a tensor argument", role=SCALAR,
           operands=(Operand("tensor", _t(GL)),), results=(_I32,), result_rule="index < the tensor's rank",
           attrs=(Attr("index", (int,)),)),
    OpSpec("scalar_binary", "a op b on scalars (i32 wraps; floordiv/mod floor like Python)", role=SCALAR,
           operands=(Operand("a", _SCALAR), Operand("b", _SCALAR)), results=(_SCALAR,),
           result_rule="a, b and the result share one dtype; floordiv/mod on i32, div on f32",
           attrs=(Attr("op", (str,), SCALAR_BINARY),)),
    OpSpec("scalar_cast", "i32 <-> f32 (f32 -> i32 truncates, saturates, NaN -> 0)", role=SCALAR,
           operands=(Operand("x", _SCALAR),), results=(_SCALAR,),
           result_rule="the dtype named by `dtype`, other than x's", attrs=(Attr("dtype", (str,), SCALAR_DTYPES),)),
    # ---- shared memory
    OpSpec("alloc_shared", "a shared-memory buffer of `stages` tiles", role=SHARED_VIEW, results=(_t(SMEM),),
           placement=TOP_LEVEL),
    OpSpec("shared_stage", "the st view of stage s of a shared buffer (s is taken modulo the stages)",
           role=SHARED_VIEW, operands=(Operand("buffer", _t(SMEM)), Operand("stage", _I32)), results=(_t(ST),),
           result_rule="st of the buffer's dtype and shape"),
    # ---- data movement, named source_to_destination
    OpSpec("global_to_register", "load a tile of a tensor into registers, converting to the tile's dtype; "
           "elements outside the tensor read `fill`", role=MOVE, path=("global", "register"),
           operands=(Operand("src", _t(GL)), _INDEX), results=(_TILE,),
           result_rule="one index per tensor dim; tile rank <= tensor rank",
           attrs=(_FILL,), effects=_effects(reads=("global",))),
    OpSpec("global_to_scalar", "read one element of an i32 tensor into an i32 scalar (every thread of the block "
           "reads the same element: cu_seqlens, block tables); an index outside the tensor reads `fill` and "
           "touches no memory", role=MOVE, path=("global", "scalar"),
           operands=(Operand("src", _t(GL, dtypes=("i32",))), _ELEMENT_INDEX), results=(_I32,),
           result_rule="one index per tensor dim, every one in elements",
           attrs=(Attr("fill", (int,)),), effects=_effects(reads=("global",))),
    OpSpec("global_to_shared", "copy a tile of a tensor into shared memory (raw, may be asynchronous); "
           "elements outside the tensor read `fill`", role=MOVE, path=("global", "shared"),
           operands=(Operand("dst", _t(ST)), Operand("src", _t(GL)), _INDEX),
           result_rule="dst and src share a dtype; one index per tensor dim", attrs=(_FILL,),
           effects=_effects(reads=("global",), writes=("shared",))),
    OpSpec("shared_to_register", "load a shared tile into registers (raw)", role=MOVE, path=("shared", "register"),
           operands=(Operand("src", _t(ST)),), results=(_t(RT),), result_rule="rt of the source's dtype and shape",
           effects=_effects(reads=("shared",))),
    OpSpec("register_to_shared", "store a register tile into a shared tile (raw)", role=MOVE,
           path=("register", "shared"), operands=(Operand("dst", _t(ST)), Operand("src", _t(RT))),
           result_rule="dst and src share dtype and shape", effects=_effects(writes=("shared",))),
    OpSpec("register_to_global", "store a register tile or vector into a tensor, converting to its dtype; "
           "elements outside the tensor are dropped", role=MOVE, path=("register", "global"),
           operands=(Operand("dst", _t(GL)), Operand("src", _TILE), _INDEX),
           result_rule="one index per tensor dim; tile rank <= tensor rank",
           effects=_effects(writes=("global",)), placement=NOT_IN_PIPELINE_LOAD),
    OpSpec("shared_to_global", "store a shared tile into a tensor, converting to its dtype; elements outside "
           "the tensor are dropped", role=MOVE, path=("shared", "global"),
           operands=(Operand("dst", _t(GL)), Operand("src", _t(ST)), _INDEX),
           result_rule="one index per tensor dim", effects=_effects(reads=("shared",), writes=("global",)),
           placement=NOT_IN_PIPELINE_LOAD),
    OpSpec("atomic_add", "add a register tile or vector into an f32 tensor, atomically per element; "
           "elements outside the tensor are dropped", role=MOVE, path=("register", "global"),
           operands=(Operand("dst", _t(GL, dtypes=("f32",))), Operand("src", _t(RT, RV, dtypes=("f32",))), _INDEX),
           result_rule="one index per tensor dim; tile rank <= tensor rank",
           effects=_effects(reads=("global",), writes=("global",)), placement=NOT_IN_PIPELINE_LOAD,
           capability="atomics"),
    # ---- tiles from scalars and vectors
    OpSpec("fill", "a constant tile", role=UNIFORM, results=(_TILE,),
           result_rule="a float value for float tiles, an int for i32 and bool tiles", attrs=(Attr("value", _NUM),)),
    OpSpec("splat", "a tile of one runtime scalar (converted to the tile's dtype)", role=UNIFORM,
           operands=(Operand("value", _SCALAR),), results=(_TILE,), result_rule="float tiles take an f32 scalar"),
    OpSpec("broadcast", "an rt from an rv along its rows (dst[r][c] = v[r]) or columns (dst[r][c] = v[c])",
           role=ALONG_AXIS, operands=(Operand("vector", _t(RV)),), results=(_t(RT),),
           result_rule="the vector's dtype; its length is the rows (axis=row) or columns (axis=col)",
           attrs=(Attr("axis", (str,), AXES),)),
    # ---- elementwise
    OpSpec("unary", "an elementwise function (16-bit floats compute in f32 and round once)", role=ELEMENTWISE,
           operands=(Operand("x", _TILE),), results=(_TILE,),
           result_rule="x's type; float ops on float tiles, neg/abs/relu also on i32, not on masks",
           attrs=(Attr("op", (str,), UNARY + UNARY_MASK),)),
    OpSpec("binary", "an elementwise arithmetic (numbers) or logical (masks) operation", role=ELEMENTWISE,
           operands=(Operand("a", _TILE), Operand("b", _TILE)), results=(_TILE,),
           result_rule="a, b and the result share one type; and/or on masks, div on floats",
           attrs=(Attr("op", (str,), BINARY_ARITH + BINARY_LOGIC),)),
    OpSpec("compare", "an elementwise comparison into a mask", role=ELEMENTWISE,
           operands=(Operand("a", _VALUE_TILE), Operand("b", _VALUE_TILE)), results=(_t(RT, RV, dtypes=("bool",)),),
           result_rule="a and b share one type; the result is its bool mask", attrs=(Attr("op", (str,), COMPARE),)),
    OpSpec("where", "elementwise select: a where mask, else b", role=ELEMENTWISE,
           operands=(Operand("mask", _t(RT, RV, dtypes=("bool",))), Operand("a", _TILE), Operand("b", _TILE)),
           results=(_TILE,), result_rule="a, b and the result share one type; the mask has its shape"),
    OpSpec("cast", "elementwise conversion (RNE; fp8 saturating; float -> i32 truncating)", role=ELEMENTWISE,
           operands=(Operand("x", _VALUE_TILE),), results=(_VALUE_TILE,),
           result_rule="x's space and shape, the dtype named by `dtype`, other than x's",
           attrs=(Attr("dtype", (str,), VALUE_DTYPES),)),
    OpSpec("reduce", "max/min/sum over the columns of each row (axis=row) or the rows of each column",
           role=ALONG_AXIS, operands=(Operand("x", _t(RT, dtypes=VALUE_DTYPES)),),
           results=(_t(RV, dtypes=VALUE_DTYPES),),
           result_rule="an rv of x's dtype, one value per row (axis=row) or column",
           attrs=(Attr("op", (str,), REDUCE), Attr("axis", (str,), AXES))),
    OpSpec("mma", "acc + op(a) @ op(b) with f32 accumulation; op(x) = x or its transpose", role=CONTRACTION,
           operands=(Operand("a", _t(RT, ST, dtypes=MMA_DTYPES)), Operand("b", _t(RT, ST, dtypes=MMA_DTYPES)),
                     Operand("acc", _t(RT, dtypes=("f32",)))),
           results=(_t(RT, dtypes=("f32",)),),
           result_rule="acc's type; a and b share a 16-bit dtype or are both fp8 (any two formats); op(a) is MxK, "
                       "op(b) KxN, acc MxN",
           attrs=(Attr("trans_a", (bool,)), Attr("trans_b", (bool,))), effects=_effects(reads=("shared",))),
    # ---- masks
    OpSpec("causal_mask", "dst[r][c] = (row_offset + r) >= (col_offset + c)", role=POSITIONAL,
           operands=(Operand("row_offset", _I32), Operand("col_offset", _I32)), results=(_MASK,)),
    OpSpec("bounds_mask", "dst[r][c] = row_offset + r in [0, n_rows) and col_offset + c in [0, n_cols)",
           role=POSITIONAL, operands=(Operand("row_offset", _I32), Operand("col_offset", _I32),
                                      Operand("n_rows", _I32), Operand("n_cols", _I32)), results=(_MASK,)),
    OpSpec("dropout_mask", "the keep-mask of dropout from Philox4x32-10 (see ops.dropout_mask)", role=POSITIONAL,
           operands=(Operand("p", _F32), Operand("seed_lo", _I32), Operand("seed_hi", _I32),
                     Operand("offset_lo", _I32), Operand("offset_hi", _I32), Operand("row_offset", _I32),
                     Operand("col_offset", _I32), Operand("row_stride", _I32)),
           results=(_MASK,), capability="dropout"),
    # ---- control
    OpSpec("for", "for i in [lo, hi): carry = body(i, *carry)", role=CONTROL,
           operands=(Operand("lo", _I32), Operand("hi", _I32), Operand("init", _CARRY, variadic=True)),
           result_rule="the final carry, of the init types", carry_results=True,
           regions=(RegionSpec("body", (_I32,), carries=True),), effects=Effects(of_regions=True)),
    OpSpec("pipeline", "for i in [0, n): load(i, i % stages); carry = compute(i, i % stages, *carry), in an "
           "order of the backend's choosing that gives the same results", role=CONTROL,
           operands=(Operand("n", _I32), Operand("init", _CARRY, variadic=True)),
           result_rule="the final carry, of the init types; stages >= 1", carry_results=True,
           attrs=(Attr("stages", (int,)),),
           regions=(RegionSpec("load", (_I32, _I32), carries=False), RegionSpec("compute", (_I32, _I32), carries=True)),
           effects=Effects(of_regions=True)),
)

TABLE: dict[str, OpSpec] = {s.name: s for s in OPS}
OPCODES: tuple[str, ...] = tuple(TABLE)
assert len(TABLE) == len(OPS), "an opcode is listed twice"
assert all(s.role in ROLES and (s.path is not None) == (s.role == MOVE) for s in OPS), "a role or a move's path"


def spec(opcode: str) -> OpSpec | None:
    return TABLE.get(opcode)


def capabilities() -> dict[str, str]:
    """{opcode: the capability a target must declare to run it}."""
    return {s.name: s.capability for s in OPS if s.capability}


def writes_shared(opcode: str) -> bool:
    return opcode in TABLE and TABLE[opcode].effects.writes_shared


def writes_global(opcode: str) -> bool:
    return opcode in TABLE and TABLE[opcode].effects.writes_global


# ------------------------------------------------------------------------------------ roles, read off the table
def _pure_scalar(s: OpSpec) -> bool:
    """Makes scalars from scalars (or a tensor's shape) and touches no memory: what any thread may compute."""
    return (bool(s.results) and not s.regions and s.effects == NO_EFFECTS
            and all(set(r.kinds) <= {I32, F32} for r in s.results))


SCALAR_OPS: frozenset[str] = frozenset(s.name for s in OPS if _pure_scalar(s))
"""Pure scalar ops: constants, the block's index and the grid's extent, a tensor's dims, arithmetic and casts."""
GRID_INVARIANT_SCALAR_OPS: frozenset[str] = SCALAR_OPS - {"block_idx"}
"""The pure scalar ops whose value is the same in every block (all but the block's own index)."""


def _role(role: str) -> frozenset[str]:
    return frozenset(s.name for s in OPS if s.role == role)


SHARED_VIEW_OPS = _role(SHARED_VIEW)
"""A shared buffer and a stage's view of one: they name shared memory and move nothing."""
UNIFORM_OPS = _role(UNIFORM)
"""Tiles whose elements are all alike (a constant, a runtime scalar)."""
POSITIONAL_OPS = _role(POSITIONAL)
"""Masks whose element [r][c] follows from its position alone: a backend may compute it wherever it lies."""
ELEMENTWISE_OPS = _role(ELEMENTWISE)
"""Element [r][c] from the operands' [r][c]: operands and result may share any one layout."""
ALONG_AXIS_OPS = _role(ALONG_AXIS)
"""A vector spread along rows or columns of a tile, or a tile reduced along them (the op's `axis`)."""
CONTRACTION_OPS = _role(CONTRACTION)
"""Sums of products over a shared dimension: the matrix instructions."""
CONTROL_OPS = _role(CONTROL)
"""Loops: their effects are their regions', and a carried value meets them at its init, yield and result."""


@functools.cache
def moves(src: str | tuple[str, ...] | None = None, dst: str | tuple[str, ...] | None = None) -> frozenset[str]:
    """The moves from space `src` to space `dst` (of SPACES; a tuple: any of those; None: any)."""
    named = {e for w in (src, dst) if w is not None for e in ((w,) if isinstance(w, str) else w)}
    if named - set(SPACES):
        raise ValueError(f"not a space: {', '.join(sorted(named - set(SPACES)))} (the spaces: {', '.join(SPACES)})")

    def fits(end: str, want) -> bool:
        return want is None or end == want or (isinstance(want, tuple) and end in want)
    return frozenset(s.name for s in OPS if s.path and fits(s.path[0], src) and fits(s.path[1], dst))


def moves_between(a: str, b: str) -> frozenset[str]:
    """The moves between spaces `a` and `b`, either way."""
    return moves(a, b) | moves(b, a)


# ------------------------------------------------------------------------------------ rule coverage
@dataclass(frozen=True)
class Coverage:
    """Which table opcodes a class has `<prefix><opcode>` rules for."""
    who: str
    missing: tuple[str, ...] = field(default=())
    unknown: tuple[str, ...] = field(default=())     # rules named after no opcode of the table

    def __bool__(self) -> bool:
        return not self.missing and not self.unknown

    def __str__(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"no rule for {', '.join(self.missing)}")
        if self.unknown:
            parts.append(f"rules for opcodes the table does not have: {', '.join(self.unknown)}")
        return f"{self.who}: {'; '.join(parts) or 'every opcode has a rule'}"


def coverage(cls, prefix: str = "op_", who: str | None = None) -> Coverage:
    names = {n[len(prefix):] for n in dir(cls) if n.startswith(prefix) and callable(getattr(cls, n, None))}
    return Coverage(who or getattr(cls, "__name__", str(cls)), tuple(o for o in OPCODES if o not in names),
                    tuple(sorted(names - set(OPCODES))))


def rules(cls, prefix: str = "op_", who: str | None = None) -> dict[str, Any]:
    """{opcode: cls.<prefix><opcode>} for every opcode; TypeError naming the gaps if any is missing."""
    cov = coverage(cls, prefix, who)
    if not cov:
        raise TypeError(f"{cov} (hk_portable/interface/opcodes.py is the table)")
    return {o: getattr(cls, prefix + o) for o in OPCODES}


def describe() -> str:
    return "\n\n".join(str(s) for s in OPS) + "\n"


if __name__ == "__main__":
    print(describe(), end="")
