"""Element types of the tile interface and their torch equivalents."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    name: str          # the IR spelling: bf16, f16, f32, fp8e4m3, fp8e5m2, i32, bool
    bits: int
    is_float: bool

    def __repr__(self) -> str:
        return self.name

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self.name]

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)


bf16 = DType("bf16", 16, True)
f16 = DType("f16", 16, True)
f32 = DType("f32", 32, True)
fp8e4m3 = DType("fp8e4m3", 8, True)   # OCP e4m3 (torch.float8_e4m3fn)
fp8e5m2 = DType("fp8e5m2", 8, True)   # OCP e5m2 (torch.float8_e5m2)
i32 = DType("i32", 32, False)
bool_ = DType("bool", 1, False)       # masks only; never stored to global memory

ALL = (bf16, f16, f32, fp8e4m3, fp8e5m2, i32, bool_)
FLOATS = (bf16, f16, f32, fp8e4m3, fp8e5m2)
MMA_INPUTS = (bf16, f16)
MMA_FP8_INPUTS = (fp8e4m3, fp8e5m2)   # either format with either (mixed e4m3 x e5m2 too)

_TO_TORCH = {
    "bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
    "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2,
    "i32": torch.int32, "bool": torch.bool,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}
_BY_NAME = {d.name: d for d in ALL}


def from_torch(dtype: torch.dtype) -> DType:
    try:
        return _BY_NAME[_FROM_TORCH[dtype]]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no hk_portable equivalent; "
                        f"expected one of {[str(d.torch) for d in ALL if d is not bool_]}") from None


def by_name(name: str) -> DType:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(f"unknown dtype {name!r}; expected one of {sorted(_BY_NAME)}") from None


def as_dtype(x) -> DType:
    if isinstance(x, DType):
        return x
    if isinstance(x, torch.dtype):
        return from_torch(x)
    if isinstance(x, str):
        return by_name(x)
    raise TypeError(f"expected an hk dtype, a torch dtype or a dtype name, got {x!r}")
