"""The Tile IR: a small typed SSA form with structured regions.

A Program is a list of kernel parameters and one Region of Ops. Ops produce typed Values; loops and
pipelines own nested Regions whose arguments are the induction variable (and stage) plus the carried
values, and which end by yielding the new carry. Memory effects exist only on shared buffers (ST) and
global tensors (GL); register tiles (RT, RV) and scalars are pure SSA values.

The text form (`str(program)`) is the canonical form: the hash is taken over it, backends may print it
in errors, and `hk compile --emit ir` shows it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .dtypes import DType
from .names import c_symbol, is_identifier


# ---------------------------------------------------------------------------------------------- types
@dataclass(frozen=True)
class ScalarType:
    dtype: DType                      # i32 or f32

    def __str__(self) -> str:
        return str(self.dtype)


@dataclass(frozen=True)
class TileType:
    """A register tile (rt, 2-D), a register vector (rv, 1-D) or a shared tile view (st, 2-D)."""
    space: str                        # "rt" | "rv" | "st"
    dtype: DType
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.space}<{self.dtype},{','.join(map(str, self.shape))}>"

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def with_(self, **kw) -> "TileType":
        d = dict(space=self.space, dtype=self.dtype, shape=self.shape)
        d.update(kw)
        return TileType(**d)


@dataclass(frozen=True)
class SharedBufType:
    """A shared-memory allocation of `stages` tiles; `buf[s]` is the st view of stage s."""
    dtype: DType
    shape: tuple[int, int]
    stages: int

    def __str__(self) -> str:
        return f"smem<{self.dtype},{self.shape[0]},{self.shape[1]}>x{self.stages}"

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * self.shape[0] * self.shape[1] * self.stages


@dataclass(frozen=True)
class GlobalType:
    """A tensor argument: dtype and rank are specialised; shape and strides are runtime values."""
    dtype: DType
    rank: int

    def __str__(self) -> str:
        return f"gl<{self.dtype},{self.rank}>"


Type = ScalarType | TileType | SharedBufType | GlobalType


# ------------------------------------------------------------------------------------- values and ops
class Value:
    __slots__ = ("id", "type", "region", "name")

    def __init__(self, id: int, type: Type, region: "Region", name: str | None = None):
        self.id, self.type, self.region, self.name = id, type, region, name

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclass(eq=False)
class Op:
    opcode: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: tuple["Region", ...] = ()

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r


@dataclass(eq=False)
class Region:
    name: str
    args: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    yields: list[Value] = field(default_factory=list)
    parent: "Region | None" = None

    def encloses(self, other: "Region") -> bool:
        """True if `other` is this region or nested inside it."""
        r: Region | None = other
        while r is not None:
            if r is self:
                return True
            r = r.parent
        return False

    def walk(self):
        """Every op in this region and its nested regions, in program order."""
        for op in self.ops:
            yield op
            for reg in op.regions:
                yield from reg.walk()


@dataclass(frozen=True)
class Param:
    name: str
    type: Type


@dataclass(eq=False)
class Program:
    name: str
    params: list[Param]
    body: Region
    consts: dict[str, Any]
    num_warps: int = 4                # a hint: backends may choose their own per target
    _text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = print_program(self)
        return self._text

    @property
    def symbol(self) -> str:
        """The kernel's name as generated code spells it (a safe C identifier; see names.c_symbol)."""
        return c_symbol(self.name)

    @property
    def hash(self) -> str:
        return hashlib.sha256(str(self).encode()).hexdigest()

    def shared_buffers(self) -> list[Op]:
        return [op for op in self.body.walk() if op.opcode == "alloc_shared"]

    def opcodes(self) -> set[str]:
        return {op.opcode for op in self.body.walk()}


# ---------------------------------------------------------------------------------------- printing
def _fmt_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)            # round-trips exactly; also prints inf/nan distinctly
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ")"
    return str(v)


def op_text(op: Op) -> str:
    """One op as its line of the Program text (without its regions)."""
    lhs = ", ".join(map(repr, op.results))
    attrs = ""
    if op.attrs:
        attrs = " {" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(op.attrs.items())) + "}"
    types = ""
    if op.results:
        types = " : " + ", ".join(str(r.type) for r in op.results)
    return f"{lhs + ' = ' if lhs else ''}{op.opcode} {', '.join(map(repr, op.operands))}{attrs}{types}".rstrip()


def _print_region(region: Region, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for op in region.ops:
        out.append(pad + op_text(op))
        for reg in op.regions:
            args = ", ".join(f"{a!r}: {a.type}" for a in reg.args)
            out.append(f"{pad}  ^{reg.name}({args}):")
            _print_region(reg, indent + 2, out)
            if reg.yields:
                out.append(f"{pad}    yield {', '.join(map(repr, reg.yields))}")


def print_program(p: Program) -> str:
    params = ", ".join(f"{a!r} {prm.name}: {prm.type}" for prm, a in zip(p.params, p.body.args))
    consts = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in sorted(p.consts.items()))
    name = p.name if is_identifier(p.name) else json.dumps(p.name)    # one line, distinct names distinct
    out = [f"kernel @{name}({params}) consts{{{consts}}} warps={p.num_warps} {{"]
    _print_region(p.body, 1, out)
    out.append("}")
    return "\n".join(out) + "\n"
