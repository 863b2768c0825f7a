"""The cuda device library's scalar numerics, compiled for the host (g++), against torch bit for bit:
bf16/f16/fp8 conversions (exhaustive over 16-bit inputs), float -> int32, Philox4x32-10 and the dropout
threshold, bits and keep test with the dropout_stream's reuse of a call across a group (interface/numerics.py),
Python floor division. The device build uses the same code for
everything but f16 and float->int32, which are single PTX instructions (cvt.rn.f16.f32, cvt.rzi)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hk_portable.interface.numerics import MASK32, dropout_bits, dropout_keep, dropout_threshold, philox4x32_10

HEADER = Path(__file__).parents[2] / "hk_portable" / "backends" / "cuda" / "include" / "hk_cuda.cuh"
CXX = shutil.which("g++") or shutil.which("clang++")

SHIM = r"""
#include "%s"
#define EXPORT extern "C"
EXPORT void f32_to_bf16(const float* x, unsigned short* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::bf16_bits_from_float(x[i]); }
EXPORT void f32_to_f16(const float* x, unsigned short* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::f16_bits_from_float(x[i]); }
EXPORT void f32_to_e4m3(const float* x, unsigned char* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::e4m3_bits_sat(x[i]); }
EXPORT void f32_to_e5m2(const float* x, unsigned char* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::e5m2_bits_sat(x[i]); }
EXPORT void f16_to_f32(const unsigned short* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::float_from_f16_bits(x[i]); }
EXPORT void bf16_to_f32(const unsigned short* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::float_from_bf16_bits(x[i]); }
EXPORT void e4m3_to_f32(const unsigned char* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::float_from_e4m3_bits(x[i]); }
EXPORT void e5m2_to_f32(const unsigned char* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::float_from_e5m2_bits(x[i]); }
EXPORT void f32_to_i32(const float* x, int* y, long n) { for (long i = 0; i < n; ++i) y[i] = hk::f32_to_i32(x[i]); }
EXPORT void philox(const unsigned* c0, const unsigned* c1, unsigned k0, unsigned k1, unsigned* y, long n) {
  for (long i = 0; i < n; ++i) { const hk::philox4 x = hk::philox4x32_10(c0[i], c1[i], k0, k1);
    y[4 * i] = x.w0; y[4 * i + 1] = x.w1; y[4 * i + 2] = x.w2; y[4 * i + 3] = x.w3; } }
EXPORT void bits(const unsigned long long* g, unsigned s0, unsigned s1, unsigned* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = hk::dropout_bits(g[i], s0, s1); }
EXPORT void stream_keep(const unsigned long long* g, unsigned s0, unsigned s1, float p, unsigned char* y, long n) {
  hk::dropout_stream rng(s0, s1, hk::dropout_threshold(p)); for (long i = 0; i < n; ++i) y[i] = rng.keep(g[i]); }
EXPORT double threshold(float p) { return hk::dropout_threshold(p); }
EXPORT void keep(const unsigned long long* g, unsigned s0, unsigned s1, float p, unsigned char* y, long n) {
  double t = hk::dropout_threshold(p); for (long i = 0; i < n; ++i) y[i] = hk::dropout_keep(g[i], s0, s1, t); }
