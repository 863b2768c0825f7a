"""Bit-exact definitions shared by the spec (reference backend) and the tests: Philox4x32-10,
the dropout bits and threshold (stated in docs/numerics.md) and the conversions. GPU backends implement the
same formulas in C++ (codegen/include/hk_core/)."""
from __future__ import annotations

import math

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF

FP8_MAX = {"fp8e4m3": 448.0, "fp8e5m2": 57344.0}


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on int64 tensors holding uint32 values (vectorised). Returns four uint32 tensors."""
    def mulhilo(m, x):
        # 32x32 -> 64 bit product in two 16-bit halves of x, so no int64 intermediate overflows
        lo_part = m * (x & 0xFFFF)
        hi_part = m * (x >> 16)
        full_lo = (lo_part & MASK32) + ((hi_part & 0xFFFF) << 16)
        lo = full_lo & MASK32
        hi = ((lo_part >> 32) + (hi_part >> 16) + (full_lo >> 32)) & MASK32
        return hi, lo

    for r in range(10):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = mulhilo(PHILOX_M0, c0)
        hi1, lo1 = mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """keep iff (the element's Philox word >> 8) >= threshold; p is first rounded to f32, as a kernel
    argument is."""
    p32 = float(torch.tensor(p, dtype=torch.float32))
    return math.floor(p32 * 2**24) if p32 > 0 else 0 if not math.isnan(p32) else 0


def dropout_bits(seed: int, index: torch.Tensor) -> torch.Tensor:
    """The 32 random bits of the elements with 64-bit indices `index` (int64 tensor, values taken mod
    2**64): word (g mod 4) of Philox4x32-10 at counter (lo32(g div 4), hi32(g div 4), 0, 0) and key
    (lo32(seed), hi32(seed)). One call serves the four elements 4q..4q+3, as curand_uniform4 draws."""
    q_lo = (index >> 2) & MASK32              # g div 4 of the unsigned g: the arithmetic shift's sign
    q_hi = (index >> 34) & 0x3FFFFFFF         # bits are masked off
    z = torch.zeros_like(index)
    words = philox4x32_10(q_lo, q_hi, z, z, z + (seed & MASK32), z + ((seed >> 32) & MASK32))
    return torch.stack(words).gather(0, (index & 3).unsqueeze(0)).squeeze(0)


def dropout_keep(p: float, seed: int, index: torch.Tensor) -> torch.Tensor:
    """The keep mask for 64-bit element indices `index` (int64 tensor, values taken mod 2**64)."""
    return (dropout_bits(seed, index) >> 8) >= dropout_threshold(p)


def cast_tensor(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The interface's conversion: RNE for floats, fp8 saturating to its finite max (NaN stays NaN),
    float -> int32 truncating toward zero, saturating, NaN -> 0."""
    if x.dtype == dtype:
        return x
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        m = FP8_MAX["fp8e4m3" if dtype == torch.float8_e4m3fn else "fp8e5m2"]
        return x.float().clamp(-m, m).to(dtype)      # clamp keeps NaN
    if dtype == torch.int32 and x.is_floating_point():
        xf = x.double().nan_to_num(nan=0.0).clamp(-2**31, 2**31 - 1)
        return torch.trunc(xf).to(torch.int32)
    return x.to(dtype)


# ------------------------------------------------------------------------------- min/max and NaN
# Two rules, bit for bit, implemented once for the devices in hk_core/scalar.h:
#
# * elementwise maximum/minimum (hk.maximum, hk.minimum: torch.fmax / torch.fmin on CPU) ignore a quiet
#   NaN: with one NaN operand the result is the other operand, unchanged. Two NaNs give b with its quiet
#   bit set (payload and sign of b). A signaling NaN operand gives itself quieted, whatever the other is,
#   unless the other is a NaN too (then b, quieted). Equal operands (-0 and +0) give a.
#   Reductions (row_max, ...) also ignore NaN; a row of NaNs reduces to a NaN of unspecified payload.
# * scalar min/max (hk.min, hk.max: torch.minimum / torch.maximum) propagate NaN as the canonical NaN
#   0x7FC00000 (torch's scalar path; its vectorised path returns 0xFFFFFFFF, so the reference's own bits
#   for NaN scalars depend on the grid size: no conformance case compares them). Equal operands give a.
#
# NaN payloads through a narrowing cast (f32 -> bf16/f16/fp8) are not specified.
CANONICAL_NAN_F32 = 0x7FC00000
_QUIET_BIT = 0x00400000


def _bits32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous().view(torch.int32)


def _nan_ignoring(a: torch.Tensor, b: torch.Tensor, a_wins: torch.Tensor) -> torch.Tensor:
    ab, bb = _bits32(a), _bits32(b)
    an, bn = torch.isnan(a), torch.isnan(b)
    a_sig, b_sig = an & ((ab & _QUIET_BIT) == 0), bn & ((bb & _QUIET_BIT) == 0)
    qa, qb = ab | _QUIET_BIT, bb | _QUIET_BIT
    r = torch.where(a_wins, ab, bb)
    r = torch.where(an & ~bn, torch.where(a_sig, qa, bb), r)
    r = torch.where(bn, torch.where(an | b_sig, qb, ab), r)
    return r.view(torch.float32)


def nan_ignoring_max(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """hk.maximum on f32 tensors, bit for bit (torch.fmax on CPU)."""
    return _nan_ignoring(a, b, ~(a < b))


def nan_ignoring_min(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """hk.minimum on f32 tensors, bit for bit (torch.fmin on CPU)."""
    return _nan_ignoring(a, b, ~(b < a))
