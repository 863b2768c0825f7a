"""Tile type constructors used in kernel bodies: RT[f32, 64, 64], RV[f32, 64], ST[bf16, 64, 64], GL."""
from __future__ import annotations

from .dtypes import DType, as_dtype
from .ir import TileType


def _check_dims(kind: str, dims: tuple, n: int) -> tuple[int, ...]:
    if len(dims) != n or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise TypeError(f"{kind}[dtype, {', '.join('dim' for _ in range(n))}] needs {n} positive int "
                        f"dimension(s), got {dims!r}")
    return tuple(dims)


class _TileTemplate:
    space = ""
    ndim = 2

    def __class_getitem__(cls, item) -> TileType:
        if not isinstance(item, tuple) or len(item) != cls.ndim + 1:
            raise TypeError(f"{cls.__name__} takes [dtype, {'R, C' if cls.ndim == 2 else 'N'}], got {item!r}")
        dtype: DType = as_dtype(item[0])
        return TileType(cls.space, dtype, _check_dims(cls.__name__, item[1:], cls.ndim))


class RT(_TileTemplate):
    """A register tile, distributed over the block's warps/waves by the backend."""
    space = "rt"


class ST(_TileTemplate):
    """A shared-memory (LDS) tile; allocate with hk.shared(ST[...], stages=n)."""
    space = "st"


class RV(_TileTemplate):
    """A register vector aligned with the rows (x[:, None]) or columns (x[None, :]) of an RT."""
    space = "rv"
    ndim = 1


class GL:
    """Annotation for a tensor argument (global memory). GL[rank] also checks the rank at launch."""

    def __init__(self, rank: int | None = None):
        self.rank = rank

    def __class_getitem__(cls, rank: int) -> "GL":
        if not isinstance(rank, int) or not 1 <= rank <= 4:
            raise TypeError(f"GL[rank] takes a rank from 1 to 4, got {rank!r}")
        return cls(rank)

    def __repr__(self) -> str:
        return "GL" if self.rank is None else f"GL[{self.rank}]"


class const:
    """Annotation for a compile-time parameter: a plain Python value during tracing, part of the
    specialisation key, never a runtime argument."""