EXPORT void floordiv(const int* a, const int* b, int* q, int* r, long n) {
  for (long i = 0; i < n; ++i) { q[i] = hk::floordiv(a[i], b[i]); r[i] = hk::floormod(a[i], b[i]); } }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if CXX is None:
        pytest.skip("no host C++ compiler (g++/clang++) to build the device library's scalar code")
    d = tmp_path_factory.mktemp("hk_numerics")
    src, so = d / "shim.cpp", d / "shim.so"
    src.write_text(SHIM % HEADER)
    # the same numerics flags as the device build: no contraction, no fast math
    subprocess.run([CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared",
                    str(src), "-o", str(so)], check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def _ptr(t: torch.Tensor):
    return ctypes.c_void_p(t.data_ptr())


def _call(lib, fn, x: torch.Tensor, out_dtype) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=out_dtype)
    getattr(lib, fn)(_ptr(x), _ptr(y), ctypes.c_long(x.numel()))
    return y


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _interesting_floats() -> torch.Tensor:
    """Every f32 whose top 16 bits are any pattern, with low bits that hit ties and their neighbours,
    plus random floats: all of bf16/f16/fp8 rounding, subnormals, overflow, inf and NaN."""
    hi = torch.arange(0, 1 << 16, dtype=torch.int64) << 16
    lows = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1000, 0x0FFF, 0x2000, 0x1FFF, 0x4000, 0x3FFF,
                         0x6000, 0xC000, 0xE000, 0xA000], dtype=torch.int64)
    u = (hi[:, None] | lows[None, :]).reshape(-1)
    rnd = torch.randint(0, 1 << 32, (1 << 20,), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    u = torch.cat([u, rnd])
    return ((u + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32)


def _same_floats(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal bits, or both NaN (NaN payloads are not part of the contract)."""
    return (_bits(a) == _bits(b)) | (torch.isnan(a.float()) & torch.isnan(b.float()))


@pytest.mark.parametrize("fn,dtype", [("f32_to_bf16", torch.bfloat16), ("f32_to_f16", torch.float16)])
def test_f32_to_16bit_rne(lib, fn, dtype):
    x = _interesting_floats()
    got = _call(lib, fn, x, torch.int16).view(dtype)
    want = x.to(dtype)
    ok = _same_floats(got, want)
    assert bool(ok.all()), f"{int((~ok).sum())} mismatches, first input {x[~ok][0].item()!r}"


@pytest.mark.parametrize("fn,dtype,fmax", [("f32_to_e4m3", torch.float8_e4m3fn, 448.0),
                                           ("f32_to_e5m2", torch.float8_e5m2, 57344.0)])
def test_f32_to_fp8_saturating(lib, fn, dtype, fmax):
    x = _interesting_floats()
    got = _call(lib, fn, x, torch.uint8).view(dtype)
    want = x.clamp(-fmax, fmax).to(dtype)          # the interface's cast: clamp (NaN stays) then RNE
    ok = _same_floats(got, want)
    assert bool(ok.all()), f"{int((~ok).sum())} mismatches, first input {x[~ok][0].item()!r}"


@pytest.mark.parametrize("fn,dtype,bits", [("f16_to_f32", torch.float16, 16), ("bf16_to_f32", torch.bfloat16, 16),
                                           ("e4m3_to_f32", torch.float8_e4m3fn, 8),
                                           ("e5m2_to_f32", torch.float8_e5m2, 8)])
def test_narrow_to_f32_exhaustive(lib, fn, dtype, bits):
    raw = torch.arange(0, 1 << bits, dtype=torch.int64)
    raw = ((raw + 2**(bits - 1)) % 2**bits - 2**(bits - 1)).to(torch.int16 if bits == 16 else torch.int8)
    x = raw.view(torch.uint8) if bits == 8 else raw
    got = _call(lib, fn, x.contiguous(), torch.float32)
    want = raw.view(dtype).float()
    assert bool(_same_floats(got, want).all())


def test_f32_to_i32_truncates_and_saturates(lib):
    x = torch.cat([_interesting_floats()[::7], torch.tensor([2.0**31, -2.0**31, 2.0**31 - 128, -2.0**31 - 256,
                                                             float("inf"), float("-inf"), float("nan"), -0.5, 0.99])])
    got = _call(lib, "f32_to_i32", x, torch.int32)
    want = torch.trunc(x.double().nan_to_num(nan=0.0).clamp(-2**31, 2**31 - 1)).to(torch.int32)
    assert torch.equal(got, want)


def test_philox_words_match_numerics(lib):
    g = torch.Generator().manual_seed(1)
    c0 = torch.randint(0, 1 << 32, (4096,), generator=g, dtype=torch.int64)
    c1 = torch.randint(0, 1 << 32, (4096,), generator=g, dtype=torch.int64)
    for k0, k1 in ((0, 0), (1234, 0), (0xDEADBEEF, 0x12345678), (MASK32, MASK32)):
        y = torch.empty(4096, 4, dtype=torch.int32)
        c0_32, c1_32 = c0.to(torch.int32), c1.to(torch.int32)     # kept alive across the call
        lib.philox(_ptr(c0_32), _ptr(c1_32), ctypes.c_uint(k0), ctypes.c_uint(k1), _ptr(y), ctypes.c_long(4096))
        z = torch.zeros_like(c0)
        want = torch.stack(philox4x32_10(c0, c1, z, z, z + k0, z + k1), dim=1)
        assert torch.equal(y.to(torch.int64) & MASK32, want)


def _indices() -> torch.Tensor:
    """Random 64-bit element indices (negative int64 = g >= 2^63) and runs across group and 32-bit edges."""
    runs = [torch.arange(11) + e for e in (0, 2**32 - 6, 2**34 - 5, 2**63 - 7, -11)]   # 2**63 - 7 wraps
    rand = torch.randint(-2**63, 2**63 - 1, (8192,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    return torch.cat(runs + [rand])


def test_dropout_bits_match_numerics(lib):
    g = _indices()
    for seed in (0, 2**40 + 17, 2**64 - 1):
        y = torch.empty(g.numel(), dtype=torch.int32)
        lib.bits(_ptr(g), ctypes.c_uint(seed & MASK32), ctypes.c_uint(seed >> 32), _ptr(y), ctypes.c_long(g.numel()))
        assert torch.equal(y.to(torch.int64) & MASK32, dropout_bits(seed, g))


def test_dropout_stream_reuses_a_call_without_changing_a_bit(lib):
    """In any visiting order (runs, repeats, jumps back into a group left) the stream keeps what dropout_keep
    keeps."""
    base = _indices()
    order = torch.randperm(base.numel(), generator=torch.Generator().manual_seed(4))
    g = torch.cat([base, base[order], base.repeat_interleave(2), base.flip(0)])
    y = torch.empty(g.numel(), dtype=torch.uint8)
    lib.stream_keep(_ptr(g), ctypes.c_uint(0x1234), ctypes.c_uint(0x5678), ctypes.c_float(0.5), _ptr(y),
                    ctypes.c_long(g.numel()))
    assert torch.equal(y.bool(), dropout_keep(0.5, 0x5678_00001234, g))


def test_dropout_threshold_and_keep(lib):
    lib.threshold.restype = ctypes.c_double
    lib.threshold.argtypes = [ctypes.c_float]
    for p in (0.0, 1e-9, 0.1, 0.5, 1 / 3, 0.999999, 1.0, 2.5, -0.5, float("nan")):
        assert lib.threshold(p) == float(dropout_threshold(p)), p
    g = torch.randint(0, 2**62, (8192,), generator=torch.Generator().manual_seed(2), dtype=torch.int64)
    for seed, p in ((0, 0.1), (2**40 + 17, 0.5), (2**64 - 1, 0.9)):
        y = torch.empty(8192, dtype=torch.uint8)
        lib.keep(_ptr(g), ctypes.c_uint(seed & MASK32), ctypes.c_uint(seed >> 32), ctypes.c_float(p), _ptr(y),
                 ctypes.c_long(8192))
        assert torch.equal(y.bool(), dropout_keep(p, seed, g))


def test_floordiv_floormod_python_semantics(lib):
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-2**31, 2**31, (4096,), generator=gen, dtype=torch.int64)
    b = torch.randint(-300, 300, (4096,), generator=gen, dtype=torch.int64)
    b = torch.where(b == 0, torch.ones_like(b), b)
    a[:10] = torch.tensor([-2**31, -2**31, 7, -7, -2**31, 2**31 - 1, -1, 5, 2**31 - 1, -2**31])
    b[:10] = torch.tensor([-1, 1, -2, 2, -2**31, -2**31, 2**31 - 1, -1, -1, 2**31 - 1])   # the 32-bit edges
    q, r = torch.empty(4096, dtype=torch.int32), torch.empty(4096, dtype=torch.int32)
    a32, b32 = a.to(torch.int32), b.to(torch.int32)
    lib.floordiv(_ptr(a32), _ptr(b32), _ptr(q), _ptr(r), ctypes.c_long(4096))
    wrap = lambda x: ((x + 2**31) % 2**32) - 2**31  # noqa: E731
    assert torch.equal(q.to(torch.int64), wrap(torch.div(a, b, rounding_mode="floor")))
    assert torch.equal(r.to(torch.int64), torch.remainder(a, b))
