"""What a conformance case is, the input and output helpers cases share, and the list of all cases.

A Case makes a Setup from a seeded generator: fresh inputs (never zeros), output buffers poisoned with
NaN (or POISON_INT) so an element the kernel does not write fails, a `launch` that runs the case's
kernel on a backend, and Checks that compare outputs with float64 torch math computed in the case
itself (never through the reference interpreter).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .tolerances import Bound

POISON_INT = -559038737          # 0xDEADBEEF as int32: no case draws integers this large
FP8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i32": torch.int32, **FP8}
FLOAT_DTYPES = ("bf16", "f16", "f32")                      # what arithmetic cases run on
ALL_DTYPES = ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "i32")   # what movement cases run on


@dataclass
class Check:
    """One comparison: `output` (a name in Setup.outputs), restricted to `select` if given."""
    label: str
    output: str
    expected: torch.Tensor        # exact tier: in the output's dtype; bounded: float64
    bound: Bound
    scale: torch.Tensor | None = None   # magnitude the relative bound refers to (default |expected|)
    k: int = 0                          # terms summed per element (reductions, mma K)
    select: torch.Tensor | None = None  # bool mask of the elements this check covers


@dataclass
class Setup:
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]    # initial contents: poison (or initial values for atomic_add)
    launch: Callable[[dict[str, torch.Tensor], object], None]   # (device tensors by name, backend)
    checks: list[Check] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    id: str                             # unique and stable: "op/unary/exp/bf16/37x70"
    kind: str                           # "op" | "kernel"
    name: str                           # the op or kernel checked
    make: Callable[[torch.Generator], Setup]
    deterministic: bool = True          # False only where the interface allows run-to-run differences
    missing: str | None = None          # a skip reason known before running (e.g. module not present)


# ------------------------------------------------------------------------------------------- inputs
def rand_float(gen: torch.Generator, shape, dtype: str, lo: float = 0.1, hi: float = 4.0,
               signed: bool = True) -> torch.Tensor:
    """Magnitudes uniform in [lo, hi] (lo > 0, so never zero), random signs, rounded to dtype."""
    mag = lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)
    if signed:
        mag = torch.where(torch.rand(shape, generator=gen) < 0.5, -mag, mag)
    return round_to(mag, TORCH[dtype])


def rand_int(gen: torch.Generator, shape, lo: int = 1, hi: int = 50_000, signed: bool = True) -> torch.Tensor:
    """int32 values with magnitudes in [lo, hi] (never zero when lo >= 1)."""
    mag = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64)
    if signed:
        mag = torch.where(torch.rand(shape, generator=gen) < 0.5, -mag, mag)
    return mag.to(torch.int32)


def poisoned(shape, dtype) -> torch.Tensor:
    """An output buffer in which no plausible result is already present."""
    dt = TORCH[dtype] if isinstance(dtype, str) else dtype
    if dt.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dt)
    return torch.full(shape, POISON_INT, dtype=dt)


# ------------------------------------------------------------------------------------- float64 math
def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 -> dtype, rounding once to nearest even (fp8 saturating, as the interface specifies).

    Goes through f32 first: for values that are exact results of +, -, *, / on inputs of the target
    dtype this is innocuous (f32 has >= 2p+2 bits for bf16/f16), and f32 -> fp8 is correctly rounded."""
    if dtype == torch.float64:
        return x
    if not dtype.is_floating_point:
        return wrap_i32(x.to(torch.int64))
    if dtype in FP8_MAX:
        m = FP8_MAX[dtype]
        return x.clamp(-m, m).to(torch.float32).to(dtype)
    return x.to(torch.float32).to(dtype)


def wrap_i32(x: torch.Tensor) -> torch.Tensor:
    """int64 -> int32 with two's complement wrap-around (what int32 hardware arithmetic does)."""
    return (((x + 2**31) % 2**32) - 2**31).to(torch.int32)


def f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def padded(x: torch.Tensor, shape, value) -> torch.Tensor:
    """x in the top-left corner of a `shape` tensor filled with `value` (what a load with fill reads)."""
    out = torch.full(shape, value, dtype=torch.float64).to(x.dtype)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


def guard_mask(buffer_shape, view_shape) -> torch.Tensor:
    """True outside the top-left `view_shape` corner of a buffer: elements a kernel must not touch."""
    m = torch.ones(buffer_shape, dtype=torch.bool)
    m[tuple(slice(0, n) for n in view_shape)] = False
    return m


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------ all cases
def all_cases() -> list[Case]:
    """Every op case and kernel case, in a stable order with unique ids."""
    from . import kernel_cases, op_cases
    cases = op_cases.cases() + kernel_cases.cases()
    ids = [c.id for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise AssertionError(f"duplicate conformance case ids: {sorted(dup)}")
    return cases
